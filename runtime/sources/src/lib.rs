//! Modules from where a controller says they are: one seam for every source.
//!
//! A spec's module is parsed once into an [`api::Source`](kubewasm_api::Source); [`fetch`] is
//! the one place that dispatches on it, and asks an [`Origin`] for what the source names: the
//! cluster for the runtime ([`ClusterOrigin`]), the user's files and `--state` for
//! `kubewasm reconcile` ([`OfflineOrigin`]). It returns the module's bytes (gunzipped,
//! checked against the spec's pin) and the [`Version`] they came from, or says that the
//! version already loaded is still current. The runtime runs every fetch beside its manager
//! loop ([`Fetches`]: one at a time per controller, fair between tenants, its answer held a
//! bounded time); registries are asked beside it too ([`Pulls`]), and their answer may be
//! "nothing yet" ([`Fetched::Pending`]). What the manager
//! must know of a source (what to watch, what is pulled, what may be shared, what the status
//! shows) it asks [`Sourced`], never the source's kind. A new kind of source adds a variant to
//! `Source`, a method to `Origin`, an arm to `fetch` and to each of [`Sourced`]'s methods: the
//! compiler names every place that lacks it, and nothing above this crate names a kind.
//!
//! The floor above the API types and the sandbox, below the runtime: it knows modules'
//! bytes and digests, never the controllers that run them.

// Nothing a tenant writes (a spec, a registry's answer, a ConfigMap) may reach a panic.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod artifact;
mod bytes;
mod capped;
mod cluster;
pub mod cosign;
mod credentials;
mod fetches;
mod module_cache;
pub mod oci;
mod offline;
mod pulls;
mod reads;
mod registry_http;
mod signatures;
mod sourced;

use std::future::Future;

use k8s_openapi::api::core::v1::ConfigMap;

use kubewasm_api::{ImageRef, Source};
use kubewasm_sandbox::Digest;

pub use bytes::{
    DEFAULT_MAX_MODULE_BYTES, MAX_GZIP_RATIO, ModuleError, bytes_from_configmap, check_pin, gunzip,
    inflate_bound, read_module_file, unpack,
};
use bytes::{is_gzip, take_key};
pub use cluster::{ClusterOrigin, ImagePuller};
pub use fetches::{Asked, FETCHES_PER_TENANT, Fetches, PARALLEL_FETCHES, UNTAKEN_TTL};
pub use module_cache::ModuleCache;
pub use offline::OfflineOrigin;
pub use pulls::{Credentials, PARALLEL_PULLS, Pulls};
pub use reads::{
    BUDGET_WAIT, BudgetExhausted, Charge, DEFAULT_MODULE_READ_BYTES, ModuleBytes, ModuleReads,
    ReadBudget, ReadKey,
};
pub use sourced::Sourced;

/// What reading a module ConfigMap is charged before the request is sent: its response
/// decoded, at most the API server's 1.5 MiB object (etcd's limit) as JSON and the 1 MiB of
/// values decoded from it.
pub const CONFIG_MAP_READ_BYTES: u64 = 3 << 20;

/// Which version of its source a module came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Version {
    /// A revision of the object holding it (a ConfigMap's uid and resourceVersion): another
    /// revision may hold other bytes, the same one never does.
    Revision {
        /// The object's uid (a ConfigMap deleted and made again is another object).
        uid: Option<String>,
        /// Its resourceVersion.
        resource_version: Option<String>,
    },
    /// The bytes themselves, where the source has no revisions (a file).
    Digest(Digest),
    /// The digest of the image manifest a reference resolved to (`sha256:…`): the same digest
    /// always names the same module.
    Image(String),
}

impl Version {
    /// The revision of an object.
    pub fn of(metadata: &kube::api::ObjectMeta) -> Version {
        Version::Revision {
            uid: metadata.uid.clone(),
            resource_version: metadata.resource_version.clone(),
        }
    }

    /// As a controller's status shows it (`status.moduleRevision`): a ConfigMap's
    /// resourceVersion, an image's manifest digest, a file's module digest.
    pub fn shown(&self) -> Option<String> {
        match self {
            Version::Revision {
                resource_version, ..
            } => resource_version.clone(),
            Version::Digest(digest) => Some(digest.to_string()),
            Version::Image(digest) => Some(digest.clone()),
        }
    }
}

/// What [`fetch`] found.
#[derive(Debug)]
pub enum Fetched {
    /// The source is still at the version loaded.
    Unchanged,
    /// Nothing new to say yet (a registry pull is under way, or not due).
    Pending,
    /// The module's bytes (gunzipped, pin checked) and their version.
    Module {
        /// The component, shared with every controller reading the same version of it.
        bytes: ModuleBytes,
        /// Where they came from.
        version: Version,
    },
}

/// What an origin found of an object a source names.
#[derive(Debug)]
pub enum Found<T> {
    /// Still at the version loaded: not read again.
    Unchanged,
    /// Nothing new to say yet.
    Pending,
    /// The object, at this version.
    At(T, Version),
}

/// Where the objects and files a source names are read from.
pub trait Origin: Sync {
    /// ConfigMap `namespace/name` (whose key `key` holds the module), unless it is still at
    /// `known`.
    fn config_map(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        known: Option<&Version>,
    ) -> impl Future<Output = Result<Found<ConfigMap>, ModuleError>> + Send;

