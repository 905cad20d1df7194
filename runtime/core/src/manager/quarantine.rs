//! Modules whose compile ended the compiler: a module that crashed the compiler process or
//! met one of its limits (memory, CPU time, see `sandbox::ChildCompiler`) would do it again
//! every time, so its digest is quarantined — its controllers are `ModuleReady=False`,
//! `Quarantined`, with what the compile did, until their module changes (another digest) —
//! and kept in the cluster, so that no other replica, and no later start, compiles it again.
//!
//! Compiles run in a child process of their own, one at a time, so the one that ended names
//! its own module and no other: a bystander's module is never quarantined for another's. The
//! runtime itself never compiles, so a runtime that stops (an OOM kill, a node gone) says
//! nothing about the module it was waiting for, and nothing is quarantined for it.
//!
//! Kept in ConfigMap `kubewasm-quarantine` of the runtime's own namespace
//! (`--quarantine-namespace`, the Pod's by default) under `quarantined.<hex>`, with what
//! happened; an admin lifts it by deleting the key (after raising the limit the module met,
//! say). Best effort: a write that fails is logged and this replica remembers the digest
//! until it restarts, as it does without `--quarantine-namespace`. Keys `compiling…` that
//! earlier versions wrote (they compiled in process and journaled each compile) are ignored.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The quarantine's ConfigMap, in the runtime's own namespace.
pub const QUARANTINE_CONFIG_MAP: &str = "kubewasm-quarantine";

/// The prefix of a quarantined digest's key.
const QUARANTINED: &str = "quarantined.";

/// The quarantined digests, and where they are kept.
pub(super) struct Quarantine {
    /// The ConfigMap's API and namespace; `None`: kept in this replica only.
    api: Option<(Api<ConfigMap>, String)>,
    /// Digest hex -> what happened.
    quarantined: BTreeMap<String, String>,
}

impl Quarantine {
    /// Kept in this replica only (`--quarantine-namespace` unset).
    pub(super) fn off() -> Self {
        Quarantine {
            api: None,
            quarantined: BTreeMap::new(),
        }
    }

    /// The quarantine kept in `namespace`, as read now.
    pub(super) async fn load(client: Client, namespace: &str) -> Self {
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let data = match api.get_opt(QUARANTINE_CONFIG_MAP).await {
            Ok(found) => found.and_then(|c| c.data).unwrap_or_default(),
            Err(e) => {
                tracing::warn!(
                    "cannot read the module quarantine ({namespace}/{QUARANTINE_CONFIG_MAP}): {e}; modules that crashed a compile are not known"
                );
                BTreeMap::new()
            }
        };
        Quarantine {
            api: Some((api, namespace.to_owned())),
            quarantined: quarantined(&data),
        }
    }

    /// How many modules are quarantined.
    pub(super) fn len(&self) -> usize {
        self.quarantined.len()
    }

    /// Why the module of this digest is quarantined, if it is.
    pub(super) fn why(&self, hex: &str) -> Option<&str> {
        self.quarantined.get(hex).map(String::as_str)
    }

    /// Quarantines the module of digest `hex`, whose compile `ended` (the compiler's words:
    /// how it ended and the limit it met); returns why, as its controllers' status says it.
    pub(super) async fn record(&mut self, hex: &str, ended: &str) -> String {
        let lift = match &self.api {
            Some((_, namespace)) => format!(
                "or, if the module was not the cause (a limit too low for it, since raised), delete the key {QUARANTINED}{hex} of ConfigMap {namespace}/{QUARANTINE_CONFIG_MAP}"
            ),
            None => "or, if the module was not the cause, restart the runtime".to_owned(),
        };
        let why = format!(
            "{ended}: module sha256:{hex} is quarantined and not compiled again: change the module (another digest), {lift}"
        );
        tracing::warn!(digest = %hex, "quarantining a module whose compile ended the compiler: {ended}");
        self.write(json!({ format!("{QUARANTINED}{hex}"): why.clone() }))
            .await;
        self.quarantined.insert(hex.to_owned(), why.clone());
        why
    }

    /// A JSON merge patch of the journal's data (`null` removes a key); the ConfigMap is made
    /// when missing. Failures are logged.
    async fn write(&self, data: serde_json::Value) {
        let Some((api, _)) = &self.api else { return };
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
                "cannot write the module quarantine ({QUARANTINE_CONFIG_MAP}): {e}; this replica remembers it until it restarts"
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
            (
                "compiling.pod-1".to_owned(),
                format!("{} 1", "cd".repeat(32)),
            ),
        ]);
        let found = quarantined(&data);
        assert_eq!(found, BTreeMap::from([(hex, "crashed".to_owned())]));
    }

    #[tokio::test]
    async fn a_recorded_module_is_quarantined_with_what_its_compile_did() {
        let mut q = Quarantine::off();
        let hex = "ef".repeat(32);
        let why = q
            .record(&hex, "compiling the module needed more than the 64 MiB")
            .await;
        assert_eq!(q.why(&hex), Some(why.as_str()));
        assert!(
            why.starts_with("compiling the module needed more than the 64 MiB: module sha256:")
        );
        assert!(why.contains("change the module"), "{why}");
        assert_eq!(q.why(&"ab".repeat(32)), None, "no other module");
    }
}
