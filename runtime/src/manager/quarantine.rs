//! Modules that took the runtime down: a journal, kept in the cluster, of the module being
//! compiled, so that the next start — of this replica or another — knows which module it was
//! and does not compile it again.
//!
//! With no panic reachable from a tenant's input and every wait bounded, what is left that can
//! end the process is the compiler on a crafted module (a crash, or memory past the
//! container's limit and an OOM kill). Compiles run one at a time in a replica (the sandbox's
//! compile lock), so one journal entry per replica names the culprit exactly: before a new
//! digest is compiled its hex and the time are written under `compiling.<replica>` (the Pod's
//! name, `$HOSTNAME`) in ConfigMap `kubewasm-quarantine` of the runtime's own namespace
//! (`--quarantine-namespace`, the Pod's by default), and removed once the compile returned. A
//! start that finds an entry of its own replica (the container restarted after dying in the
//! compile), or of another replica older than [`STALE_COMPILE`] (a Pod gone while compiling:
//! no compile takes that long), moves it to `quarantined.<hex>` with what happened;
//! controllers of that module are `ModuleReady=False`, `Quarantined`, until their module
//! changes (another digest). An admin lifts it by deleting the key. Another replica's recent
//! entry is a compile going on now — a replica started beside it (a scale-up, a rollout) must
//! not quarantine a healthy module, as one shared `compiling` key made it do. An entry
//! `compiling` without a replica (written by earlier versions) is quarantined at a start.
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

/// The key naming the digest being compiled, by an earlier version (no replica named).
const COMPILING: &str = "compiling";

/// The prefix of the key naming the digest a replica is compiling (`compiling.<replica>`).
const COMPILING_BY: &str = "compiling.";

/// An entry of another replica this old is a compile that will never finish (its replica is
/// gone): quarantined at a start. No module compiles for so long (a 19 MB Python component:
/// under 30 s).
pub const STALE_COMPILE: std::time::Duration = std::time::Duration::from_secs(600);

/// The prefix of a quarantined digest's key.
const QUARANTINED: &str = "quarantined.";

/// The journal, and the digests it quarantines.
pub(super) struct Quarantine {
    api: Option<Api<ConfigMap>>,
    /// Digest hex -> what happened.
    quarantined: BTreeMap<String, String>,
    /// This replica's key: `compiling.<replica>`.
    key: String,
    /// One journaled compile at a time (they run one at a time anyway).
    compiling: tokio::sync::Mutex<()>,
}

impl Quarantine {
    /// No journal (`--quarantine-namespace` unset): nothing is recorded or quarantined.
    pub(super) fn off() -> Self {
        Quarantine {
            api: None,
            quarantined: BTreeMap::new(),
            key: String::new(),
            compiling: tokio::sync::Mutex::new(()),
        }
    }

    /// Reads the journal of `namespace`: a compile this replica's last run, or a replica gone,
    /// did not finish becomes a quarantined digest.
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
        let replica = replica_name();
        let mut quarantine = Quarantine {
            api: Some(api),
            quarantined: quarantined(&data),
            key: format!("{COMPILING_BY}{replica}"),
            compiling: tokio::sync::Mutex::new(()),
        };
        for (key, hex) in unfinished(&data, &replica, now_secs()) {
            let why = format!(
                "a kubewasm runtime stopped (crashed, or was killed, e.g. past its memory limit) while compiling module sha256:{hex}, and it is not compiled again: change the module (another digest), or, if the module was not the cause, delete the key {QUARANTINED}{hex} of ConfigMap {namespace}/{QUARANTINE_CONFIG_MAP}"
            );
            tracing::warn!(digest = %hex, entry = %key, "quarantining the module whose compile a runtime did not finish");
            quarantine
                .write(json!({
                    key: null,
                    format!("{QUARANTINED}{hex}"): why.clone(),
                }))
                .await;
            quarantine.quarantined.insert(hex, why);
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
        let entry = format!("{hex} {}", now_secs());
        self.write(json!({ self.key.as_str(): entry })).await;
        let compiled = compile().await;
        self.write(json!({ self.key.as_str(): null })).await;
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

/// The entries of compiles that will never finish, as (key, digest hex): this replica's own
/// (it died compiling), another replica's older than [`STALE_COMPILE`], and the replica-less
/// entry of earlier versions.
fn unfinished(data: &BTreeMap<String, String>, replica: &str, now: u64) -> Vec<(String, String)> {
    data.iter()
        .filter_map(|(key, value)| {
            let mut fields = value.split_whitespace();
            let hex = fields.next().filter(|h| is_digest_hex(h))?;
            let done = if key == COMPILING {
                true
            } else {
                let by = key.strip_prefix(COMPILING_BY)?;
                let since: u64 = fields.next().and_then(|t| t.parse().ok()).unwrap_or(0);
                by == replica || now.saturating_sub(since) >= STALE_COMPILE.as_secs()
            };
            done.then(|| (key.clone(), hex.to_owned()))
        })
        .collect()
}

/// This replica's name in the journal: the Pod's (`$HOSTNAME`, the same across restarts of
/// its container), else the machine's, as a ConfigMap key allows (`[-._a-zA-Z0-9]`).
fn replica_name() -> String {
    let name = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        .take(200)
        .collect();
    if name.is_empty() {
        "kubewasm".to_owned()
    } else {
        name
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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

    #[test]
    fn a_compile_going_on_in_another_replica_is_not_quarantined() {
        let (a, b, c, d) = (
            "a".repeat(64),
            "b".repeat(64),
            "c".repeat(64),
            "d".repeat(64),
        );
        let now = 1_000_000;
        let stale = now - STALE_COMPILE.as_secs();
        let data = BTreeMap::from([
            // This replica's last run died compiling a.
            (format!("{COMPILING_BY}pod-1"), format!("{a} {}", now - 5)),
            // Another replica is compiling b right now: not touched.
            (format!("{COMPILING_BY}pod-2"), format!("{b} {}", now - 5)),
            // A replica gone while compiling c, long ago.
            (format!("{COMPILING_BY}pod-3"), format!("{c} {stale}")),
            // An earlier version's entry.
            (COMPILING.to_owned(), d.clone()),
            (format!("{COMPILING_BY}pod-4"), "not a digest".to_owned()),
            ("unrelated".to_owned(), a.clone()),
        ]);
        let mut found: Vec<String> = unfinished(&data, "pod-1", now)
            .into_iter()
            .map(|(_, hex)| hex)
            .collect();
        found.sort();
        assert_eq!(found, vec![a.clone(), c.clone(), d.clone()]);
        // Seen from the replica compiling b, b is its own: quarantined.
        let from_2: Vec<String> = unfinished(&data, "pod-2", now)
            .into_iter()
            .map(|(_, hex)| hex)
            .collect();
        assert!(from_2.contains(&b) && !from_2.contains(&a));
    }
}
