//! The CNCF wasm OCI artifact layout: its media types, and its config (which names the
//! component's world), read by pulls ([`super::oci`]) and written by `kubewasm push`.

use serde::{Deserialize, Serialize};

use super::oci::PullError;

/// The manifest media type of the layout.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The config media type of the layout.
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of the layout.
pub const LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The world every kubewasm controller targets (`component.target` in the config, with or
/// without `@version`; the sandbox checks the exact version when it loads the component).
pub const CONTROLLER_WORLD: &str = "kubewasm:controller/controller";

/// The config of the CNCF wasm OCI artifact (`application/vnd.wasm.config.v0+json`), as the
/// `oci-wasm` crate and `wkg` write it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WasmConfig {
    /// When it was made (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// Who made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// Always `wasm`.
    pub architecture: String,
    /// `wasip2` for a component.
    pub os: String,
    /// The digests of the manifest's layers, in order.
    #[serde(default)]
    pub layer_digests: Vec<String>,
    /// What the component imports and exports, and the world it targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<ComponentInfo>,
}

/// The `component` part of a [`WasmConfig`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentInfo {
    /// Exported names.
    #[serde(default)]
    pub exports: Vec<String>,
    /// Imported names.
    #[serde(default)]
    pub imports: Vec<String>,
    /// The world, e.g. `kubewasm:controller/controller@0.3.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

impl WasmConfig {
    /// The world the config says its component targets, when it is a kubewasm controller's;
    /// otherwise why not.
    pub fn controller_world(&self) -> Result<&str, PullError> {
        let target = self.component.as_ref().and_then(|c| c.target.as_deref());
        match target {
            Some(t) if t == CONTROLLER_WORLD || t.starts_with(&format!("{CONTROLLER_WORLD}@")) => {
                Ok(t)
            }
            other => Err(PullError::WrongWorld {
                world: other.map(|t| kubewasm_sandbox::guest_text(t, 200).into_owned()),
            }),
        }
    }
}

impl ComponentInfo {
    /// What a component's top level imports and exports, and the world it targets when it is
    /// a kubewasm controller's (it imports `kubewasm:controller/host@V` and exports
    /// `reconcile`: [`CONTROLLER_WORLD`]`@V`); `None` for any other world (a component binary
    /// does not name its world). An error for bytes that are no component.
    pub fn of(bytes: &[u8]) -> Result<ComponentInfo, String> {
        use wasmparser::{Parser, Payload};
        if !Parser::is_component(bytes) {
            return Err("not a WebAssembly component (a core module or no wasm at all)".into());
        }
        let (mut imports, mut exports) = (Vec::new(), Vec::new());
        // Nested modules and components are parsed inline: only depth 0 is the component's.
        let mut depth = 0usize;
        for payload in Parser::new(0).parse_all(bytes) {
            match payload.map_err(|e| format!("not a valid component: {e}"))? {
                Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
                Payload::End(_) => depth = depth.saturating_sub(1),
                Payload::ComponentImportSection(section) if depth == 0 => {
                    for import in section {
                        let import = import.map_err(|e| format!("not a valid component: {e}"))?;
                        imports.push(import.name.name.to_owned());
                    }
                }
                Payload::ComponentExportSection(section) if depth == 0 => {
                    for export in section {
                        let export = export.map_err(|e| format!("not a valid component: {e}"))?;
                        exports.push(export.name.name.to_owned());
                    }
                }
                _ => {}
            }
        }
        let host = format!(
            "{}/host@",
            CONTROLLER_WORLD.split('/').next().unwrap_or_default()
        );
        let version = imports.iter().find_map(|i| i.strip_prefix(&host));
        let target = match version {
            Some(v) if exports.iter().any(|e| e == "reconcile") => {
                Some(format!("{CONTROLLER_WORLD}@{v}"))
            }
            _ => None,
        };
        Ok(ComponentInfo {
            exports,
            imports,
            target,
        })
    }
}

impl WasmConfig {
    /// The config of a component with `info`, made now, whose one layer has `layer_digest`.
    pub fn for_component(info: ComponentInfo, layer_digest: String) -> WasmConfig {
        WasmConfig {
            created: Some(k8s_openapi::jiff::Timestamp::now().to_string()),
            author: None,
            architecture: "wasm".into(),
            os: "wasip2".into(),
            layer_digests: vec![layer_digest],
            component: Some(info),
        }
    }
}
