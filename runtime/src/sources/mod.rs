//! Modules from where a controller says they are: one seam for every source.
//!
//! A spec's module is parsed once into an [`api::Source`](crate::api::Source); [`fetch`] is
//! the one place that dispatches on it, and asks an [`Origin`] for what the source names: the
//! cluster for the runtime ([`ClusterOrigin`]), the user's files and `--state` for
//! `kubewasm reconcile` ([`OfflineOrigin`]). It returns the module's bytes (gunzipped,
//! checked against the spec's pin) and the [`Version`] they came from, or says that the
//! version already loaded is still current. Registries are asked beside the manager loop
//! ([`Pulls`]): their answer may be "nothing yet" ([`Fetched::Pending`]). A new kind of source adds a variant to `Source`,
//! a method to `Origin` and an arm to `fetch`: the compiler names every origin that lacks it.

mod bytes;
mod capped;
mod cluster;
pub mod cosign;
mod module_cache;
pub mod oci;
mod offline;
mod pulls;
mod registry_http;

use std::future::Future;

use k8s_openapi::api::core::v1::ConfigMap;

use crate::api::{ImageRef, Source};
use crate::sandbox::Digest;

pub use bytes::{
    DEFAULT_MAX_MODULE_BYTES, ModuleError, bytes_from_configmap, read_module_file, unpack,
};
pub use cluster::{ClusterOrigin, ImagePuller};
pub use module_cache::ModuleCache;
pub use offline::OfflineOrigin;
pub use pulls::{Credentials, PARALLEL_PULLS, Pulls};

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
        /// The component.
        bytes: Vec<u8>,
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
    ) -> impl Future<Output = Result<Found<Vec<u8>>, ModuleError>> + Send;

    /// The most bytes a module may have.
    fn max_module_bytes(&self) -> u64;
}

/// The module `source` names, through `origin`: its bytes (gunzipped off the async workers,
/// checked against `pin`) and their version, or [`Fetched::Unchanged`] when the source is
/// still at `known`.
pub async fn fetch(
    origin: &impl Origin,
    source: &Source,
    pin: Option<&str>,
    known: Option<&Version>,
) -> Result<Fetched, ModuleError> {
    let (raw, version, show_digest) = match source {
        Source::ConfigMap {
            namespace,
            name,
            key,
        } => match origin.config_map(namespace, name, key, known).await? {
            Found::Unchanged => return Ok(Fetched::Unchanged),
            Found::Pending => return Ok(Fetched::Pending),
            Found::At(config_map, version) => {
                (bytes_from_configmap(&config_map, key)?, Some(version), true)
            }
        },
        Source::File { path } => (origin.file(path).await?, None, origin.shows_file_digests()),
        Source::Oci { image, pull_secret } => {
            match origin.image(image, pull_secret.as_deref(), known).await? {
                Found::Unchanged => return Ok(Fetched::Unchanged),
                Found::Pending => return Ok(Fetched::Pending),
                Found::At(bytes, version) => (bytes, Some(version), true),
            }
        }
    };
    let pin = pin.map(str::to_owned);
    let max = origin.max_module_bytes();
    let bytes = tokio::task::spawn_blocking(move || unpack(raw, pin.as_deref(), show_digest, max))
        .await
        .map_err(|e| ModuleError::Unreachable(format!("unpacking the module failed: {e}")))??;
    let version = version.unwrap_or_else(|| Version::Digest(Digest::of(&bytes)));
    if known == Some(&version) {
        return Ok(Fetched::Unchanged);
    }
    Ok(Fetched::Module { bytes, version })
}
