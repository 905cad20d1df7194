//! `spec.rollout.promoteAfter`: a candidate compared that many times with no difference is
//! promoted by the runtime, as the controller's own ServiceAccount (its RBAC decides whether
//! it may change its WasmController), with the patch `kubewasm rollout promote` sends
//! ([`crate::api::rollout::promotion`]). Tried once per declaration: the promoted spec is a new
//! declaration; a refusal stays in `status.rollout.problem` until the spec changes.

use kube::api::{Patch, PatchParams};

use crate::api::{ClusterWasmController, WasmController, rollout};

use super::{ControllerId, Manager};

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
        for (id, patch, account, digest, compared) in due {
            let result = match (patch, account) {
                (Ok(patch), Ok((namespace, name))) => {
                    self.send_promotion(&id, &patch, &namespace, &name).await
                }
                (Err(why), _) | (_, Err(why)) => Err(why),
            };
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
