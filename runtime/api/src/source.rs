//! A spec's module source and ServiceAccount, parsed once: the CRD keeps its union shape
//! (`spec.module.configMap` / `spec.module.path` / `spec.module.image`), and everything after
//! this reads a [`Source`].

use super::{ModuleSource, NO_MODULE_FILES, WasmControllerSpec};

/// Where a controller's module comes from, resolved for the controller that names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A key of a ConfigMap: a WasmController's own namespace, or the one a
    /// ClusterWasmController names.
    ConfigMap {
        /// The ConfigMap's namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The key holding the component.
        key: String,
    },
    /// A file under the operator's `--module-dir` (ClusterWasmControllers only), or, for
    /// `kubewasm reconcile`, the user's own file.
    File {
        /// As the spec gives it.
        path: String,
    },
    /// An OCI artifact in a registry.
    Oci {
        /// The image, parsed.
        image: ImageRef,
        /// The name of the `kubernetes.io/dockerconfigjson` Secret with the registry's
        /// credentials, in the namespace of the controller's ServiceAccount (read as it).
        pull_secret: Option<String>,
    },
}

impl Source {
    /// Whether the runtime looks at the source again every `--module-poll-seconds` (a file,
    /// an image by tag); a ConfigMap is watched instead, and an image by digest never changes.
    pub fn is_polled(&self) -> bool {
        match self {
            Source::ConfigMap { .. } => false,
            Source::File { .. } => true,
            Source::Oci { image, .. } => image.digest().is_none(),
        }
    }
}

/// The most bytes `spec.module.image` may have (the CRD says the same).
pub const MAX_IMAGE_REFERENCE_BYTES: usize = 512;

/// An image reference the runtime will pull: a registry named explicitly (no implicit
/// `docker.io`: a tenant's typo must not send its credentials there), a repository, and a tag,
/// a `sha256` digest or both. Parsed with the registry client's own grammar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef(oci_spec::distribution::Reference);

impl ImageRef {
    /// Parses `text`; the error says what is wrong, for a status.
    pub fn parse(text: &str) -> Result<ImageRef, String> {
        let bad = |why: &str| Err(format!("spec.module.image `{text}`: {why}"));
        if text.len() > MAX_IMAGE_REFERENCE_BYTES {
            return Err(format!(
                "spec.module.image is longer than {MAX_IMAGE_REFERENCE_BYTES} bytes"
            ));
        }
        if text.is_empty() || text.chars().any(|c| !c.is_ascii_graphic()) {
            return bad("must be printable ASCII without spaces");
        }
        let Some((host, rest)) = text.split_once('/') else {
            return bad("name the registry, e.g. `registry.example.com/team/controller:v1`");
        };
        if !(host.contains('.') || host.contains(':') || host == "localhost") {
            return bad(
                "name the registry (a host with a dot or a port, or `localhost`) before the repository, e.g. `registry.example.com/team/controller:v1`",
            );
        }
        let last = rest.rsplit('/').next().unwrap_or(rest);
        if !last.contains(':') && !last.contains('@') {
            return bad(
                "name a tag (`:v1`) or a digest (`@sha256:…`): there is no implicit `latest`",
            );
        }
        let reference = oci_spec::distribution::Reference::try_from(text)
            .map_err(|e| format!("spec.module.image `{text}` is not an image reference: {e}"))?;
        if let Some(digest) = reference.digest() {
            let hex = digest.strip_prefix("sha256:").unwrap_or_default();
            if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return bad("the digest must be `sha256:` and 64 lowercase hex digits");
            }
        }
        Ok(ImageRef(reference))
    }

    /// The registry client's form of it.
    pub fn reference(&self) -> &oci_spec::distribution::Reference {
        &self.0
    }

    /// The registry, `host[:port]`.
    pub fn registry(&self) -> &str {
        self.0.registry()
    }

    /// The digest it pins, `sha256:<hex>`, if any.
    pub fn digest(&self) -> Option<&str> {
        self.0.digest()
    }

    /// The same repository at `digest` (what a tag resolved to).
    pub fn at(&self, digest: &str) -> String {
        format!("{}/{}@{digest}", self.0.registry(), self.0.repository())
    }
}

