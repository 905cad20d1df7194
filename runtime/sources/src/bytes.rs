//! Module bytes out of what a source holds: a ConfigMap's key, a file under the operator's
//! directory; gzip accepted, optionally pinned by sha256; and why they could not be had.

use std::io::Read;
use std::path::Path;

use k8s_openapi::api::core::v1::ConfigMap;

use kubewasm_sandbox::Digest;

/// Why a module's bytes could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// The ConfigMap has no such key.
    #[error(
        "ConfigMap `{name}` has no key `{key}` in binaryData or data; create it with `kubectl create configmap {name} --from-file={key}=<guest>.wasm` (its other keys are not shown: the runtime reads it with its own rights, and whoever reads this status may not read the ConfigMap)"
    )]
    MissingKey {
        /// ConfigMap name.
        name: String,
        /// Key looked for.
        key: String,
    },
    /// The gzip stream is broken.
    #[error("module looks gzipped but does not decompress: {0}")]
    Gzip(#[source] std::io::Error),
    /// The gzip stream inflates past [`MAX_GZIP_RATIO`] times its size.
    #[error(
        "the gzipped module ({compressed} bytes) inflates to more than {ratio}× its size ({} bytes), the most this runtime inflates; nothing past that was inflated. A real component gzips about 3× (a gzip bomb, or a module padded with zeros, does not): store it uncompressed, or push it to a registry with `kubewasm push` and name it in spec.module.image",
        .compressed.saturating_mul(*.ratio)
    )]
    Inflates {
        /// Its compressed size, in bytes.
        compressed: u64,
        /// The most it may inflate, times its size.
        ratio: u64,
    },
    /// No room in the runtime's module read budget.
    #[error(transparent)]
    Budget(#[from] super::reads::BudgetExhausted),
    /// The bytes of this version of the source are no module: they fail the same way until
    /// the source changes, so they are not read again before ([`ModuleError::invalid_at`]).
    #[error("{error}")]
    Invalid {
        error: Box<ModuleError>,
        version: super::Version,
    },
    /// The read this one waited for failed (every controller naming that version of the
    /// module is told the same).
    #[error(transparent)]
    Shared(std::sync::Arc<ModuleError>),
    /// The bytes differ from the pinned digest.
    #[error(
        "module digest {} spec.module.sha256 pin sha256:{pinned}; update the pin or the module",
        match .actual { Some(d) => format!("is {d}, not the"), None => "does not match the".to_owned() }
    )]
    DigestMismatch {
        /// Digest found; `None` where it must not be shown (a file of the runtime).
        actual: Option<Digest>,
        /// Digest expected.
        pinned: String,
    },
    /// More bytes than any module may have.
    #[error(
        "the module is larger than {}, the most a module may be (after gunzip; the runtime's operator sets it with `kubewasm run --max-module-bytes`)",
        kubewasm_api::Unit::Bytes.show(*.max)
    )]
    TooBig {
        /// The cap, in bytes.
        max: u64,
    },
    /// The operator allows no module files.
    #[error(
        "spec.module.path `{path}`: this runtime loads no module files; its operator can allow a directory with `kubewasm run --module-dir DIR`, or put the module in a ConfigMap"
    )]
    NoModuleDir {
        /// The path asked for.
        path: String,
    },
    /// The file is not a regular file under the operator's module directory.
    #[error(
        "spec.module.path `{path}` is not a regular file under the module directory {dir} (`kubewasm run --module-dir`)"
    )]
    OutsideModuleDir {
        /// The path asked for.
        path: String,
        /// The operator's directory.
        dir: String,
    },
    /// A file could not be read.
    #[error("cannot read module file `{path}`: {source}")]
    File {
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The ConfigMap does not exist.
    #[error(
        "ConfigMap {namespace}/{name} does not exist; create it with `kubectl -n {namespace} create configmap {name} --from-file={key}=<guest>.wasm`"
    )]
    NoConfigMap {
        namespace: String,
        name: String,
        /// The key the spec names.
        key: String,
    },
    /// The source could not be asked (the API server did not answer, a ConfigMap in the
    /// offline state is malformed).
    #[error("{0}")]
    Unreachable(String),
    /// The spec names no usable source.
    #[error("{0}")]
    InvalidSpec(String),
    /// A registry did not give the image's module.
    #[error(transparent)]
    Registry(#[from] super::oci::PullError),
}

