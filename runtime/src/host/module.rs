//! Module bytes from where a WasmController says they are: a ConfigMap key or a file,
//! gzip accepted, optionally pinned by sha256.

use std::io::Read;

use serde_json::Value;

use crate::sandbox::Digest;

/// Why a module's bytes could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// The ConfigMap has no such key.
    #[error(
        "ConfigMap `{name}` has no key `{key}` in binaryData or data (keys: {keys}); create it with `kubectl create configmap {name} --from-file={key}=<guest>.wasm`"
    )]
    MissingKey {
        /// ConfigMap name.
        name: String,
        /// Key looked for.
        key: String,
        /// Keys that exist.
        keys: String,
    },
    /// `binaryData` is not base64.
    #[error("ConfigMap `{name}` key `{key}`: binaryData is not valid base64: {source}")]
    Base64 {
        /// ConfigMap name.
        name: String,
        /// Key.
        key: String,
        /// Decoder error.
        #[source]
        source: base64::DecodeError,
    },
    /// The gzip stream is broken.
    #[error("module looks gzipped but does not decompress: {0}")]
    Gzip(#[source] std::io::Error),
    /// The bytes differ from the pinned digest.
    #[error(
        "module digest is {actual} but spec.module.sha256 pins sha256:{pinned}; update the pin or the module"
    )]
    DigestMismatch {
        /// Digest found.
        actual: Digest,
        /// Digest expected.
        pinned: String,
    },
    /// A file could not be read.
    #[error("cannot read module file `{path}`: {source}")]
    File {
        /// The path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The raw bytes stored under `key` in a ConfigMap object (JSON as served by the API).
pub fn bytes_from_configmap(config_map: &Value, key: &str) -> Result<Vec<u8>, ModuleError> {
    use base64::Engine as _;
    let name = config_map
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_owned();
    if let Some(b64) = config_map
        .pointer("/binaryData")
        .and_then(|d| d.get(key))
        .and_then(Value::as_str)
    {
        return base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|source| ModuleError::Base64 {
                name,
                key: key.to_owned(),
                source,
            });
    }
    if let Some(text) = config_map
        .pointer("/data")
        .and_then(|d| d.get(key))
        .and_then(Value::as_str)
    {
        return Ok(text.as_bytes().to_vec());
    }
    let keys: Vec<&str> = ["/binaryData", "/data"]
        .iter()
        .filter_map(|p| config_map.pointer(p).and_then(Value::as_object))
        .flat_map(|m| m.keys().map(String::as_str))
        .collect();
    let keys = if keys.is_empty() {
        "none".to_owned()
    } else {
        keys.join(", ")
    };
    Err(ModuleError::MissingKey {
        name,
        key: key.to_owned(),
        keys,
    })
}

/// Reads a module file.
pub fn bytes_from_file(path: &str) -> Result<Vec<u8>, ModuleError> {
    std::fs::read(path).map_err(|source| ModuleError::File {
        path: path.to_owned(),
        source,
    })
}

/// Gunzips when the bytes are gzip, then checks the optional sha256 pin.
pub fn unpack(bytes: Vec<u8>, pinned_sha256: Option<&str>) -> Result<Vec<u8>, ModuleError> {
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes.as_slice())
            .take(64 << 20)
            .read_to_end(&mut out)
            .map_err(ModuleError::Gzip)?;
        out
    } else {
        bytes
    };
    if let Some(pinned) = pinned_sha256 {
        let pinned = pinned
            .trim()
            .trim_start_matches("sha256:")
            .to_ascii_lowercase();
        let actual = Digest::of(&bytes);
        if actual.hex() != pinned {
            return Err(ModuleError::DigestMismatch { actual, pinned });
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::Write;

    #[test]
    fn reads_binary_data_and_gunzips_and_checks_the_pin() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"\0asm-module").unwrap();
        let gz = gz.finish().unwrap();
        use base64::Engine as _;
        let cm = json!({"metadata": {"name": "m"}, "binaryData": {"g.wasm": base64::engine::general_purpose::STANDARD.encode(&gz)}});
        let raw = bytes_from_configmap(&cm, "g.wasm").unwrap();
        let pin = Digest::of(b"\0asm-module").hex();
        assert_eq!(unpack(raw.clone(), Some(&pin)).unwrap(), b"\0asm-module");
        let err = unpack(raw, Some("00")).unwrap_err().to_string();
        assert!(err.contains("pins sha256:00"), "{err}");
        let err = bytes_from_configmap(&cm, "other.wasm")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no key `other.wasm`") && err.contains("keys: g.wasm"),
            "{err}"
        );
    }
}
