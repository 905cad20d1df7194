//! The runtime's origin: module ConfigMaps read from the cluster, files from the operator's
//! `--module-dir`, images from registries (pulled beside the manager: [`super::Pulls`]).
//!
//! Module ConfigMaps are watched by their metadata only (see `manager::modules`): a copy of
//! every ConfigMap's bytes in memory would be most of the runtime's memory. A ConfigMap's
//! bytes are read — listed by name, as the runtime may list ConfigMaps but not get them —
//! only when its uid or resourceVersion is not the one the loaded module came from.

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, PartialObjectMeta, VersionMatch};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};

use super::oci::{PullError, Pulled};
use super::pulls::{Credentials, Polled, Pulls};
use super::{Found, ModuleBytes, ModuleError, ModuleReads, Origin, Version, read_module_file};
use kubewasm_api::ImageRef;

/// Module sources as the runtime reads them.
pub struct ClusterOrigin {
    client: Client,
    /// The metadata of the ConfigMaps modules may come from.
    config_maps: Option<Store<PartialObjectMeta<ConfigMap>>>,
    module_dir: Option<PathBuf>,
    max_module_bytes: u64,
    puller: Option<ImagePuller>,
    reads: Arc<ModuleReads>,
}

/// Pulls for one controller.
pub struct ImagePuller {
    /// The runtime's pulls.
    pub pulls: Arc<Pulls>,
    /// The controller (its slot in `pulls`).
    pub key: String,
    /// Its ServiceAccount (namespace, name) and a client acting as it, for a pull secret.
    pub account: Option<(String, String, Client)>,
}

impl ClusterOrigin {
    /// Reads ConfigMaps with `client`, knowing them from `config_maps`; files only under
    /// `module_dir`; every read charged to and shared through `reads`.
    pub fn new(
        client: Client,
        config_maps: Option<Store<PartialObjectMeta<ConfigMap>>>,
        module_dir: Option<PathBuf>,
        max_module_bytes: u64,
        reads: Arc<ModuleReads>,
    ) -> Self {
        ClusterOrigin {
            client,
            config_maps,
            module_dir,
            max_module_bytes,
            puller: None,
            reads,
        }
    }

    /// The metadata the watch saw of ConfigMap `namespace/name`.
    fn seen(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<Arc<PartialObjectMeta<ConfigMap>>, ModuleError> {
        self.config_maps
            .as_ref()
            .ok_or_else(|| ModuleError::Unreachable("no ConfigMap cache".into()))?
            .get(&ObjectRef::new(name).within(namespace))
            .ok_or_else(|| ModuleError::NoConfigMap {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                key: key.to_owned(),
            })
    }

    /// Pulls images with `puller`.
    #[must_use]
    pub fn with_puller(mut self, puller: ImagePuller) -> Self {
        self.puller = Some(puller);
        self
    }

    /// ConfigMap `namespace/name`, listed by name. With `seen` (the resourceVersion the
    /// metadata watch saw), any version at least as new will do, which the API server answers
    /// from its watch cache instead of reading etcd: a thousand controllers starting read a
    /// thousand modules at once.
    async fn list(
        &self,
        namespace: &str,
        name: &str,
        seen: Option<&str>,
    ) -> Result<Option<ConfigMap>, ModuleError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        self.reads.count_config_map_read();
        let mut by_name = ListParams::default().fields(&format!("metadata.name={name}"));
        if let Some(version) = seen {
            by_name = by_name.at(version).matching(VersionMatch::NotOlderThan);
        }
        let found = api.list(&by_name).await.map_err(|e| {
            ModuleError::Unreachable(format!("cannot read ConfigMap {namespace}/{name}: {e}"))
        })?;
        // Only the object of that name, whatever the field selector made of the spec's name.
        Ok(found
            .items
            .into_iter()
            .find(|c| c.metadata.name.as_deref() == Some(name)))
    }
}

impl Origin for ClusterOrigin {
    async fn config_map(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        known: Option<&Version>,
    ) -> Result<Found<ConfigMap>, ModuleError> {
        // The name becomes a field selector: parsed before it is sent.
        kubewasm_guest_sdk::query::validate_dns_subdomain(name)
            .map_err(|e| ModuleError::InvalidSpec(format!("spec.module.configMap.name: {e}")))?;
        let missing = || ModuleError::NoConfigMap {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            key: key.to_owned(),
        };
        let seen = self.seen(namespace, name, key)?;
        if known == Some(&Version::of(&seen.metadata)) {
            return Ok(Found::Unchanged);
        }
        let config_map = self
            .list(namespace, name, seen.metadata.resource_version.as_deref())
            .await?
            .ok_or_else(missing)?;
        let version = Version::of(&config_map.metadata);
        Ok(Found::At(config_map, version))
    }

    fn config_map_seen(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<Option<Version>, ModuleError> {
        Ok(Some(Version::of(
            &self.seen(namespace, name, key)?.metadata,
        )))
    }

    fn reads(&self) -> &ModuleReads {
        &self.reads
    }

    async fn file(&self, path: &str) -> Result<Vec<u8>, ModuleError> {
        let Some(dir) = self.module_dir.clone() else {
            return Err(ModuleError::NoModuleDir {
                path: path.to_owned(),
            });
        };
        // Off the async workers: a file read can block.
        let path = path.to_owned();
        let max = self.max_module_bytes;
        tokio::task::spawn_blocking(move || read_module_file(&dir, &path, max))
            .await
            .map_err(|e| ModuleError::Unreachable(format!("reading the module file failed: {e}")))?
    }

    fn shows_file_digests(&self) -> bool {
        false
    }

    async fn image(
        &self,
        image: &ImageRef,
        pull_secret: Option<&str>,
        known: Option<&Version>,
    ) -> Result<Found<ModuleBytes>, ModuleError> {
        let Some(puller) = &self.puller else {
            return Err(ModuleError::Unreachable("no registry client".into()));
        };
        let credentials = match (pull_secret, &puller.account) {
            (None, _) => Credentials::Anonymous,
            (Some(name), Some((namespace, account, client))) => Credentials::Secret {
                client: client.clone(),
                namespace: namespace.clone(),
                name: name.to_owned(),
                account: account.clone(),
            },
            (Some(_), None) => {
                return Err(ModuleError::Unreachable(
                    "no client for the controller's ServiceAccount".into(),
                ));
            }
        };
        let known = match known {
            Some(Version::Image(digest)) => Some(digest.as_str()),
            _ => None,
        };
        match puller.pulls.module(&puller.key, image, credentials, known) {
            Polled::Waiting(_) if known.is_some() => Ok(Found::Pending),
            Polled::Waiting(last) => Err(last
                .unwrap_or_else(|| PullError::Pulling {
                    image: image.to_string(),
                })
                .into()),
            Polled::Done(Ok(Pulled::Unchanged)) => Ok(Found::Unchanged),
            Polled::Done(Ok(Pulled::Module { digest, bytes })) => {
                Ok(Found::At(bytes, Version::Image(digest)))
            }
            Polled::Done(Err(e)) => Err(e.into()),
        }
    }

    fn max_module_bytes(&self) -> u64 {
        self.max_module_bytes
    }
}
