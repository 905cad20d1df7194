//! Modules that took the runtime down: a journal, kept in the cluster, of the module being
//! compiled, so that the next start — of this replica or another — knows which module it was
//! and does not compile it again.
//!
//! With no panic reachable from a tenant's input and every wait bounded, what is left that can
//! end the process is the compiler on a crafted module (a crash, or memory past the
//! container's limit and an OOM kill). Compiles run one at a time (the sandbox's compile
//! lock), so one journal entry names the culprit exactly: before a new digest is compiled its
//! hex is written under `compiling` in ConfigMap `kubewasm-quarantine` of the runtime's own
//! namespace (`--quarantine-namespace`, the Pod's by default), and removed once the compile
//! returned. A start that finds `compiling` set moves it to `quarantined.<hex>` with what
//! happened; controllers of that module are `ModuleReady=False`, `Quarantined`, until their
//! module changes (another digest). An admin lifts it by deleting the key.
//!
//! The journal is best effort: a write that fails is logged and the compile goes on, so a
//! runtime without the rights (or an API server that does not answer) still hosts
//! controllers, only without this protection.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The journal's ConfigMap, in the runtime's own namespace.
pub const QUARANTINE_CONFIG_MAP: &str = "kubewasm-quarantine";

/// The key naming the digest being compiled.
const COMPILING: &str = "compiling";

/// The prefix of a quarantined digest's key.
const QUARANTINED: &str = "quarantined.";

/// The journal, and the digests it quarantines.
pub(super) struct Quarantine {
    api: Option<Api<ConfigMap>>,
    /// Digest hex -> what happened.
    quarantined: BTreeMap<String, String>,
    /// One journaled compile at a time (they run one at a time anyway).
    compiling: tokio::sync::Mutex<()>,
}

impl Quarantine {
    /// No journal (`--quarantine-namespace` unset): nothing is recorded or quarantined.
    pub(super) fn off() -> Self {
        Quarantine {
            api: None,
            quarantined: BTreeMap::new(),
            compiling: tokio::sync::Mutex::new(()),
        }
    }

    /// Reads the journal of `namespace`: a compile the last runtime did not finish becomes a
    /// quarantined digest.
    pub(super) async fn load(client: Client, namespace: &str) -> Self {
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let data = match api.get_opt(QUARANTINE_CONFIG_MAP).await {
            Ok(found) => found.and_then(|c| c.data).unwrap_or_default(),
            Err(e) => {
                tracing::warn!(
                    "cannot read the module quarantine ({namespace}/{QUARANTINE_CONFIG_MAP}): {e}; modules that crashed a runtime are not known"
                );
                BTreeMap::new()
            }
        };
        let mut quarantine = Quarantine {
            api: Some(api),
            quarantined: quarantined(&data),
            compiling: tokio::sync::Mutex::new(()),
        };
        if let Some(hex) = data.get(COMPILING).filter(|h| is_digest_hex(h)) {
            let why = format!(
                "a kubewasm runtime stopped (crashed, or was killed, e.g. past its memory limit) while compiling module sha256:{hex}, and it is not compiled again: change the module (another digest), or, if the module was not the cause, delete the key {QUARANTINED}{hex} of ConfigMap {namespace}/{QUARANTINE_CONFIG_MAP}"
            );
            tracing::warn!(digest = %hex, "quarantining the module whose compile the last runtime did not finish");
            quarantine
                .write(json!({
                    COMPILING: null,
                    format!("{QUARANTINED}{hex}"): why.clone(),
                }))
                .await;
            quarantine.quarantined.insert(hex.clone(), why);
        }
        quarantine
    }

    /// Why the module of this digest is quarantined, if it is.
    pub(super) fn why(&self, hex: &str) -> Option<&str> {
        self.quarantined.get(hex).map(String::as_str)
    }

    /// Starts `compile` once the digest is in the journal, and takes it out once it returned.
    pub(super) async fn compiling<F: std::future::Future>(
        &self,
        hex: &str,
        compile: impl FnOnce() -> F,
    ) -> F::Output {
        if self.api.is_none() {
            return compile().await;
        }
        let _one = self.compiling.lock().await;
        self.write(json!({ COMPILING: hex })).await;
        let compiled = compile().await;
        self.write(json!({ COMPILING: null })).await;
        compiled
    }

    /// A JSON merge patch of the journal's data (`null` removes a key); the ConfigMap is made
    /// when missing. Failures are logged.
    async fn write(&self, data: serde_json::Value) {
        let Some(api) = &self.api else { return };
        let patch = Patch::Merge(json!({ "data": data }));
        let written = match api
            .patch(QUARANTINE_CONFIG_MAP, &PatchParams::default(), &patch)
            .await
        {
            Err(kube::Error::Api(status)) if status.code == 404 => {
                let entries = data
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect();
                let journal = ConfigMap {
                    metadata: kube::api::ObjectMeta {
                        name: Some(QUARANTINE_CONFIG_MAP.to_owned()),
                        ..Default::default()
                    },
                    data: Some(entries),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &journal).await.map(drop)
            }
            other => other.map(drop),
        };
        if let Err(e) = written {
            tracing::warn!(
                "cannot write the module quarantine ({QUARANTINE_CONFIG_MAP}): {e}; compiling without it"
            );
        }
    }
}

/// The quarantined digests of a journal's data.
fn quarantined(data: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    data.iter()
        .filter_map(|(key, why)| {
            let hex = key.strip_prefix(QUARANTINED)?;
            is_digest_hex(hex).then(|| (hex.to_owned(), why.clone()))
        })
        .collect()
}

fn is_digest_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantined_digests_are_read_from_their_keys_only() {
        let hex = "ab".repeat(32);
        let data = BTreeMap::from([
            (format!("{QUARANTINED}{hex}"), "crashed".to_owned()),
            (format!("{QUARANTINED}not-a-digest"), "x".to_owned()),
            (COMPILING.to_owned(), "cd".repeat(32)),
        ]);
        let found = quarantined(&data);
        assert_eq!(found, BTreeMap::from([(hex, "crashed".to_owned())]));
    }
}
