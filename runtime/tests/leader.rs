//! Leader election over a real API server: one holder at a time, takeover after release or
//! expiry, and two `kubewasm run --leader-elect` replicas of which only one leads. All of it as
//! the runtime's own ServiceAccount, whose Lease rights are in its namespace only; each test
//! names its Lease after a namespace of its own, so that tests do not share one.

use kubewasm_test_support as support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kubewasm::controller::LeaderElector;
use support::{ControlPlane, RUNTIME_NAMESPACE, eventually};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn one_holder_at_a_time_and_takeover_after_release_or_expiry() -> Result<()> {
    let cp = ControlPlane::shared();
    let lease = cp.namespace("leader").await?;
    let client = cp.runtime_client().await?;
    let elector = |id| {
        LeaderElector::new(
            client.clone(),
            RUNTIME_NAMESPACE,
            &lease,
            id,
            Duration::from_secs(3),
        )
    };
    let (a, b) = (elector("a"), elector("b"));

    assert!(
        a.try_acquire_or_renew().await?,
        "a should take the free lease"
    );
    assert!(
        !b.try_acquire_or_renew().await?,
        "b must not take a lease a holds"
    );
    assert!(
        a.try_acquire_or_renew().await?,
        "a should renew its own lease"
    );

    a.release().await?;
    assert!(
        b.try_acquire_or_renew().await?,
        "b should take the lease a released"
    );
    assert!(
        !a.try_acquire_or_renew().await?,
        "a must not take the lease back while b holds it"
    );

    // b stops renewing: after the lease duration, a may take over.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        a.try_acquire_or_renew().await?,
        "a should take the lease b let expire"
    );
    let lease = Api::<Lease>::namespaced(client, RUNTIME_NAMESPACE)
        .get(&lease)
        .await?;
    let spec = lease.spec.context("lease has a spec")?;
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(spec.lease_transitions, Some(2));
    Ok(())
}

struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `kubewasm run` hosting namespace `ns`, electing its leader with Lease
/// `kubewasm-system/<ns>`.
fn replica(cp: &ControlPlane, ns: &str, log: &std::path::Path) -> Result<Replica> {
    let log = std::fs::File::create(log)?;
    let child = Command::new(env!("CARGO_BIN_EXE_kubewasm"))
        .args(["run", "--namespace", ns, "--leader-elect"])
        .args(["--leader-election-namespace", RUNTIME_NAMESPACE])
        .args(["--leader-election-id", ns])
        .args(["--lease-duration-seconds", "3"])
        .env("KUBECONFIG", cp.runtime_kubeconfig())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting kubewasm run")?;
    Ok(Replica(child))
}

async fn holder(api: &Api<Lease>, name: &str) -> Result<Option<String>> {
    Ok(api
        .get_opt(name)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

#[tokio::test]
async fn two_replicas_one_leader_and_the_standby_takes_over() -> Result<()> {
    let cp = ControlPlane::shared();
    let ns = cp.namespace("replicas").await?;
    let leases = Api::<Lease>::namespaced(cp.client().await?, RUNTIME_NAMESPACE);
    let dir = tempfile::tempdir()?;
    let mut first = replica(cp, &ns, &dir.path().join("first.log"))?;
    let first_id = format!("-{}", first.0.id());
    eventually("the first replica becoming the leader", WAIT, || async {
        Ok(holder(&leases, &ns)
            .await?
            .filter(|h| h.ends_with(&first_id)))
    })
    .await?;
    let second = replica(cp, &ns, &dir.path().join("second.log"))?;
    let second_id = format!("-{}", second.0.id());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let now = holder(&leases, &ns).await?.unwrap_or_default();
    assert!(
        now.ends_with(&first_id),
        "the standby must not take a renewed lease (holder: {now})"
    );
    let second_log = std::fs::read_to_string(dir.path().join("second.log"))?;
    assert!(
        second_log.contains("waiting to become the leader"),
        "{second_log}"
    );
    assert!(
        !second_log.contains("kubewasm runtime started"),
        "the standby started acting:\n{second_log}"
    );

    // SIGTERM the leader: it stops its controllers and releases the lease.
    Command::new("kill")
        .arg(first.0.id().to_string())
        .status()?;
    let status = first.0.wait()?;
    assert!(
        status.success(),
        "the leader should exit cleanly on SIGTERM: {status}"
    );
    eventually("the standby taking over the lease", WAIT, || async {
        Ok(holder(&leases, &ns)
            .await?
            .filter(|h| h.ends_with(&second_id)))
    })
    .await?;
    eventually("the new leader starting its controllers", WAIT, || async {
        let log = std::fs::read_to_string(dir.path().join("second.log"))?;
        Ok(log.contains("kubewasm runtime started").then_some(()))
    })
    .await?;
    drop(second);
    Ok(())
}
