//! Promoting and aborting a candidate (`spec.candidate`) as a person would edit the spec:
//! one merge patch each, the same whether `kubewasm rollout` or the runtime (`spec.rollout.
//! promoteAfter`) sends it, so that GitOps tools see the change they would see from a person.

use serde_json::{Map, Value, json};

use crate::{ModuleSource, RolloutStatus, WasmControllerSpec};

/// The digest (`sha256:<hex>`) of the candidate that `status` says was compared.
pub fn compared_digest(status: &RolloutStatus) -> Option<&str> {
    let shown = status.candidate.as_deref()?;
    let digest = shown.split_whitespace().next()?;
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(digest)
}

/// The merge patch of `spec` (at `resource_version`) that makes its candidate the module,
/// pinned to the digest compared (`sha256:<hex>`): what goes live is exactly what was
/// compared (a tag or a ConfigMap changed since is refused by the pin, and the last good
/// module keeps running). The candidate is removed; `spec.rollout` stays for the next one.
pub fn promotion(
    spec: &WasmControllerSpec,
    compared: &str,
    resource_version: Option<&str>,
) -> Result<Value, String> {
    let Some(candidate) = &spec.candidate else {
        return Err("the spec names no candidate (spec.candidate): nothing to promote".into());
    };
    let Some(hex) = compared.strip_prefix("sha256:") else {
        return Err(format!("{compared:?} is not a sha256 digest"));
    };
    let mut module = candidate.clone();
    module.sha256 = Some(hex.to_owned());
    Ok(patch(
        json!({ "module": every_field(&module), "candidate": null }),
        resource_version,
    ))
}

/// The merge patch that removes the candidate (at `resource_version`).
pub fn abort(resource_version: Option<&str>) -> Value {
    patch(json!({ "candidate": null }), resource_version)
}

/// `spec`'s change, made only on the version read when one is given (a spec changed since
/// is not overwritten: the API server answers a conflict).
fn patch(spec: Value, resource_version: Option<&str>) -> Value {
    let mut patch = json!({ "spec": spec });
    if let Some(rv) = resource_version {
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    patch
}

/// `module` with every field of [`ModuleSource`] present, `null` where unset: a merge patch
/// replaces the module's source rather than adding to it (a ConfigMap module promoted to an
/// image must lose its `configMap`).
fn every_field(module: &ModuleSource) -> Value {
    let all = ModuleSource {
        config_map: Some(crate::ConfigMapKey {
            name: String::new(),
            key: String::new(),
            namespace: None,
        }),
        path: Some(String::new()),
        image: Some(String::new()),
        image_pull_secret: Some(String::new()),
        sha256: Some(String::new()),
    };
    let mut fields: Map<String, Value> = match serde_json::to_value(all) {
        Ok(Value::Object(all)) => all.into_iter().map(|(k, _)| (k, Value::Null)).collect(),
        _ => Map::new(),
    };
    if let Ok(Value::Object(set)) = serde_json::to_value(module) {
        fields.extend(set);
    }
    Value::Object(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> WasmControllerSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn promotion_replaces_the_module_with_the_candidate_pinned_to_what_was_compared() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let status = RolloutStatus {
            candidate: Some(format!("{digest} (image registry.example/hello@sha256:cd)")),
            ..Default::default()
        };
        assert_eq!(compared_digest(&status), Some(digest.as_str()));
        let s = spec(
            "module: {configMap: {name: hello, key: m.wasm}}\nparent: {apiVersion: v1, kind: ConfigMap}\ncandidate: {image: registry.example/hello:v2}",
        );
        let patch = promotion(&s, &digest, Some("42")).unwrap();
        assert_eq!(
            patch,
            json!({
                "metadata": {"resourceVersion": "42"},
                "spec": {
                    "candidate": null,
                    "module": {
                        "configMap": null, "path": null, "imagePullSecret": null,
                        "image": "registry.example/hello:v2", "sha256": "ab".repeat(32),
                    },
                },
            })
        );
        // Applied as the API server would (RFC 7386), the spec parses and names the image only.
        let mut doc = json!({ "spec": serde_json::to_value(&s).unwrap() });
        merge(&mut doc, &patch);
        let promoted: WasmControllerSpec = serde_json::from_value(doc["spec"].clone()).unwrap();
        assert!(promoted.candidate.is_none());
        assert_eq!(
            promoted.module.image.as_deref(),
            Some("registry.example/hello:v2")
        );
        assert!(promoted.module.config_map.is_none());
        assert!(promoted.module.source(Some("team")).is_ok());
        // Nothing to promote; an abort removes the candidate only.
        let none =
            spec("module: {image: r.example/a:1}\nparent: {apiVersion: v1, kind: ConfigMap}");
        assert!(
            promotion(&none, &digest, None)
                .unwrap_err()
                .contains("no candidate")
        );
        assert_eq!(abort(None), json!({"spec": {"candidate": null}}));
        // A status naming no digest names nothing to pin.
        let odd = RolloutStatus {
            candidate: Some("sha256:zz".into()),
            ..Default::default()
        };
        assert_eq!(compared_digest(&odd), None);
    }

    /// JSON merge patch (RFC 7386).
    fn merge(target: &mut Value, patch: &Value) {
        let Value::Object(patch) = patch else {
            *target = patch.clone();
            return;
        };
        if !target.is_object() {
            *target = json!({});
        }
        let Value::Object(target) = target else {
            return;
        };
        for (k, v) in patch {
            if v.is_null() {
                target.remove(k);
            } else {
                merge(target.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}