impl std::fmt::Display for ImageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0.whole())
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::ConfigMap {
                namespace,
                name,
                key,
            } => write!(f, "ConfigMap {namespace}/{name} key {key}"),
            Source::File { path } => write!(f, "file {path}"),
            Source::Oci { image, .. } => write!(f, "image {image}"),
        }
    }
}

impl ModuleSource {
    /// The source, for a controller of `namespace` (`None`: a ClusterWasmController).
    /// Exactly one of `configMap`, `path` and `image` must be given; only a cluster controller
    /// may name a file or another namespace's ConfigMap; `imagePullSecret` only with `image`.
    /// The error says what to change.
    pub fn source(&self, namespace: Option<&str>) -> Result<Source, String> {
        let fields = source_fields();
        let set = serde_json::to_value(self).unwrap_or_default();
        let given: Vec<&str> = fields
            .iter()
            .map(String::as_str)
            .filter(|field| set.get(field).is_some())
            .collect();
        match given.as_slice() {
            [] => {
                return Err(format!(
                    "spec.module names none of {}; name exactly one",
                    fields.join(", ")
                ));
            }
            [_] => {}
            [a, b] => {
                return Err(format!(
                    "spec.module names both {a} and {b}; name exactly one"
                ));
            }
            all => {
                return Err(format!(
                    "spec.module names {}; name exactly one",
                    all.join(", ")
                ));
            }
        }
        if self.image_pull_secret.is_some() && self.image.is_none() {
            return Err(
                "spec.module.imagePullSecret is only for spec.module.image; remove it".into(),
            );
        }
        if let Some(image) = &self.image {
            if let Some(secret) = &self.image_pull_secret {
                kubewasm_guest_sdk::query::validate_dns_subdomain(secret)
                    .map_err(|e| format!("spec.module.imagePullSecret: {e}"))?;
            }
            return Ok(Source::Oci {
                image: ImageRef::parse(image)?,
                pull_secret: self.image_pull_secret.clone(),
            });
        }
        if let Some(path) = &self.path {
            if namespace.is_some() {
                return Err(NO_MODULE_FILES.into());
            }
            return Ok(Source::File { path: path.clone() });
        }
        let Some(cm) = &self.config_map else {
            return Err(format!(
                "spec.module.{} is not read by this runtime; name one of configMap, path and image",
                given.join("")
            ));
        };
        let namespace = match (namespace, &cm.namespace) {
            // A WasmController reads from its own namespace, whatever it writes.
            (Some(own), _) => own.to_owned(),
            (None, Some(named)) => named.clone(),
            (None, None) => {
                return Err(
                    "a ClusterWasmController must give spec.module.configMap.namespace".into(),
                );
            }
        };
        Ok(Source::ConfigMap {
            namespace,
            name: cm.name.clone(),
            key: cm.key.clone(),
        })
    }
}

/// The fields of `spec.module` that change how a source is read rather than name one.
const MODULE_MODIFIERS: [&str; 2] = ["imagePullSecret", "sha256"];

/// The fields of `spec.module` only a ClusterWasmController may give.
pub const CLUSTER_ONLY_SOURCES: [&str; 1] = ["path"];

/// The fields of `spec.module` that each name a source, of which a spec gives exactly one:
/// every field of [`ModuleSource`]'s schema but the modifiers. The parse ([`ModuleSource::source`])
/// and the CRD's `oneOf` ([`crate::crds_yaml`]) both read them here, so a new source field
/// is in both. Made from the schema once per process (a parse runs per declared controller).
pub fn source_fields() -> &'static [String] {
    static FIELDS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        let schema = schemars::schema_for!(ModuleSource);
        let properties = schema.get("properties").and_then(|p| p.as_object());
        properties
            .into_iter()
            .flat_map(|p| p.keys())
            .filter(|field| !MODULE_MODIFIERS.contains(&field.as_str()))
            .cloned()
            .collect()
    });
    &FIELDS
}

