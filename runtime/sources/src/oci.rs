//! Modules from OCI registries: the CNCF wasm artifact layout (one `application/wasm` layer,
//! config `application/vnd.wasm.config.v0+json` naming the component's world), pulled with
//! `oci-client`, every byte of it bounded.
//!
//! A pull reads the manifest, then the config (at most [`MAX_CONFIG_BYTES`]), refuses a
//! component of another world before the layer is asked for, refuses a layer declared larger
//! than the cap, and streams the layer, stopping at the cap whatever the registry said, and
//! checks its digest. A tag is first resolved with a `HEAD` (no body): a tag that has not
//! moved costs one small request. Every request of a pull goes through one
//! [`Session`](super::registry_http::Session): the addresses it may reach, its credentials and
//! token, and one capped reader for every body (see [`registry_http`](super::registry_http)).
//! The layout's media types and config are in `sources/artifact.rs`, the check of a digest's
//! signatures in `sources/signatures.rs`.

use std::sync::Arc;
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

pub use super::artifact::{
    CONFIG_MEDIA_TYPE, CONTROLLER_WORLD, ComponentInfo, LAYER_MEDIA_TYPE, MANIFEST_MEDIA_TYPE,
    WasmConfig,
};
use super::cosign::TrustedKey;
use super::module_cache::{CacheScope, ModuleCache};
use super::reads::{BudgetExhausted, ModuleBytes, ReadBudget};
pub use super::registry_http::{RegistryAccess, read_at_most, read_capped};
use super::registry_http::{Session, read_body};
use kubewasm_api::{ImageRef, Reason};
use kubewasm_sandbox::Digest;

/// The most bytes an image's config may have: it names a world and some interfaces.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The most bytes a manifest may have (an image's, or its signatures'): a module's is under
/// 1 KiB, one of [`super::cosign::MAX_SIGNATURES`] signatures about 40 KiB.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;
/// How long connecting to a registry may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a registry may leave a request without a byte of answer.
pub const READ_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one whole pull may take (credentials, manifest, config, layer): a registry that
/// drips bytes ends here.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(120);

/// What the runtime's operator allows of registries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryConfig {
    /// Registries (`host:port`) spoken to over plain HTTP; every other one over HTTPS.
    pub insecure: Vec<String>,
    /// Registries (`host` or `host:port`) reached even at internal addresses
    /// (`--allow-registry`; see [`RegistryAccess`]).
    pub allowed: Vec<String>,
    /// The API server's addresses, which no registry may have.
    pub api_server: Vec<std::net::IpAddr>,
    /// The most bytes a module (the layer) may have.
    pub max_module_bytes: u64,
    /// The deadline of one pull.
    pub pull_timeout: Duration,
    /// Keys a module's digest must carry a cosign signature of (`--verify-key`); none: no
    /// signature is asked for.
    pub verify_keys: Vec<TrustedKey>,
    /// Layers pulled before, kept on disk by digest (`kubewasm run --module-cache-dir`).
    pub module_cache: ModuleCache,
    /// What a layer is charged to while it is read and held (`kubewasm run --module-read-bytes`).
    pub read_budget: ReadBudget,
}

impl RegistryConfig {
    /// HTTPS everywhere, the default module cap.
    pub fn new(max_module_bytes: u64) -> Self {
        RegistryConfig {
            insecure: Vec::new(),
            allowed: Vec::new(),
            api_server: Vec::new(),
            max_module_bytes,
            pull_timeout: PULL_TIMEOUT,
            verify_keys: Vec::new(),
            module_cache: ModuleCache::off(),
            read_budget: ReadBudget::unbounded(),
        }
    }

    /// What the operator allows of registries' addresses.
    pub fn access(&self) -> Arc<RegistryAccess> {
        Arc::new(RegistryAccess {
            insecure: self.insecure.clone(),
            allowed: self.allowed.clone(),
            api_server: self.api_server.clone(),
        })
    }