impl ModuleError {
    /// The reason a status gives for it.
    pub fn reason(&self) -> kubewasm_api::Reason {
        use kubewasm_api::Reason;
        match self {
            ModuleError::DigestMismatch { .. } => Reason::DigestMismatch,
            ModuleError::Gzip(_) | ModuleError::TooBig { .. } | ModuleError::Inflates { .. } => {
                Reason::ModuleInvalid
            }
            ModuleError::Budget(_) => Reason::ModuleNotLoaded,
            ModuleError::Shared(e) => e.reason(),
            ModuleError::Invalid { error, .. } => error.reason(),
            ModuleError::Registry(e) => e.reason(),
            ModuleError::Unreachable(_) => Reason::ClientError,
            ModuleError::InvalidSpec(_) => Reason::InvalidSpec,
            ModuleError::MissingKey { .. }
            | ModuleError::NoModuleDir { .. }
            | ModuleError::OutsideModuleDir { .. }
            | ModuleError::File { .. }
            | ModuleError::NoConfigMap { .. } => Reason::ModuleNotFound,
        }
    }
}

impl ModuleError {
    /// The version of the source whose bytes are no module, when that is the error.
    pub fn invalid_at(&self) -> Option<&super::Version> {
        match self {
            ModuleError::Invalid { version, .. } => Some(version),
            ModuleError::Shared(e) => e.invalid_at(),
            _ => None,
        }
    }

    /// This error, said to be about the bytes of `version` when they are no module.
    pub(super) fn at(self, version: &super::Version) -> ModuleError {
        match self.reason() {
            kubewasm_api::Reason::ModuleInvalid => ModuleError::Invalid {
                error: Box::new(self),
                version: version.clone(),
            },
            _ => self,
        }
    }
}

/// The raw bytes stored under `key` of a ConfigMap's `binaryData` (already base64-decoded by
/// k8s-openapi's `ByteString`) or `data`.
pub fn bytes_from_configmap(config_map: &ConfigMap, key: &str) -> Result<Vec<u8>, ModuleError> {
    take_key(config_map.clone(), key)
}

/// [`bytes_from_configmap`], taking the bytes out of the ConfigMap rather than copying them.
pub fn take_key(config_map: ConfigMap, key: &str) -> Result<Vec<u8>, ModuleError> {
    if let Some(bytes) = config_map.binary_data.and_then(|mut d| d.remove(key)) {
        return Ok(bytes.0);
    }
    if let Some(text) = config_map.data.and_then(|mut d| d.remove(key)) {
        return Ok(text.into_bytes());
    }
    Err(ModuleError::MissingKey {
        name: config_map.metadata.name.unwrap_or_else(|| "?".into()),
        key: key.to_owned(),
    })
}

/// The most bytes a module may have by default, read from a file, pulled from a registry or
/// after gunzip: the default of `kubewasm run --max-module-bytes` (`ManagerConfig`), and the
/// cap of the offline commands.
pub const DEFAULT_MAX_MODULE_BYTES: u64 = 64 << 20;

