//! A spec's module source and ServiceAccount, parsed once: the CRD keeps its union shape
//! (`spec.module.configMap` / `spec.module.path`), and everything after this reads a
//! [`Source`].

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
}

impl Source {
    /// Whether the runtime looks at the source again every `--module-poll-seconds` (a file);
    /// a ConfigMap is watched instead.
    pub fn is_polled(&self) -> bool {
        match self {
            Source::ConfigMap { .. } => false,
            Source::File { .. } => true,
        }
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
        }
    }
}

impl ModuleSource {
    /// The source, for a controller of `namespace` (`None`: a ClusterWasmController).
    /// Exactly one of `configMap` and `path` must be given; only a cluster controller may
    /// name a file or another namespace's ConfigMap. The error says what to change.
    pub fn source(&self, namespace: Option<&str>) -> Result<Source, String> {
        match (&self.config_map, &self.path) {
            (Some(_), Some(_)) => {
                Err("spec.module names both configMap and path; name exactly one".into())
            }
            (None, None) => Err("spec.module names neither configMap nor path".into()),
            (None, Some(_)) if namespace.is_some() => Err(NO_MODULE_FILES.into()),
            (None, Some(path)) => Ok(Source::File { path: path.clone() }),
            (Some(cm), None) => {
                let namespace = match (namespace, &cm.namespace) {
                    // A WasmController reads from its own namespace, whatever it writes.
                    (Some(own), _) => own.to_owned(),
                    (None, Some(named)) => named.clone(),
                    (None, None) => {
                        return Err(
                            "a ClusterWasmController must give spec.module.configMap.namespace"
                                .into(),
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
    }
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
    use crate::api::ConfigMapKey;

    fn module(cm: Option<(&str, Option<&str>)>, path: Option<&str>) -> ModuleSource {
        ModuleSource {
            config_map: cm.map(|(name, namespace)| ConfigMapKey {
                name: name.into(),
                key: "g.wasm".into(),
                namespace: namespace.map(Into::into),
            }),
            path: path.map(Into::into),
            sha256: None,
        }
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
                .contains("neither")
        );
    }

    #[test]
    fn a_cluster_controller_never_acts_in_a_namespace_nobody_wrote() {
        let spec = |module: ModuleSource, sa_ns: Option<&str>| WasmControllerSpec {
            module,
            parent: crate::api::ParentResource {
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
