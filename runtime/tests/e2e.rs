//! End to end (issue 10): kubewasm installed into a cluster as a user installs it, on a local
//! control plane with one real node that runs its Pods.
//!
//! One test, its steps in order, on one cluster for the whole binary (one node per machine):
//!
//! 1. `cluster.sh up --node --watch-pid <this process>` in
//!    `target/tmp/control-planes/e2e.<pid>/`; `cluster.sh image-push` of the runtime image
//!    (`make image`; `KUBEWASM_IMAGE_TAR` names another tarball) into the node's registry;
//! 2. `kubectl apply -k deploy/`, the CRDs Established, `kubectl apply -k
//!    deploy/overlays/tutorials` (`make install-files`; on a server without `policy/v1`, the
//!    local 1.20, the PodDisruptionBudget is applied as `policy/v1beta1`): both runtime Pods
//!    Running and Ready, the 32 shard Leases split 16/16 between them, both running as
//!    ServiceAccount kubewasm-system/kubewasm with nothing but its token, which may do what
//!    deploy/ grants and no more;
//! 3. the HelloWorld tutorial: Pod your-name prints `Hello, Your Name!`, then, `who` patched,
//!    a new Pod prints `Hello, My Name!`;
//! 4. the ConfigMap restarter tutorial: the frontend's running Pods are replaced, once, when
//!    their ConfigMap changes;
//! 5. failover: the replica running tenant hello killed hard, a change made at once is acted on
//!    exactly once by another replica, which takes hello's shard Lease once it expires (within
//!    the lease duration + a round); the shards split evenly again with the replacement Pod;
//! 6. a guest from a file: ConfigMap kubewasm-modules mounted at `--module-dir`, a
//!    ClusterWasmController naming the file; the ConfigMap changed, the runtime reloads the
//!    module without restarting;
//! 7. a hostile tenant (`e2e/hostile.rs`): URL-as-apiVersion specs refused, a guest that logs a
//!    million empty lines, forges log lines, floods, loops and allocates; the HelloWorld
//!    tutorial served meanwhile, no runtime Pod restarted, every log line of the replica running
//!    it one JSON object, the tenant's guest lines within its log rate; then, its caches held
//!    at their cap, the operator allowing the tenant's registry (`--insecure-registry`, the
//!    Deployment rolled out), a gzip bomb named by 16 controllers, a module whose compile meets
//!    `--compile-memory` and pulls of an endless token and an endless manifest from that
//!    registry: refused and quarantined, the tutorial served, the runtime and its container
//!    under their memory limits;
//! 8. a team by itself (`e2e/team.rs`): alice, admin of one namespace only, sets up a
//!    controller alone once the cluster admin labelled her namespace, `kubewasm wait` says its
//!    module runs, `kubewasm logs` shows her guest's panic through the aggregation layer,
//!    `kubewasm capsules` fetches the failure and `kubewasm reconcile --capsule` replays it to
//!    the same error; bob, admin of another namespace, is refused both and shown nothing;
//! 9. scaled: `kubectl scale deploy/kubewasm --replicas=3`, the shards split 11/11/10 and 32
//!    ClusterWasmControllers (one per shard) Ready with every Pod running some, the
//!    PodDisruptionBudget expecting 3; back to 2, every controller Ready on the two left;
//! 10. `cluster.sh down` (also when a step failed; the watchdog does it if the process dies).
//!
//! Each step's time is printed as it ends, and all of them at the end. On a failure,
//! `<state dir>/e2e-diagnostics.txt` has the Pods, the runtime's logs, the controllers and
//! the events; the cluster's own logs stay in `<state dir>/logs/`.
//!
//! Needs root (the node), kubectl, `make image install-files` (the Makefile's `test` target
//! builds both first).

use kubewasm_test_support as support;

#[path = "e2e/cluster.rs"]
mod cluster;
#[path = "e2e/failover.rs"]
mod failover;
#[path = "e2e/hostile.rs"]
mod hostile;
#[path = "e2e/install.rs"]
mod install;
#[path = "e2e/module_file.rs"]
mod module_file;
#[path = "e2e/scale.rs"]
mod scale;
#[path = "e2e/team.rs"]
mod team;
#[path = "e2e/timings.rs"]
mod timings;
#[path = "e2e/tutorials.rs"]
mod tutorials;

use anyhow::Result;

use cluster::{Inputs, NodeCluster};
use timings::Timings;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubewasm_installed_into_a_cluster_with_a_node() {
    let inputs = Inputs::find().unwrap_or_else(|error| panic!("{error:#}"));
    let mut timings = Timings::new();
    timings.step("1. cluster up --node, image push");
    let mut cluster = match NodeCluster::start().await {
        Ok(cluster) => cluster,
        Err(error) => {
            timings.fail();
            eprintln!("{}", timings.summary());
            panic!("{error:#}");
        }
    };
    let result = steps(&cluster, &inputs, &mut timings).await;
    if result.is_err() {
        timings.fail();
        cluster.diagnostics().await;
    }
    timings.step("10. cluster down");
    let down = cluster.stop().await;
    if down.is_err() {
        timings.fail();
    }
    eprintln!("{}", timings.summary());
    if let Err(error) = result {
        panic!(
            "{error:#}\n(state and logs: {})",
            cluster.state_dir().display()
        );
    }
    if let Err(error) = down {
        panic!("cluster.sh down: {error:#}");
    }
}

async fn steps(cluster: &NodeCluster, inputs: &Inputs, timings: &mut Timings) -> Result<()> {
    let pushed = std::time::Instant::now();
    cluster.push_image(&inputs.image_tar).await?;
    timings.note(format!(
        "cluster.sh image-push {}: {}",
        inputs.image_tar.display(),
        timings::secs(pushed.elapsed())
    ));

    timings.step("2. install: apply -k deploy/ and the tutorials overlay");
    let pods = install::install(cluster, inputs, timings).await?;

    timings.step("3. HelloWorld tutorial");
    let hello_uid = tutorials::hello_world(cluster, timings).await?;

    timings.step("4. ConfigMap restarter tutorial");
    tutorials::restarter(cluster, timings).await?;

    timings.step("5. failover: the replica running hello killed");
    let pods = failover::failover(cluster, &pods, &hello_uid, timings).await?;

    timings.step("6. guest from a module file (ConfigMap volume), reloaded in place");
    module_file::module_file(cluster, inputs, &pods, timings).await?;

    timings.step("7. a hostile tenant against the installed runtime");
    hostile::hostile_tenant(cluster, &inputs.hostile_wasm, timings).await?;

    timings.step("8. a team runs its controller by itself (a namespace admin)");
    team::team_alone(cluster, &inputs.hostile_wasm, timings).await?;

    timings.step("9. scaled to 3 replicas and back to 2");
    scale::scale(cluster, timings).await?;
    timings.end();
    Ok(())
}