    /// An `oci-client` client for one push by the user (`kubewasm push`, `kubewasm sign`),
    /// which trusts the system's CA roots; pulls never use it (see
    /// [`registry_http`](super::registry_http)).
    pub fn client(&self) -> Result<oci_client::Client, PullError> {
        check_roots()?;
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.insecure.clone()),
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            max_concurrent_download: 1,
            platform_resolver: None,
            ..ClientConfig::default()
        };
        // `try_from`, not `new`: `new` falls back to a default client without the timeouts.
        oci_client::Client::try_from(config).map_err(|e| PullError::Client(e.to_string()))
    }
}

/// Refuses to make an HTTP client without CA roots (reqwest's platform verifier panics
/// without any, even for plain HTTP), and installs the crypto provider.
pub(super) fn check_roots() -> Result<(), PullError> {
    static SYSTEM_ROOTS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let roots = *SYSTEM_ROOTS.get_or_init(|| rustls_native_certs::load_native_certs().certs.len());
    if roots == 0 {
        return Err(PullError::Client(
            "this runtime has no CA certificates (none in /etc/ssl/certs, $SSL_CERT_FILE or $SSL_CERT_DIR), and its registry client cannot start without them, even for plain HTTP; its operator mounts a CA bundle and sets SSL_CERT_FILE".into(),
        ));
    }
    install_crypto_provider();
    Ok(())
}

/// reqwest (under oci-client) is built without a crypto provider of its own: it uses the
/// process's default, which is set here to the ring provider kube already uses.
fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err: another part of the process installed one first; that one is used.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Why a module could not be pulled from a registry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PullError {
    /// No registry client could be made.
    #[error("cannot make a registry client: {0}")]
    Client(String),
    /// The registry did not answer, or answered with an error.
    #[error("registry {registry}: {message}")]
    Registry {
        /// `host:port`.
        registry: String,
        /// What went wrong, as the client says it.
        message: String,
    },
    /// The image is not the CNCF wasm artifact layout.
    #[error(
        "{image} is not a wasm component artifact: {why}; push it with `kubewasm push FILE {image}`"
    )]
    NotWasm {
        image: String,
        /// What differs.
        why: String,
    },
    /// The config names another world, or none.
    #[error(
        "the image's config says its component targets {}, not {CONTROLLER_WORLD}: it is not a kubewasm controller (its layer was not pulled); build it with kubewasm-guest-sdk and push it with `kubewasm push`",
        match .world { Some(w) => format!("world `{w}`"), None => "no world".to_owned() }
    )]
    WrongWorld {
        /// The world it names.
        world: Option<String>,
    },
    /// A blob is, or would be, larger than allowed.
    #[error(
        "the image's {what} is larger than {}, the most this runtime takes{}; nothing more of it was read",
        kubewasm_api::Unit::Bytes.show(*.max),
        if *.what == "module" { " (`kubewasm run --max-module-bytes`)" } else { "" }
    )]
    TooBig {
        /// `module`, `config`, `manifest` or `signature`.
        what: &'static str,
        max: u64,
    },
    /// A blob's bytes differ from its descriptor (digest or size): the registry lies.
    #[error("the registry sent a {what} that differs from its manifest: {why}")]
    Corrupt {
        /// `module` or `config`.
        what: &'static str,
        /// What differs.
        why: String,
    },
    /// The pull took longer than its deadline.
    #[error("pulling {image} took more than {}s; retrying", .after.as_secs())]
    TimedOut {
        image: String,
        /// The deadline.
        after: Duration,
    },
    /// A first pull is under way.
    #[error("pulling {image}")]
    Pulling { image: String },
    /// The digest carries no good signature by a trusted key (`--verify-key`).
    #[error(
        "{image} resolves to {digest}, which is not signed by a key this runtime trusts (`kubewasm run --verify-key`): {why}; its publisher signs it with `kubewasm sign --key KEY {repository}@{digest}` (or `cosign sign --key`)"
    )]
    Signature {
        /// The image as the spec names it.
        image: String,
        /// Its repository (`registry/repo`).
        repository: String,
        /// The digest it resolved to.
        digest: String,
        /// Why no signature is good.
        why: String,
    },
    /// No room in the runtime's module read budget for the layer.
    #[error(transparent)]
    Budget(#[from] BudgetExhausted),
    /// The pull secret could not be used.
    #[error("{message}")]
    PullSecret {
        /// The reason for the status.
        reason: Reason,
        /// What to do.
        message: String,
    },
}

