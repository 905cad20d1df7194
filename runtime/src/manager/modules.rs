//! Module loading and hot reload: read a controller's module from its ConfigMap or file,
//! validate it in the sandbox, and swap it in when its digest changes.

use crate::api::{Reason, WasmControllerSpec};
use crate::controller::ObjectKey;
use crate::host::module;

use super::{ControllerId, Manager, Problem};

impl Manager {
    /// Reads, validates and (when the digest changed) swaps the module. A module that fails
    /// leaves the last good one running.
    pub(super) async fn load_module(&mut self, id: &ControllerId) {
        let Some(m) = self.controllers.get(id) else {
            return;
        };
        let spec = m.spec.clone();
        let loaded = self.read_module(id, &spec).await.and_then(|bytes| {
            self.sandbox
                .load(&bytes)
                .map_err(|e| Problem::new(Reason::ModuleInvalid, e.to_string()))
        });
        let Some(m) = self.controllers.get_mut(id) else {
            return;
        };
        match loaded {
            Ok(guest) => {
                self.metrics.module_loaded(&id.to_string(), "success");
                m.module_problem = None;
                let changed = m.guest.as_ref().map(|g| g.digest()) != Some(guest.digest());
                if changed {
                    tracing::info!(controller = %id, digest = %guest.digest(), size = guest.size(), "module loaded");
                    if let Some((runner, _)) = &m.runner {
                        runner.swap_guest(guest.clone());
                    }
                    m.guest = Some(guest);
                }
            }
            Err(problem) => {
                self.metrics
                    .module_loaded(&id.to_string(), problem.reason.as_str());
                let keeping = m
                    .guest
                    .as_ref()
                    .map(|g| format!("; still running the last good module {}", g.digest()));
                tracing::warn!(controller = %id, reason = %problem.reason, "module not loaded: {}{}", problem.message, keeping.clone().unwrap_or_default());
                m.module_problem = Some(problem);
            }
        }
        let keep: Vec<_> = self
            .controllers
            .values()
            .filter_map(|m| m.guest.as_ref().map(|g| g.digest()))
            .collect();
        self.sandbox.retain(&keep);
    }

    async fn read_module(
        &self,
        id: &ControllerId,
        spec: &WasmControllerSpec,
    ) -> Result<Vec<u8>, Problem> {
        let (raw, from_file) = match (&spec.module.config_map, &spec.module.path) {
            (Some(_), Some(_)) => {
                return Err(Problem::new(
                    Reason::InvalidSpec,
                    "spec.module names both configMap and path; name exactly one",
                ));
            }
            (Some(cm), None) => {
                let namespace = id
                    .namespace
                    .clone()
                    .or_else(|| cm.namespace.clone())
                    .ok_or_else(|| {
                        Problem::new(
                            Reason::InvalidSpec,
                            "a ClusterWasmController must give spec.module.configMap.namespace",
                        )
                    })?;
                let key = ObjectKey {
                    namespace: Some(namespace.clone()),
                    name: cm.name.clone(),
                };
                let watch = self
                    .config_maps
                    .as_ref()
                    .ok_or_else(|| Problem::new(Reason::ModuleNotFound, "no ConfigMap cache"))?;
                let found = watch.get(&key).ok_or_else(|| {
                    Problem::new(Reason::ModuleNotFound,
                        format!("ConfigMap {namespace}/{} does not exist; create it with `kubectl -n {namespace} create configmap {} --from-file={}=<guest>.wasm`", cm.name, cm.name, cm.key),
                    )
                })?;
                let config_map: k8s_openapi::api::core::v1::ConfigMap =
                    (*found).clone().try_parse().map_err(|e| {
                        Problem::new(
                            Reason::ModuleNotFound,
                            format!("ConfigMap {namespace}/{}: {e}", cm.name),
                        )
                    })?;
                let raw = module::bytes_from_configmap(&config_map, &cm.key)
                    .map_err(|e| Problem::new(Reason::ModuleNotFound, e.to_string()))?;
                (raw, false)
            }
            (None, Some(_)) if id.namespace.is_some() => {
                return Err(Problem::new(
                    Reason::InvalidSpec,
                    crate::api::NO_MODULE_FILES,
                ));
            }
            (None, Some(path)) => {
                let Some(dir) = self.config.module_dir.clone() else {
                    return Err(Problem::new(
                        Reason::ModuleNotFound,
                        module::ModuleError::NoModuleDir { path: path.clone() }.to_string(),
                    ));
                };
                // Off the manager loop: a file read can block.
                let path = path.clone();
                let raw =
                    tokio::task::spawn_blocking(move || module::read_module_file(&dir, &path))
                        .await
                        .map_err(|e| Problem::new(Reason::ModuleNotFound, e.to_string()))?
                        .map_err(|e| Problem::new(Reason::ModuleNotFound, e.to_string()))?;
                (raw, true)
            }
            (None, None) => {
                return Err(Problem::new(
                    Reason::InvalidSpec,
                    "spec.module names neither configMap nor path",
                ));
            }
        };
        // Gunzip (bounded) off the manager loop too; a file's digest is never shown.
        let pin = spec.module.sha256.clone();
        tokio::task::spawn_blocking(move || module::unpack(raw, pin.as_deref(), !from_file))
            .await
            .map_err(|e| Problem::new(Reason::ModuleInvalid, e.to_string()))?
            .map_err(|e| {
                let reason = if matches!(e, module::ModuleError::DigestMismatch { .. }) {
                    Reason::DigestMismatch
                } else {
                    Reason::ModuleInvalid
                };
                Problem::new(reason, e.to_string())
            })
    }

    pub(super) async fn on_config_map(&mut self, key: &ObjectKey) {
        let ids: Vec<ControllerId> = self
            .controllers
            .iter()
            .filter(|(id, m)| {
                m.spec.module.config_map.as_ref().is_some_and(|cm| {
                    cm.name == key.name
                        && id.namespace.as_ref().or(cm.namespace.as_ref()) == key.namespace.as_ref()
                })
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.reload(&id).await;
        }
    }

    async fn reload(&mut self, id: &ControllerId) {
        let running = self.controllers.get(id).is_some_and(|m| m.runner.is_some());
        if running {
            self.load_module(id).await;
        } else {
            self.start(id).await;
        }
    }

    pub(super) async fn reload_all(&mut self, which: impl Fn(&WasmControllerSpec) -> bool) {
        let ids: Vec<ControllerId> = self
            .controllers
            .iter()
            .filter(|(_, m)| which(&m.spec))
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.reload(&id).await;
        }
    }
}