impl WasmControllerSpec {
    /// The namespace and name of the ServiceAccount a controller of `namespace` (`None`: a
    /// ClusterWasmController) acts as. A WasmController: its own namespace. A
    /// ClusterWasmController: `spec.serviceAccountNamespace`; without it, the namespace of
    /// its module's ConfigMap, and with a module from anywhere else it must name one (it never
    /// falls back to a namespace the admin did not write). The name defaults to `default`.
    pub fn service_account(&self, namespace: Option<&str>) -> Result<(String, String), String> {
        let name = self
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into());
        let account_namespace = match (namespace, &self.service_account_namespace) {
            (Some(own), None) => own.to_owned(),
            (Some(own), Some(named)) if named == own => own.to_owned(),
            (Some(_), Some(_)) => {
                return Err(
                    "spec.serviceAccountNamespace: a WasmController acts as a ServiceAccount of its own namespace; remove the field"
                        .into(),
                );
            }
            (None, Some(named)) => named.clone(),
            (None, None) => match self.module.source(None)? {
                Source::ConfigMap { namespace, .. } => namespace,
                other => {
                    return Err(format!(
                        "a ClusterWasmController whose module is a {} must name the namespace of its ServiceAccount in spec.serviceAccountNamespace",
                        match other {
                            Source::File { .. } => "file",
                            Source::ConfigMap { .. } => "ConfigMap",
                            Source::Oci { .. } => "image",
                        }
                    ));
                }
            },
        };
        Ok((account_namespace, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ConfigMapKey;

    fn module(cm: Option<(&str, Option<&str>)>, path: Option<&str>) -> ModuleSource {
        ModuleSource {
            config_map: cm.map(|(name, namespace)| ConfigMapKey {
                name: name.into(),
                key: "g.wasm".into(),
                namespace: namespace.map(Into::into),
            }),
            path: path.map(Into::into),
            image: None,
            image_pull_secret: None,
            sha256: None,
        }
    }

    fn image(image: &str, secret: Option<&str>) -> ModuleSource {
        ModuleSource {
            image: Some(image.into()),
            image_pull_secret: secret.map(Into::into),
            ..module(None, None)
        }
    }

    #[test]
    fn image_references_name_a_registry_and_a_tag_or_digest() {
        let digest = format!("sha256:{}", "ab".repeat(32));
        let ok = |text: &str| ImageRef::parse(text).unwrap();
        let by_tag = ok("registry.example.com/team/hello:v1");
        assert_eq!(by_tag.registry(), "registry.example.com");
        assert_eq!(by_tag.digest(), None);
        assert_eq!(by_tag.to_string(), "registry.example.com/team/hello:v1");
        let local = ok("127.0.0.1:5000/hello:v1");
        assert_eq!(local.registry(), "127.0.0.1:5000");
        assert_eq!(ok("localhost/hello:v1").registry(), "localhost");
        let pinned = ok(&format!("127.0.0.1:5000/hello@{digest}"));
        assert_eq!(pinned.digest(), Some(digest.as_str()));
        assert_eq!(pinned.at(&digest), format!("127.0.0.1:5000/hello@{digest}"));
        let both = ok(&format!("127.0.0.1:5000/hello:v1@{digest}"));
        assert_eq!(both.digest(), Some(digest.as_str()));
        for (text, why) in [
            ("hello:v1", "name the registry"),
            ("team/hello:v1", "name the registry"),
            ("docker.io/library/hello", "no implicit `latest`"),
            ("127.0.0.1:5000/hello", "no implicit `latest`"),
            ("127.0.0.1:5000/hello:v1 x", "printable ASCII"),
            ("127.0.0.1:5000/hello:v1\n", "printable ASCII"),
            ("", "printable ASCII"),
            ("127.0.0.1:5000/Hello:v1", "is not an image reference"),
            (
                "127.0.0.1:5000/hello@sha256:abc",
                "is not an image reference",
            ),
            (
                "127.0.0.1:5000/hello@sha512:abc",
                "is not an image reference",
            ),
        ] {
            let err = ImageRef::parse(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
        let long = format!("127.0.0.1:5000/{}:v1", "a".repeat(600));
        assert!(
            ImageRef::parse(&long)
                .unwrap_err()
                .contains("longer than 512")
        );
    }

    #[test]
    fn an_image_is_one_source_of_three_and_polled_only_by_tag() {
        let tag = image("127.0.0.1:5000/hello:v1", Some("regcred"))
            .source(Some("team"))
            .unwrap();
        assert!(tag.is_polled());
        assert!(matches!(&tag, Source::Oci { pull_secret: Some(s), .. } if s == "regcred"));
        let digest = format!("127.0.0.1:5000/hello@sha256:{}", "0".repeat(64));
        assert!(!image(&digest, None).source(None).unwrap().is_polled());
        let both = ModuleSource {
            config_map: module(Some(("m", None)), None).config_map,
            ..image("127.0.0.1:5000/hello:v1", None)
        };
        let err = both.source(Some("team")).unwrap_err();
        assert!(err.contains("configMap and image"), "{err}");
        let secret_alone = ModuleSource {
            image_pull_secret: Some("regcred".into()),
            ..module(Some(("m", None)), None)
        };
        let err = secret_alone.source(Some("team")).unwrap_err();
        assert!(err.contains("only for spec.module.image"), "{err}");
        let err = image("127.0.0.1:5000/hello:v1", Some("Bad_Name"))
            .source(Some("team"))
            .unwrap_err();
        assert!(err.starts_with("spec.module.imagePullSecret"), "{err}");
    }

    #[test]
    fn exactly_one_source_and_files_and_other_namespaces_for_cluster_controllers_only() {
        let cm = |namespace: &str, name: &str| Source::ConfigMap {
            namespace: namespace.into(),
            name: name.into(),
            key: "g.wasm".into(),
        };
        assert_eq!(
            module(Some(("m", Some("elsewhere"))), None).source(Some("team")),
            Ok(cm("team", "m"))
        );
        assert_eq!(
            module(Some(("m", Some("mods"))), None).source(None),
            Ok(cm("mods", "m"))
        );
        assert!(module(Some(("m", None)), None).source(None).is_err());
        assert_eq!(
            module(None, Some("a.wasm")).source(None),
            Ok(Source::File {
                path: "a.wasm".into()
            })
        );
        assert_eq!(
            module(None, Some("a.wasm")).source(Some("team")),
            Err(NO_MODULE_FILES.into())
        );
        assert!(
            module(Some(("m", None)), Some("a.wasm"))
                .source(None)
                .unwrap_err()
                .contains("both")
        );
        assert!(
            module(None, None)
                .source(None)
                .unwrap_err()
                .contains("none of")
        );
    }

    #[test]
    fn a_cluster_controller_never_acts_in_a_namespace_nobody_wrote() {
        let spec = |module: ModuleSource, sa_ns: Option<&str>| WasmControllerSpec {
            module,
            parent: crate::ParentResource {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                label_selector: None,
            },
            children: Vec::new(),
            grants: Vec::new(),
            service_account_name: Some("sa".into()),
            service_account_namespace: sa_ns.map(Into::into),
            limits: Default::default(),
            resync_period_seconds: None,
            finalize: false,
            candidate: None,
            rollout: None,
        };
        let pair = |ns: &str| Ok((ns.to_owned(), "sa".to_owned()));
        let in_cm = module(Some(("m", Some("mods"))), None);
        let file = module(None, Some("a.wasm"));
        assert_eq!(
            spec(in_cm.clone(), None).service_account(Some("team")),
            pair("team")
        );
        assert!(
            spec(in_cm.clone(), Some("other"))
                .service_account(Some("team"))
                .is_err()
        );
        assert_eq!(
            spec(in_cm.clone(), None).service_account(None),
            pair("mods")
        );
        assert_eq!(spec(in_cm, Some("ops")).service_account(None), pair("ops"));
        assert_eq!(
            spec(file.clone(), Some("ops")).service_account(None),
            pair("ops")
        );
        let err = spec(file, None).service_account(None).unwrap_err();
        assert!(err.contains("spec.serviceAccountNamespace"), "{err}");
    }
}