impl PullError {
    /// The reason a status gives for it.
    pub fn reason(&self) -> Reason {
        match self {
            PullError::Client(_) => Reason::InternalError,
            PullError::Registry { .. } | PullError::TimedOut { .. } => Reason::ModuleNotFound,
            PullError::NotWasm { .. } | PullError::WrongWorld { .. } | PullError::TooBig { .. } => {
                Reason::ModuleInvalid
            }
            PullError::Corrupt { .. } => Reason::DigestMismatch,
            PullError::Pulling { .. } | PullError::Budget(_) => Reason::ModuleNotLoaded,
            PullError::PullSecret { reason, .. } => *reason,
            PullError::Signature { .. } => Reason::SignatureInvalid,
        }
    }
}

/// What a pull found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pulled {
    /// The image still resolves to the digest already loaded.
    Unchanged,
    /// The module, from the image manifest of `digest`.
    Module {
        /// The manifest's digest (`sha256:…`): what the image resolved to.
        digest: String,
        /// The component, shared by every controller the pull serves.
        bytes: ModuleBytes,
    },
}

/// Pulls `image`'s module with `auth`, unless it still resolves to `known` (a manifest
/// digest), within `config.pull_timeout`.
pub async fn pull(
    config: &RegistryConfig,
    image: &ImageRef,
    auth: &RegistryAuth,
    known: Option<&str>,
) -> Result<Pulled, PullError> {
    let deadline = config.pull_timeout;
    tokio::time::timeout(deadline, pull_within(config, image, auth, known))
        .await
        .unwrap_or_else(|_| {
            Err(PullError::TimedOut {
                image: image.to_string(),
                after: deadline,
            })
        })
}

async fn pull_within(
    config: &RegistryConfig,
    image: &ImageRef,
    auth: &RegistryAuth,
    known: Option<&str>,
) -> Result<Pulled, PullError> {
    let reference = image.reference();
    let mut session = Session::new(
        &config.access(),
        reference.registry(),
        reference.repository(),
        auth,
    )?;
    let digest = match image.digest() {
        Some(d) => d.to_owned(),
        None => resolve_tag(&mut session, reference.tag().unwrap_or("latest")).await?,
    };
    if known == Some(digest.as_str()) {
        return Ok(Pulled::Unchanged);
    }
    if !config.verify_keys.is_empty() {
        super::signatures::verify_signature(config, &mut session, image, &digest).await?;
    }
    // The manifest of that digest (a tag may move meanwhile: what is pulled is what was
    // resolved).
    let Some(raw) = read_manifest(&mut session, &digest, &[MANIFEST_MEDIA_TYPE]).await? else {
        return Err(PullError::Registry {
            registry: image.registry().to_owned(),
            message: format!("it has no manifest {digest} (anymore)"),
        });
    };
    let manifest_digest = format!("sha256:{}", Digest::of(&raw).hex());
    if manifest_digest != digest {
        return Err(PullError::Corrupt {
            what: "manifest",
            why: format!("its digest is {manifest_digest}, not {digest}"),
        });
    }
    let not_wasm = |why: String| PullError::NotWasm {
        image: image.to_string(),
        why,
    };
    let manifest: OciImageManifest = serde_json::from_slice(&raw)
        .map_err(|e| not_wasm(format!("its manifest is not an OCI image manifest: {e}")))?;
    drop(raw);
    let layer = wasm_layer(&manifest).map_err(not_wasm)?;
    let config_bytes =
        read_blob(&mut session, &manifest.config, MAX_CONFIG_BYTES, "config").await?;
    let wasm_config: WasmConfig = serde_json::from_slice(&config_bytes)
        .map_err(|e| not_wasm(format!("its config is not a wasm config: {e}")))?;
    wasm_config.controller_world()?;
    // The layer by its digest: from the cache (hashed again there) when it was pulled before.
    // Per credential scope: a layer read with another tenant's credentials is not this pull's.
    let cache = &config.module_cache;
    let scope = CacheScope::of(reference.registry(), auth);
    let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
    // Charged before it is read: the size the manifest says, within the cap (a layer larger
    // is refused as it streams, past either).
    let max = config.max_module_bytes;
    let charge = config.read_budget.charge(size.min(max)).await?;
    if size <= max
        && let Some(bytes) = cache.get(&layer.digest, size, &scope).await
    {
        let bytes = held(bytes, charge).await?;
        return Ok(Pulled::Module { digest, bytes });
    }
    let bytes = read_blob(&mut session, layer, max, "module").await?;
    cache.put(&layer.digest, &bytes, &scope).await;
    let bytes = held(bytes, charge).await?;
    Ok(Pulled::Module { digest, bytes })
}