/// Reads a module file of a ClusterWasmController: `path` (absolute, or relative to `dir`)
/// must resolve — symlinks and `..` followed — to a regular file inside `dir`, and is read
/// up to `max` bytes. Blocking: call it off the async workers.
pub fn read_module_file(dir: &Path, path: &str, max: u64) -> Result<Vec<u8>, ModuleError> {
    let outside = || ModuleError::OutsideModuleDir {
        path: path.to_owned(),
        dir: dir.display().to_string(),
    };
    let file_error = |source| ModuleError::File {
        path: path.to_owned(),
        source,
    };
    let root = dir.canonicalize().map_err(|source| ModuleError::File {
        path: dir.display().to_string(),
        source,
    })?;
    let real = root.join(path).canonicalize().map_err(file_error)?;
    if !real.starts_with(&root) || !std::fs::metadata(&real).map_err(file_error)?.is_file() {
        return Err(outside());
    }
    let file = std::fs::File::open(&real).map_err(file_error)?;
    if !file.metadata().map_err(file_error)?.is_file() {
        return Err(outside());
    }
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(file_error)?;
    if bytes.len() as u64 > max {
        return Err(ModuleError::TooBig { max });
    }
    Ok(bytes)
}

/// How many times its compressed size a gzipped module may inflate to. Real components gzip
/// 2.4–2.9× (the project's Rust guests, and the 18 MB Python ones); a gzip bomb inflates a
/// thousand times. At 32×, a 64 KiB bomb stops at 2 MiB instead of 64 MiB, and the largest
/// ConfigMap (1 MiB) holds at most 32 MiB of module.
pub const MAX_GZIP_RATIO: u64 = 32;

/// Whether `bytes` are gzip (its magic number).
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0x1f, 0x8b])
}

/// The most bytes `compressed` bytes of gzip may inflate to: [`MAX_GZIP_RATIO`] times, and
/// never past `max`.
pub fn inflate_bound(compressed: usize, max: u64) -> u64 {
    (compressed as u64).saturating_mul(MAX_GZIP_RATIO).min(max)
}

/// Gunzips `compressed` into at most [`inflate_bound`] bytes, allocated once: the inflate
/// stops at the bound, and more is refused (the ratio, or `max`).
pub fn gunzip(compressed: &[u8], max: u64) -> Result<Vec<u8>, ModuleError> {
    let bound = inflate_bound(compressed.len(), max);
    let mut out = Vec::with_capacity(usize::try_from(bound).unwrap_or(0));
    let mut decoder = flate2::read::GzDecoder::new(compressed);
    (&mut decoder)
        .take(bound)
        .read_to_end(&mut out)
        .map_err(ModuleError::Gzip)?;
    let mut one_more = [0u8; 1];
    if decoder.read(&mut one_more).map_err(ModuleError::Gzip)? > 0 {
        return Err(if bound < max {
            ModuleError::Inflates {
                compressed: compressed.len() as u64,
                ratio: MAX_GZIP_RATIO,
            }
        } else {
            ModuleError::TooBig { max }
        });
    }
    out.shrink_to_fit();
    Ok(out)
}

/// Checks the optional sha256 pin against `actual`, the digest of the module's bytes.
/// `show_digest`: the error may name the digest found (not for files of the runtime).
pub fn check_pin(
    actual: Digest,
    pinned_sha256: Option<&str>,
    show_digest: bool,
) -> Result<(), ModuleError> {
    let Some(pinned) = pinned_sha256 else {
        return Ok(());
    };
    let pinned = pinned
        .trim()
        .trim_start_matches("sha256:")
        .to_ascii_lowercase();
    if actual.hex() != pinned {
        return Err(ModuleError::DigestMismatch {
            actual: show_digest.then_some(actual),
            pinned,
        });
    }
    Ok(())
}

