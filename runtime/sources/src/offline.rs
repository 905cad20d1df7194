//! `kubewasm reconcile`'s origin: the user's own files, and ConfigMaps from `--state`.

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

use super::{
    DEFAULT_MAX_MODULE_BYTES, Found, ModuleBytes, ModuleError, ModuleReads, Origin, ReadBudget,
    Version,
};
use kubewasm_api::ImageRef;

/// Module sources read on the user's machine.
pub struct OfflineOrigin<'s> {
    state: &'s [Value],
    reads: ModuleReads,
}

impl<'s> OfflineOrigin<'s> {
    /// ConfigMaps from `state` (the objects given with `--state`).
    pub fn new(state: &'s [Value]) -> Self {
        OfflineOrigin {
            state,
            reads: ModuleReads::new(ReadBudget::unbounded()),
        }
    }
}

impl Origin for OfflineOrigin<'_> {
    async fn config_map(
        &self,
        _namespace: &str,
        name: &str,
        key: &str,
        _known: Option<&Version>,
    ) -> Result<Found<ConfigMap>, ModuleError> {
        // Offline objects often carry no namespace: found by name.
        let found = self.state.iter().find(|o| {
            o.get("kind").and_then(Value::as_str) == Some("ConfigMap")
                && o.pointer("/metadata/name").and_then(Value::as_str) == Some(name)
        });
        let Some(found) = found else {
            return Err(ModuleError::Unreachable(format!(
                "the controller's module is in ConfigMap `{name}`; pass that ConfigMap with --state \
                 (e.g. `kubectl create configmap {name} --from-file={key}=guest.wasm --dry-run=client -o yaml`) or use --module"
            )));
        };
        let config_map: ConfigMap = serde_json::from_value(found.clone()).map_err(|e| {
            ModuleError::Unreachable(format!(
                "ConfigMap `{name}` in --state is not a valid ConfigMap: {e}"
            ))
        })?;
        let version = Version::of(&config_map.metadata);
        Ok(Found::At(config_map, version))
    }

    fn config_map_seen(
        &self,
        _namespace: &str,
        _name: &str,
        _key: &str,
    ) -> Result<Option<Version>, ModuleError> {
        Ok(None)
    }

    fn reads(&self) -> &ModuleReads {
        &self.reads
    }

    async fn file(&self, path: &str) -> Result<Vec<u8>, ModuleError> {
        std::fs::read(path).map_err(|source| ModuleError::File {
            path: path.to_owned(),
            source,
        })
    }

    fn shows_file_digests(&self) -> bool {
        true
    }

    async fn image(
        &self,
        image: &ImageRef,
        _pull_secret: Option<&str>,
        _known: Option<&Version>,
    ) -> Result<Found<ModuleBytes>, ModuleError> {
        // Offline means offline: no registry is asked.
        Err(ModuleError::Unreachable(format!(
            "the controller's module is image {image}; pass the built module with --module"
        )))
    }

    fn max_module_bytes(&self) -> u64 {
        DEFAULT_MAX_MODULE_BYTES
    }
}