/// A layer's bytes held under their charge (hashed off the async workers).
async fn held(bytes: Vec<u8>, charge: super::reads::Charge) -> Result<ModuleBytes, PullError> {
    tokio::task::spawn_blocking(move || ModuleBytes::new(bytes, charge))
        .await
        .map_err(|e| PullError::Client(format!("hashing a layer failed: {e}")))
}

/// The digest `tag` names now: from the `Docker-Content-Digest` of a `HEAD` (no body), or,
/// when the registry sends none, the digest of the manifest read (capped).
async fn resolve_tag(session: &mut Session, tag: &str) -> Result<String, PullError> {
    let path = format!("manifests/{tag}");
    let accept = [MANIFEST_MEDIA_TYPE];
    let missing = |session: &Session| PullError::Registry {
        registry: session.registry().to_owned(),
        message: format!("it has no tag `{}`", kubewasm_sandbox::guest_text(tag, 128)),
    };
    let Some(head) = session.send(reqwest::Method::HEAD, &path, &accept).await? else {
        return Err(missing(session));
    };
    let said = head
        .headers()
        .get("docker-content-digest")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    drop(head);
    if let Some(digest) = said {
        return match is_sha256_digest(&digest) {
            true => Ok(digest),
            false => Err(PullError::Corrupt {
                what: "manifest",
                why: format!(
                    "the registry names its digest `{}`, not `sha256:` and 64 hex digits",
                    kubewasm_sandbox::guest_text(&digest, 100)
                ),
            }),
        };
    }
    match read_manifest(session, tag, &accept).await? {
        Some(raw) => Ok(format!("sha256:{}", Digest::of(&raw).hex())),
        None => Err(missing(session)),
    }
}

/// `sha256:` and 64 lowercase hex digits.
fn is_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A manifest by tag or digest: at most [`MAX_MANIFEST_BYTES`], refused as soon as the
/// response says or sends more. `None`: the registry says there is none.
pub(super) async fn read_manifest(
    session: &mut Session,
    target: &str,
    accept: &[&str],
) -> Result<Option<Vec<u8>>, PullError> {
    let path = format!("manifests/{target}");
    match session.send(reqwest::Method::GET, &path, accept).await? {
        Some(response) => read_body(response, MAX_MANIFEST_BYTES, "manifest")
            .await
            .map(Some),
        None => Ok(None),
    }
}

/// The manifest's one `application/wasm` layer, after its config's media type is checked.
fn wasm_layer(manifest: &OciImageManifest) -> Result<&OciDescriptor, String> {
    if manifest.config.media_type != CONFIG_MEDIA_TYPE {
        return Err(format!(
            "its config is `{}`, not `{CONFIG_MEDIA_TYPE}`",
            kubewasm_sandbox::guest_text(&manifest.config.media_type, 100)
        ));
    }
    let [layer] = manifest.layers.as_slice() else {
        return Err(format!("it has {} layers, not one", manifest.layers.len()));
    };
    if layer.media_type != LAYER_MEDIA_TYPE {
        return Err(format!(
            "its layer is `{}`, not `{LAYER_MEDIA_TYPE}`",
            kubewasm_sandbox::guest_text(&layer.media_type, 100)
        ));
    }
    for descriptor in [&manifest.config, layer] {
        // A descriptor's `urls` would make the client fetch from wherever they point.
        if descriptor.urls.as_ref().is_some_and(|u| !u.is_empty()) {
            return Err(
                "a descriptor names foreign `urls`, which this runtime never follows".into(),
            );
        }
    }
    Ok(layer)
}

