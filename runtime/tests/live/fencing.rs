//! A shard that cannot be run twice: two `kubewasm run --leader-elect --shards 1` replicas,
//! and the one holding the shard frozen (SIGSTOP) long enough for its Lease to expire, as a
//! stalled node or a paused container would be. The other takes the shard over and
//! reconciles; when the frozen one wakes, with every task ready at once, it must not start a
//! single reconcile or send a single write, and it says it lost the shard (and goes on, holding
//! none). The audit is each replica's own log of its reconciles and of the writes they made.

use anyhow::{Result, ensure};
use serde_json::json;

use crate::cluster::{WAIT, apply, apply_all, example, guest, module_config_map, prepare};
use crate::runtime::{RuntimeProcess, finish};
use crate::support::{ControlPlane, RUNTIME_NAMESPACE, eventually};

/// Seconds of the Lease: the old leader is frozen for three of them and more.
const LEASE_SECONDS: &str = "3";

/// What a replica logs when a reconcile finished, and when one of its writes went through.
const ACTIVITY: [&str; 4] = [
    " reconciled ",
    "applied ",
    "set status of ",
    "recorded Event ",
];

#[tokio::test]
async fn a_frozen_leader_never_acts_after_its_lease_expired() {
    let cp = ControlPlane::shared();
    let (client, ns) = prepare(cp, "fencing").await;
    let args = [
        "--leader-elect",
        "--shards",
        "1",
        "--leader-election-namespace",
        RUNTIME_NAMESPACE,
        "--leader-election-id",
        &ns,
        "--lease-duration-seconds",
        LEASE_SECONDS,
    ];
    let kubeconfig = cp.runtime_kubeconfig();
    let mut first = RuntimeProcess::start_with_args(&kubeconfig, &ns, &args);
    let mut second: Option<RuntimeProcess> = None;
    let result = async {
        apply_all(&client, &example("hello-world/rbac.yaml", &ns)?).await?;
        apply(
            &client,
            &module_config_map(
                &ns,
                "hello-controller",
                "hello_world.wasm",
                &guest("hello_world"),
            ),
        )
        .await?;
        let mut controller = example("hello-world/controller.yaml", &ns)?;
        // Reconcile every second, so that a replica that acts has something to do.
        for doc in &mut controller {
            doc["spec"]["resyncPeriodSeconds"] = json!(1);
        }
        apply_all(&client, &controller).await?;
        apply_all(&client, &example("hello-world/hello.yaml", &ns)?).await?;
        let object = format!("{ns}/your-name");

        wait_logged(&first, 0, "holding 1 shards").await?;
        first.wait_reconciled(0, &object, "").await?;
        let standby = second.insert(RuntimeProcess::start_with_args(&kubeconfig, &ns, &args));
        wait_logged(standby, 0, "2 replicas share 1 shards").await?;

        // Freeze the holder between two reconciles, as a stalled node would be.
        signal(first.pid(), "STOP")?;
        let frozen_at = first.log_len();
        wait_logged(standby, 0, "holding 1 shards").await?;
        let took_over = standby.log_len();
        standby.wait_reconciled(took_over, &object, "").await?;

        // Wake it: its renewal is long expired and the other replica holds the shard.
        signal(first.pid(), "CONT")?;
        wait_logged(&first, frozen_at, "lost shard").await?;
        wait_logged(&first, frozen_at, "holding 0 shards").await?;
        // A few rounds more: it must not take the shard back.
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let after = first.log_since(frozen_at);
        for activity in ACTIVITY {
            ensure!(
                !after.contains(activity),
                "the frozen replica acted ({activity:?}) after its Lease expired:\n{after}"
            );
        }
        first.ensure_running()?;
        // The other replica kept reconciling throughout.
        let reconciled = standby.log_since(took_over).matches(" reconciled ").count();
        ensure!(
            reconciled >= 2,
            "the replica that took over reconciled {reconciled} times"
        );
        standby.ensure_running()
    }
    .await;
    let mut runtimes: Vec<&mut RuntimeProcess> = vec![&mut first];
    runtimes.extend(second.as_mut());
    finish(result, &mut runtimes);
}

async fn wait_logged(runtime: &RuntimeProcess, offset: usize, text: &str) -> Result<()> {
    eventually(&format!("the runtime logs {text:?}"), WAIT, || async {
        Ok(runtime.log_since(offset).contains(text).then_some(()))
    })
    .await
}

fn signal(pid: u32, signal: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()?;
    ensure!(status.success(), "kill -{signal} {pid}: {status}");
    Ok(())
}