    /// The version ConfigMap `namespace/name` is at as far as the origin knows without
    /// reading it (the runtime's metadata watch), to share one read of it; `None`: unknown.
    fn config_map_seen(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<Option<Version>, ModuleError>;

    /// The reads in flight: the budget they are charged to, the reads shared.
    fn reads(&self) -> &ModuleReads;

    /// The raw bytes of a module file.
    fn file(&self, path: &str) -> impl Future<Output = Result<Vec<u8>, ModuleError>> + Send;

    /// Whether an error may name the digest of a file's bytes (not of the runtime's own
    /// files: a tenant's status must not learn what an operator's file holds).
    fn shows_file_digests(&self) -> bool;

    /// The module of `image` (with the credentials of Secret `pull_secret`, read as the
    /// controller's ServiceAccount), unless it still resolves to `known`.
    fn image(
        &self,
        image: &ImageRef,
        pull_secret: Option<&str>,
        known: Option<&Version>,
    ) -> impl Future<Output = Result<Found<ModuleBytes>, ModuleError>> + Send;

    /// The most bytes a module may have.
    fn max_module_bytes(&self) -> u64;
}

/// The module `source` names, through `origin`: its bytes (gunzipped off the async workers,
/// checked against `pin`) and their version, or [`Fetched::Unchanged`] when the source is
/// still at `known`. Every byte is charged to the origin's read budget, and a ConfigMap's
/// version (or a gzipped image's digest) is read once for all the controllers naming it
/// ([`ModuleReads::shared`]).
pub async fn fetch(
    origin: &impl Origin,
    source: &Source,
    pin: Option<&str>,
    known: Option<&Version>,
) -> Result<Fetched, ModuleError> {
    let max = origin.max_module_bytes();
    let reads = origin.reads();
    let (module, version, show_digest) = match source {
        Source::ConfigMap {
            namespace,
            name,
            key,
        } => {
            let seen = origin.config_map_seen(namespace, name, key)?;
            if seen.is_some() && seen.as_ref() == known {
                return Ok(Fetched::Unchanged);
            }
            let read = || read_config_map(origin, namespace, name, key);
            let (module, version) = match seen {
                Some(seen) => {
                    let key = ReadKey::ConfigMap {
                        config_map: format!("{namespace}/{name}"),
                        key: key.clone(),
                        version: format!("{seen:?}"),
                    };
                    reads.shared(key, read).await?
                }
                None => read().await?,
            };
            (module, version, true)
        }
        Source::File { path } => {
            let raw = origin.file(path).await?;
            let module = unpacked(raw, reads.budget().empty(), max).await?;
            let version = Version::Digest(module.digest());
            (module, version, origin.shows_file_digests())
        }
        Source::Oci { image, pull_secret } => {
            match origin.image(image, pull_secret.as_deref(), known).await? {
                Found::Unchanged => return Ok(Fetched::Unchanged),
                Found::Pending => return Ok(Fetched::Pending),
                Found::At(layer, version) if is_gzip(&layer) => {
                    let key = ReadKey::Image(format!("{version:?}"));
                    let inflate = || async {
                        match inflated(layer, reads.budget(), max).await {
                            Ok(module) => Ok((module, version)),
                            Err(e) => Err(e.at(&version)),
                        }
                    };
                    let (module, version) = reads.shared(key, inflate).await?;
                    (module, version, true)
                }
                Found::At(layer, version) => (layer, version, true),
            }
        }
    };
    check_pin(module.digest(), pin, show_digest)?;
    if known == Some(&version) {
        return Ok(Fetched::Unchanged);
    }
    Ok(Fetched::Module {
        bytes: module,
        version,
    })
}

/// The module under `key` of ConfigMap `namespace/name`, read now, and the version read.
async fn read_config_map(
    origin: &impl Origin,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<(ModuleBytes, Version), ModuleError> {
    let charge = origin
        .reads()
        .budget()
        .charge(CONFIG_MAP_READ_BYTES)
        .await?;
    let (config_map, version) = match origin.config_map(namespace, name, key, None).await? {
        Found::At(config_map, version) => (config_map, version),
        Found::Unchanged | Found::Pending => {
            return Err(ModuleError::Unreachable(format!(
                "ConfigMap {namespace}/{name} was not read; retrying"
            )));
        }
    };
    let raw = take_key(config_map, key)?;
    let module = unpacked(raw, charge, origin.max_module_bytes())
        .await
        .map_err(|e| e.at(&version))?;
    Ok((module, version))
}

/// `raw`, gunzipped when it is gzip, as shared bytes under `charge`: resized first to all
/// they may come to (`raw` and the bound of what it inflates to), settled after to what they
/// came to.
async fn unpacked(raw: Vec<u8>, mut charge: Charge, max: u64) -> Result<ModuleBytes, ModuleError> {
    let size = raw.len() as u64;
    if !is_gzip(&raw) {
        charge.resize(size).await?;
        return blocking(move || Ok(ModuleBytes::new(raw, charge))).await;
    }
    charge
        .resize(size.saturating_add(inflate_bound(raw.len(), max)))
        .await?;
    blocking(move || {
        let out = gunzip(&raw, max)?;
        drop(raw);
        Ok(ModuleBytes::new(out, charge))
    })
    .await
}

/// A pulled layer (charged by its pull), gunzipped when it is gzip.
async fn inflated(
    layer: ModuleBytes,
    budget: &ReadBudget,
    max: u64,
) -> Result<ModuleBytes, ModuleError> {
    if !is_gzip(&layer) {
        return Ok(layer);
    }
    let charge = budget.charge(inflate_bound(layer.len(), max)).await?;
    blocking(move || Ok(ModuleBytes::new(gunzip(&layer, max)?, charge))).await
}

/// `work` off the async workers (it hashes or inflates up to a module's size).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ModuleError> + Send + 'static,
) -> Result<T, ModuleError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ModuleError::Unreachable(format!("unpacking the module failed: {e}")))?
}