/// A blob of at most `max` bytes (and exactly its descriptor's size), its digest checked;
/// refused as soon as the descriptor, the response's length or the stream says more.
pub(super) async fn read_blob(
    session: &mut Session,
    descriptor: &OciDescriptor,
    max: u64,
    what: &'static str,
) -> Result<Vec<u8>, PullError> {
    let corrupt = |why: String| PullError::Corrupt { what, why };
    let declared = u64::try_from(descriptor.size)
        .map_err(|_| corrupt(format!("its size is {}", descriptor.size)))?;
    if declared > max {
        return Err(PullError::TooBig { what, max });
    }
    if !is_sha256_digest(&descriptor.digest) {
        return Err(corrupt(format!(
            "its descriptor names digest `{}`, not `sha256:` and 64 hex digits",
            kubewasm_sandbox::guest_text(&descriptor.digest, 100)
        )));
    }
    let path = format!("blobs/{}", descriptor.digest);
    let Some(response) = session.send(reqwest::Method::GET, &path, &[]).await? else {
        return Err(PullError::Registry {
            registry: session.registry().to_owned(),
            message: format!("it has no {what} blob {}", descriptor.digest),
        });
    };
    if let Some(length) = response.content_length()
        && length != declared
    {
        return Err(corrupt(format!(
            "it is {length} bytes long, its descriptor says {declared}"
        )));
    }
    let stream = futures::StreamExt::map(response.bytes_stream(), |chunk| {
        chunk.map_err(std::io::Error::other)
    });
    let bytes = read_capped(stream, declared, what).await?;
    let actual = format!("sha256:{}", Digest::of(&bytes).hex());
    if actual != descriptor.digest {
        return Err(corrupt(format!(
            "its digest is {actual}, not {}",
            descriptor.digest
        )));
    }
    Ok(bytes)
}

