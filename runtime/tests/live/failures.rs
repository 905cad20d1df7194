//! The SDK's contract for errors, live: a guest's permanent error is recorded in the status
//! and not retried — not by backoff, not by a resync — until the object (or the module)
//! changes; a change then calls the guest again, and a success clears `lastError`. While an
//! object fails, `Ready` is False (what `kubectl get wc` shows) and `Degraded` True, however
//! many other objects succeed after it.

use std::time::Duration;

use anyhow::{Result, ensure};
use kube::Client;
use serde_json::json;

use crate::cluster::{
    apply, controller_status, ensure_condition, guest, module_config_map, prepare, wait_status,
};
use crate::isolation::{controller, install_probe_crd, install_tenant, probe, probes};
use crate::merge;
use crate::runtime::{RuntimeProcess, finish};

#[tokio::test]
async fn a_permanent_error_is_not_retried_until_the_object_changes() {
    let control_plane = crate::support::ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "permanent").await;
    // A resync every 2 s: a permanent error must not be retried by it either.
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = permanent(&client, &ns).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn permanent(client: &Client, ns: &str) -> Result<()> {
    install_probe_crd(client).await?;
    install_tenant(client, ns, "secret", "config").await?;
    apply(
        client,
        &module_config_map(ns, "hostile", "hostile.wasm", &guest("hostile")),
    )
    .await?;
    let spec = json!({"module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
        "resyncPeriodSeconds": 2});
    apply(client, &controller(ns, "refuser", spec)).await?;
    apply(
        client,
        &probe(ns, "refused", "refuser", json!({"mode": "error"})),
    )
    .await?;
    // Another object that succeeds, reconciled after the failure: it must not hide it.
    apply(
        client,
        &probe(
            ns,
            "fine",
            "refuser",
            json!({"mode": "compute", "rounds": 1}),
        ),
    )
    .await?;
    let failed = wait_status(
        client,
        ns,
        "refuser",
        "the permanent error in the status, Ready=False and Degraded=True",
        |s| {
            ensure!(
                s.failures >= 1
                    && s.reconciles > s.failures
                    && s.last_error
                        .as_deref()
                        .is_some_and(|e| e.contains("hostile guest refuses")),
                "reconciles {}, failures {}, lastError {:?}",
                s.reconciles,
                s.failures,
                s.last_error
            );
            for type_ in ["Ready", "Degraded"] {
                let want = if type_ == "Ready" { "False" } else { "True" };
                let c = ensure_condition(s, type_, want)?;
                ensure!(
                    c.reason == "ReconcileFailed" && c.message.contains("hostile guest refuses"),
                    "{type_} says {}: {}",
                    c.reason,
                    c.message
                );
            }
            Ok(())
        },
    )
    .await?;
    // Backoff would have called it again at 0.5, 1, 2 and 4 s; the resync every 2 s.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let later = controller_status(client, ns, "refuser").await?;
    // (The other object is resynced meanwhile: a retry shows as a failure, not a reconcile.)
    ensure!(
        later.failures == failed.failures && later.reconciles > failed.reconciles,
        "a permanent error was retried, or the resync stopped: {} reconciles, {} failures, then {} and {}",
        failed.reconciles,
        failed.failures,
        later.reconciles,
        later.failures
    );
    // The object changes: called again, succeeds, and the last error is gone.
    probes(client, ns)
        .patch(
            "refused",
            &Default::default(),
            &merge(json!({"spec": {"mode": "compute", "rounds": 1}})),
        )
        .await?;
    wait_status(client, ns, "refuser", "a success after the change", |s| {
        ensure!(
            s.reconciles > later.reconciles && s.last_error.is_none(),
            "reconciles {}, lastError {:?}",
            s.reconciles,
            s.last_error
        );
        ensure_condition(s, "Ready", "True")?;
        ensure_condition(s, "Degraded", "False")?;
        Ok(())
    })
    .await?;
    Ok(())
}