/// Gunzips when the bytes are gzip ([`gunzip`]: at most `max` bytes and [`MAX_GZIP_RATIO`]
/// times their size), then checks the optional sha256 pin ([`check_pin`]).
pub fn unpack(
    bytes: Vec<u8>,
    pinned_sha256: Option<&str>,
    show_digest: bool,
    max: u64,
) -> Result<Vec<u8>, ModuleError> {
    let bytes = if is_gzip(&bytes) {
        gunzip(&bytes, max)?
    } else {
        bytes
    };
    check_pin(Digest::of(&bytes), pinned_sha256, show_digest)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_pin_must_name_the_digest() {
        let d = Digest::of(b"module");
        assert!(check_pin(d, None, false).is_ok());
        assert!(check_pin(d, Some(&d.hex()), false).is_ok());
        let upper = format!(" sha256:{} ", d.hex().to_uppercase());
        assert!(check_pin(d, Some(&upper), false).is_ok());
        let other = "0".repeat(64);
        assert!(matches!(
            check_pin(d, Some(&other), false),
            Err(ModuleError::DigestMismatch { actual: None, .. })
        ));
        assert!(matches!(
            check_pin(d, Some(&other), true),
            Err(ModuleError::DigestMismatch { actual: Some(a), .. }) if a == d
        ));
    }

    #[test]
    fn the_sandbox_compiles_what_may_be_fetched() {
        let sandbox = kubewasm_sandbox::SandboxConfig::default().max_module_bytes as u64;
        assert_eq!(sandbox, DEFAULT_MAX_MODULE_BYTES);
    }
    use super::*;
    use serde_json::json;
    use std::io::Write;

    #[test]
    fn reads_binary_data_and_gunzips_and_checks_the_pin() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"\0asm-module").unwrap();
        let gz = gz.finish().unwrap();
        use base64::Engine as _;
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "m"},
            "binaryData": {"g.wasm": base64::engine::general_purpose::STANDARD.encode(&gz)}}))
        .unwrap();
        let raw = bytes_from_configmap(&cm, "g.wasm").unwrap();
        let pin = Digest::of(b"\0asm-module").hex();
        assert_eq!(
            unpack(raw.clone(), Some(&pin), true, DEFAULT_MAX_MODULE_BYTES).unwrap(),
            b"\0asm-module"
        );
        let err = unpack(raw.clone(), Some("00"), true, DEFAULT_MAX_MODULE_BYTES)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!(
                "is sha256:{pin}, not the spec.module.sha256 pin sha256:00"
            )),
            "{err}"
        );
        let err = unpack(raw, Some("00"), false, DEFAULT_MAX_MODULE_BYTES)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("does not match the spec.module.sha256 pin sha256:00"),
            "{err}"
        );
        assert!(!err.contains(&pin), "{err}");
        let err = bytes_from_configmap(&cm, "other.wasm")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no key `other.wasm`") && !err.contains("g.wasm"),
            "{err}"
        );
    }

    /// The cap the file tests read under.
    const MAX_TEST: u64 = 1 << 20;

    #[test]
    fn module_files_come_only_from_regular_files_inside_the_module_dir() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("modules");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("ok.wasm"), b"\0asm").unwrap();
        std::fs::write(root.path().join("secret"), b"hush").unwrap();
        std::os::unix::fs::symlink(root.path().join("secret"), dir.join("link.wasm")).unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        assert_eq!(
            read_module_file(&dir, "ok.wasm", MAX_TEST).unwrap(),
            b"\0asm"
        );
        let ok = dir.join("ok.wasm");
        assert_eq!(
            read_module_file(&dir, ok.to_str().unwrap(), MAX_TEST).unwrap(),
            b"\0asm"
        );
        for outside in [
            "../secret",
            "link.wasm",
            "/etc/hostname",
            "/dev/zero",
            "sub",
            "/proc/self/environ",
        ] {
            let err = read_module_file(&dir, outside, MAX_TEST)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("is not a regular file under the module directory"),
                "{outside}: {err}"
            );
            assert!(!err.contains("hush"), "{err}");
        }
        let err = read_module_file(&dir, "missing.wasm", MAX_TEST)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("cannot read module file `missing.wasm`"),
            "{err}"
        );
        let big = std::fs::File::create(dir.join("big.wasm")).unwrap();
        big.set_len(MAX_TEST + 1).unwrap();
        let err = read_module_file(&dir, "big.wasm", MAX_TEST)
            .unwrap_err()
            .to_string();
        assert!(err.contains("larger than 1Mi"), "{err}");
    }
}