/// Credentials for `registry` in a docker config (`{"auths": {REGISTRY: {"auth": base64
/// "user:password"} | {"username", "password"}}}`: a `kubernetes.io/dockerconfigjson`
/// Secret's `.dockerconfigjson`, `~/.docker/config.json`). `None`: no entry for it.
pub fn docker_config_auth(json: &[u8], registry: &str) -> Result<Option<RegistryAuth>, String> {
    #[derive(Deserialize)]
    struct DockerConfig {
        #[serde(default)]
        auths: std::collections::BTreeMap<String, Entry>,
    }
    #[derive(Deserialize)]
    struct Entry {
        auth: Option<String>,
        username: Option<String>,
        password: Option<String>,
    }
    let config: DockerConfig =
        serde_json::from_slice(json).map_err(|e| format!("not a docker config: {e}"))?;
    // Keys are `host[:port]`, sometimes written as a URL (`https://host/v1/`).
    let host = |key: &str| {
        let key = key
            .strip_prefix("https://")
            .or_else(|| key.strip_prefix("http://"))
            .unwrap_or(key);
        key.split('/').next().unwrap_or(key).to_owned()
    };
    let Some((_, entry)) = config.auths.iter().find(|(key, _)| host(key) == registry) else {
        return Ok(None);
    };
    if let (Some(user), Some(password)) = (&entry.username, &entry.password) {
        return Ok(Some(RegistryAuth::Basic(user.clone(), password.clone())));
    }
    let Some(auth) = &entry.auth else {
        return Err(format!(
            "its entry for {registry} has neither `auth` nor `username` and `password`"
        ));
    };
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(|_| format!("its `auth` for {registry} is not base64"))?;
    let decoded = String::from_utf8(decoded)
        .map_err(|_| format!("its `auth` for {registry} is not UTF-8"))?;
    let Some((user, password)) = decoded.split_once(':') else {
        return Err(format!("its `auth` for {registry} is not `user:password`"));
    };
    Ok(Some(RegistryAuth::Basic(
        user.to_owned(),
        password.to_owned(),
    )))
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;

    use super::*;

    fn chunks(
        parts: Vec<&'static [u8]>,
    ) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Unpin {
        futures::stream::iter(parts.into_iter().map(|p| Ok(bytes::Bytes::from_static(p))))
    }

    #[tokio::test]
    async fn a_blob_is_read_to_its_declared_size_and_not_a_byte_more() {
        assert_eq!(
            read_capped(chunks(vec![b"ab", b"cd"]), 4, "module")
                .await
                .unwrap(),
            b"abcd"
        );
        let err = read_capped(chunks(vec![b"ab", b"cde"]), 4, "module")
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("goes on past the 4 bytes"),
            "{err}"
        );
        let err = read_capped(chunks(vec![b"ab"]), 4, "module")
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("ended after 2 of the 4 bytes"),
            "{err}"
        );
        assert_eq!(err.reason(), Reason::DigestMismatch);
    }

    #[tokio::test]
    async fn an_endless_blob_stops_at_its_declared_size() {
        // A registry that never stops sending: the reader gives up after `declared` bytes.
        let endless = futures::stream::repeat_with(|| Ok(bytes::Bytes::from(vec![0u8; 64 << 10])));
        let mut read = 0u64;
        let counted = endless.inspect(|c: &Result<bytes::Bytes, std::io::Error>| {
            read += c.as_ref().map_or(0, |c| c.len() as u64);
        });
        let err = read_capped(Box::pin(counted), 1 << 20, "module")
            .await
            .unwrap_err();
        assert!(matches!(err, PullError::Corrupt { .. }), "{err}");
        assert!(read <= (1 << 20) + (64 << 10), "read {read} bytes");
    }

    #[tokio::test]
    async fn a_registry_that_never_answers_ends_at_the_deadline() {
        // Accepts connections and never says a byte.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        let config = RegistryConfig {
            insecure: vec![addr.clone()],
            pull_timeout: Duration::from_millis(500),
            ..RegistryConfig::new(1 << 20)
        };
        let image = ImageRef::parse(&format!("{addr}/silent:v1")).unwrap();
        let started = std::time::Instant::now();
        let err = pull(&config, &image, &RegistryAuth::Anonymous, None)
            .await
            .unwrap_err();
        assert!(matches!(err, PullError::TimedOut { .. }), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(err.reason(), Reason::ModuleNotFound);
        held.abort();
    }

    #[tokio::test]
    async fn an_endless_manifest_is_cut_off_at_its_cap() {
        // Pinned by digest: no HEAD, the manifest's GET goes on for ever (the tag's HEAD-less
        // path is `registry_http`'s test).
        use kubewasm_test_support::hostile_registry::HostileRegistry;
        let registry = HostileRegistry::start().await.unwrap();
        let config = RegistryConfig {
            insecure: vec![registry.addr().to_owned()],
            ..RegistryConfig::new(1 << 20)
        };
        let image = format!(
            "{}/endless-manifest@sha256:{}",
            registry.addr(),
            "0".repeat(64)
        );
        let image = ImageRef::parse(&image).unwrap();
        let err = pull(&config, &image, &RegistryAuth::Anonymous, None)
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("manifest is larger than 1Mi"),
            "{err}"
        );
        // The server got as far as the socket buffers let it, not further.
        let sent = registry.sent("endless-manifest");
        assert!(sent < 64 << 20, "the server sent {sent} bytes");
    }

    #[test]
    fn the_world_is_read_from_a_components_imports_and_exports() {
        let other = wat::parse_str("(component)").unwrap();
        let info = ComponentInfo::of(&other).unwrap();
        assert_eq!(info.target, None);
        assert!(info.exports.is_empty() && info.imports.is_empty());
        let core = wat::parse_str("(module)").unwrap();
        assert!(
            ComponentInfo::of(&core)
                .unwrap_err()
                .contains("core module")
        );
        assert!(
            ComponentInfo::of(b"junk")
                .unwrap_err()
                .contains("not a WebAssembly component")
        );
    }

    #[test]
    fn only_the_controller_world_is_taken() {
        let config = |target: Option<&str>| WasmConfig {
            created: None,
            author: None,
            architecture: "wasm".into(),
            os: "wasip2".into(),
            layer_digests: Vec::new(),
            component: Some(ComponentInfo {
                exports: vec!["reconcile".into()],
                imports: Vec::new(),
                target: target.map(Into::into),
            }),
        };
        assert!(
            config(Some("kubewasm:controller/controller@0.3.0"))
                .controller_world()
                .is_ok()
        );
        assert!(
            config(Some("kubewasm:controller/controller"))
                .controller_world()
                .is_ok()
        );
        let err = config(Some("wasi:cli/command@0.2.0"))
            .controller_world()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("targets world `wasi:cli/command@0.2.0`"),
            "{err}"
        );
        assert_eq!(err.reason(), Reason::ModuleInvalid);
        let err = config(Some("kubewasm:controller/controllerX"))
            .controller_world()
            .unwrap_err();
        assert!(matches!(err, PullError::WrongWorld { .. }));
        let err = config(None).controller_world().unwrap_err();
        assert!(err.to_string().contains("targets no world"), "{err}");
        // The layout as oci-wasm writes it parses.
        let written = r#"{"created":"2026-01-01T00:00:00Z","author":null,"architecture":"wasm","os":"wasip2","layerDigests":["sha256:00"],"component":{"exports":["reconcile"],"imports":["kubewasm:controller/host@0.3.0"],"target":"kubewasm:controller/controller@0.3.0"}}"#;
        let parsed: WasmConfig = serde_json::from_str(written).unwrap();
        assert!(parsed.controller_world().is_ok());
    }

    #[test]
    fn docker_configs_give_the_registrys_credentials() {
        use base64::Engine as _;
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:s3cret");
        let json = format!(
            r#"{{"auths": {{"https://127.0.0.1:5000/v1/": {{"auth": "{auth}"}}, "other.example": {{"username": "bob", "password": "pw"}}}}}}"#
        );
        assert_eq!(
            docker_config_auth(json.as_bytes(), "127.0.0.1:5000").unwrap(),
            Some(RegistryAuth::Basic("alice".into(), "s3cret".into()))
        );
        assert_eq!(
            docker_config_auth(json.as_bytes(), "other.example").unwrap(),
            Some(RegistryAuth::Basic("bob".into(), "pw".into()))
        );
        assert_eq!(
            docker_config_auth(json.as_bytes(), "nowhere:1").unwrap(),
            None
        );
        assert!(
            docker_config_auth(b"{auths", "x")
                .unwrap_err()
                .contains("not a docker config")
        );
        let bad = r#"{"auths": {"r.example": {"auth": "!!"}}}"#;
        assert!(
            docker_config_auth(bad.as_bytes(), "r.example")
                .unwrap_err()
                .contains("not base64")
        );
    }

    #[test]
    fn a_manifest_with_foreign_urls_or_other_media_types_is_refused() {
        let descriptor = |media_type: &str| OciDescriptor {
            media_type: media_type.into(),
            digest: format!("sha256:{}", "0".repeat(64)),
            size: 1,
            ..OciDescriptor::default()
        };
        let manifest = |config: OciDescriptor, layers: Vec<OciDescriptor>| OciImageManifest {
            schema_version: 2,
            media_type: Some(MANIFEST_MEDIA_TYPE.into()),
            config,
            layers,
            subject: None,
            artifact_type: None,
            annotations: None,
        };
        let ok = manifest(
            descriptor(CONFIG_MEDIA_TYPE),
            vec![descriptor(LAYER_MEDIA_TYPE)],
        );
        assert!(wasm_layer(&ok).is_ok());
        let docker = manifest(
            descriptor("application/vnd.docker.container.image.v1+json"),
            vec![descriptor(LAYER_MEDIA_TYPE)],
        );
        assert!(wasm_layer(&docker).unwrap_err().contains("its config is"));
        let two = manifest(
            descriptor(CONFIG_MEDIA_TYPE),
            vec![descriptor(LAYER_MEDIA_TYPE), descriptor(LAYER_MEDIA_TYPE)],
        );
        assert!(wasm_layer(&two).unwrap_err().contains("2 layers"));
        let mut foreign = descriptor(LAYER_MEDIA_TYPE);
        foreign.urls = Some(vec!["http://169.254.169.254/".into()]);
        let foreign = manifest(descriptor(CONFIG_MEDIA_TYPE), vec![foreign]);
        assert!(wasm_layer(&foreign).unwrap_err().contains("foreign `urls`"));
    }
}
