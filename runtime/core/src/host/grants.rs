//! What a controller may read and do, derived from its declaration. Deny by default.

use crate::api::{Verb, WasmControllerSpec};

/// A refused read or action, with what would allow it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} may not {} {} ({}){}: {}", .0.controller, .0.verb, .0.kind, .0.api_version, .0.where_, .0.why)]
pub struct Denied(Box<DeniedInner>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct DeniedInner {
    controller: String,
    verb: &'static str,
    kind: String,
    api_version: String,
    where_: String,
    why: String,
}

#[derive(Debug, Clone)]
struct Rule {
    api_version: String,
    kind: String,
    verbs: Vec<Verb>,
}

/// The kinds and verbs one controller was granted, and the namespace it is confined to.
#[derive(Debug, Clone)]
pub struct Permissions {
    controller: String,
    /// `Some(ns)`: a WasmController, confined to its namespace. `None`: cluster-wide.
    namespace: Option<String>,
    /// `None`: everything allowed (offline runs without a declaration).
    rules: Option<Vec<Rule>>,
}

const ALL: [Verb; 4] = [Verb::Get, Verb::List, Verb::Apply, Verb::Delete];

impl Permissions {
    /// Permissions of a declared controller: its parent (get, list, apply of itself),
    /// its children (everything), and its explicit grants.
    pub fn from_spec(controller: &str, namespace: Option<&str>, spec: &WasmControllerSpec) -> Self {
        let mut rules = vec![Rule {
            api_version: spec.parent.api_version.clone(),
            kind: spec.parent.kind.clone(),
            verbs: vec![Verb::Get, Verb::List, Verb::Apply],
        }];
        rules.extend(spec.children.iter().map(|c| Rule {
            api_version: c.api_version.clone(),
            kind: c.kind.clone(),
            verbs: ALL.to_vec(),
        }));
        rules.extend(spec.grants.iter().map(|g| Rule {
            api_version: g.api_version.clone(),
            kind: g.kind.clone(),
            verbs: g.verbs.clone(),
        }));
        Permissions {
            controller: controller.to_owned(),
            namespace: namespace.map(str::to_owned),
            rules: Some(rules),
        }
    }

    /// Everything allowed: for offline runs of a module without a declaration.
    pub fn allow_all(controller: &str) -> Self {
        Permissions {
            controller: controller.to_owned(),
            namespace: None,
            rules: None,
        }
    }

    /// The namespace a namespaced controller is confined to.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// Checks one operation. `namespace` is where it happens (`None`: cluster-scoped).
    pub fn check(
        &self,
        verb: Verb,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> Result<(), Denied> {
        let deny = |why: String| {
            Denied(Box::new(DeniedInner {
                controller: self.controller.clone(),
                verb: verb_name(verb),
                kind: kind.to_owned(),
                api_version: api_version.to_owned(),
                where_: namespace
                    .map(|ns| format!(" in namespace {ns}"))
                    .unwrap_or_default(),
                why,
            }))
        };
        if let Some(own) = &self.namespace
            && namespace != Some(own.as_str())
        {
            return Err(deny(format!(
                "a WasmController acts only in its own namespace `{own}`; use a ClusterWasmController for more"
            )));
        }
        let Some(rules) = &self.rules else {
            return Ok(());
        };
        let allowed = rules
            .iter()
            .any(|r| r.api_version == api_version && r.kind == kind && r.verbs.contains(&verb));
        if allowed {
            Ok(())
        } else {
            Err(deny(format!(
                "not declared; add {{apiVersion: {api_version}, kind: {kind}, verbs: [{}]}} to spec.grants",
                verb_name(verb)
            )))
        }
    }
}

fn verb_name(verb: Verb) -> &'static str {
    match verb {
        Verb::Get => "get",
        Verb::List => "list",
        Verb::Apply => "apply",
        Verb::Delete => "delete",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> WasmControllerSpec {
        serde_yaml::from_str(
            "module: {path: /m.wasm}\nparent: {apiVersion: v1, kind: ConfigMap}\n\
             grants: [{apiVersion: v1, kind: Pod, verbs: [list, delete]}]",
        )
        .unwrap()
    }

    #[test]
    fn grants_allow_only_what_was_declared_in_the_own_namespace() {
        let p = Permissions::from_spec("ns/c", Some("ns"), &spec());
        assert!(p.check(Verb::List, "v1", "Pod", Some("ns")).is_ok());
        assert!(p.check(Verb::Delete, "v1", "Pod", Some("ns")).is_ok());
        assert!(p.check(Verb::Get, "v1", "ConfigMap", Some("ns")).is_ok());
        let err = p
            .check(Verb::Apply, "v1", "Pod", Some("ns"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("may not apply Pod (v1) in namespace ns: not declared"),
            "{err}"
        );
        assert!(err.contains("spec.grants"), "{err}");
        let err = p
            .check(Verb::List, "v1", "Secret", Some("ns"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("may not list Secret"), "{err}");
        let err = p
            .check(Verb::List, "v1", "Pod", Some("other"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("only in its own namespace `ns`"), "{err}");
        assert!(p.check(Verb::List, "v1", "Pod", None).is_err());
    }

    #[test]
    fn allow_all_allows_everything() {
        let p = Permissions::allow_all("offline");
        assert!(p.check(Verb::Delete, "v1", "Secret", None).is_ok());
    }
}
