//! `spec.rollout.promoteAfter`: a candidate compared that many times with no difference is
//! promoted by the runtime, as the controller's own ServiceAccount (its RBAC decides whether
//! it may change its WasmController), with the patch `kubewasm rollout promote` sends
//! ([`crate::api::rollout::promotion`]). Tried once per declaration: the promoted spec is a new
//! declaration; a refusal stays in `status.rollout.problem` until the spec changes.

use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Patch, PatchParams};

use crate::api::{ClusterWasmController, WasmController, rollout};

use super::{ControllerId, Manager};

/// How long one promotion's patch may take (those due are sent side by side).
const PROMOTION_TIMEOUT: Duration = Duration::from_secs(5);

impl Manager {
    /// Promotes every candidate whose controller's policy says it is due.
    pub(super) async fn promote_due(&mut self) {
        let due: Vec<_> = self
            .controllers
            .iter()
            .filter(|(_, m)| m.promotion.is_none())
            .filter_map(|(id, m)| {
                let after = m.plan.rollout.promote_after?;
                let shadow = m.life.runner()?.shadow();
                let (compared, differing) = shadow.counts();
                if compared < u64::from(after) || differing > 0 {
                    return None;
                }
                let digest = shadow.candidate()?.to_string();
                let patch = rollout::promotion(&m.spec, &digest, None);
                Some((id.clone(), patch, m.plan.account.clone(), digest, compared))
            })
            .collect();
        // Side by side, each bounded in time: a tenant's promotion may not hold the loop that
        // starts, stops and reports every tenant's controllers.
        let this = &*self;
        let sent: Vec<_> = futures::stream::iter(due)
            .map(|(id, patch, account, digest, compared)| async move {
                let result = match (patch, account) {
                    (Ok(patch), Ok((namespace, name))) => {
                        let send = this.send_promotion(&id, &patch, &namespace, &name);
                        tokio::time::timeout(PROMOTION_TIMEOUT, send)
                            .await
                            .unwrap_or_else(|_| {
                                Err(format!(
                                    "the API server did not answer the patch within {}s; tried again when the spec changes, or promote with `kubewasm rollout promote`",
                                    PROMOTION_TIMEOUT.as_secs()
                                ))
                            })
                    }
                    (Err(why), _) | (_, Err(why)) => Err(why),
                };
                (id, digest, compared, result)
            })
            .buffer_unordered(super::PARALLEL_STARTS)
            .collect()
            .await;
        for (id, digest, compared, result) in sent {
            match &result {
                Ok(()) => {
                    tracing::info!(controller = %id, candidate = %digest, compared, "candidate promoted (spec.rollout.promoteAfter): compared with no difference")
                }
                Err(why) => {
                    tracing::warn!(controller = %id, candidate = %digest, "candidate not promoted: {why}")
                }
            }
            if let Some(m) = self.controllers.get_mut(&id) {
                m.promotion = Some(result);
            }
        }
    }

    /// Sends `patch` to controller `id` as ServiceAccount `namespace/name`.
    async fn send_promotion(
        &self,
        id: &ControllerId,
        patch: &serde_json::Value,
        namespace: &str,
        name: &str,
    ) -> Result<(), String> {
        let client = self
            .impersonating(namespace, name)
            .map_err(|e| e.to_string())?;
        let params = PatchParams::default();
        let sent = match &id.namespace {
            Some(ns) => kube::Api::<WasmController>::namespaced(client, ns)
                .patch(&id.name, &params, &Patch::Merge(patch))
                .await
                .map(drop),
            None => kube::Api::<ClusterWasmController>::all(client)
                .patch(&id.name, &params, &Patch::Merge(patch))
                .await
                .map(drop),
        };
        sent.map_err(|e| match e {
            kube::Error::Api(s) if s.code == 403 => format!(
                "ServiceAccount {namespace}/{name} may not patch this controller ({}): grant it `patch` on it, or promote by hand with `kubewasm rollout promote`",
                s.message
            ),
            e => e.to_string(),
        })
    }
}
