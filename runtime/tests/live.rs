//! The live runtime, `kubewasm run`, as a child process against the local control plane:
//! the HelloWorld and ConfigMap-restarter tutorials step by step with the examples' own
//! manifests, each with its Rust guest and with its Python guest (module from a registry), hot reload of a module, an API server restarted under a running runtime, and
//! RBAC (and the declaration) having the final word.
//!
//! Every test has its own namespace and its own `kubewasm run --namespace <ns>`, so tests run
//! side by side without seeing each other's controllers. Each runs as the runtime's own
//! ServiceAccount with `deploy/runtime/rbac.yaml`, not as the admin, so a rule missing from it
//! fails them; `identity` proves it holds no more than that.

use kubewasm_test_support as support;

#[path = "live/apiserver.rs"]
mod apiserver;
#[path = "live/cache_budget.rs"]
mod cache_budget;
#[path = "live/cache_churn.rs"]
mod cache_churn;
#[path = "live/children.rs"]
mod children;
#[path = "live/compile_cpu.rs"]
mod compile_cpu;
#[path = "live/damping.rs"]
mod damping;
use kubewasm_test_support::cluster;
#[path = "live/failures.rs"]
mod failures;
#[path = "live/fairness.rs"]
mod fairness;
#[path = "live/fencing.rs"]
mod fencing;
#[path = "live/finalizers.rs"]
mod finalizers;
#[path = "live/first_controller.rs"]
mod first_controller;
#[path = "live/flavours.rs"]
mod flavours;
#[path = "live/guitars.rs"]
mod guitars;
#[path = "live/identity.rs"]
mod identity;
#[path = "live/isolation.rs"]
mod isolation;
#[path = "live/logs.rs"]
mod logs;
#[path = "live/metadata_list.rs"]
mod metadata_list;
#[path = "live/module_reads.rs"]
mod module_reads;
#[path = "live/oci/mod.rs"]
mod oci;
#[path = "live/offline_live.rs"]
mod offline_live;
#[path = "live/pods.rs"]
mod pods;
#[path = "live/quarantine.rs"]
mod quarantine;
#[path = "live/reload.rs"]
mod reload;
#[path = "live/restarter.rs"]
mod restarter;
#[path = "live/rollout.rs"]
mod rollout;
#[path = "live/state.rs"]
mod state;
#[path = "live/state_budget.rs"]
mod state_budget;
#[path = "live/state_together.rs"]
mod state_together;
use kubewasm_test_support::runtime;
#[path = "live/signatures.rs"]
mod signatures;
#[path = "live/storm.rs"]
mod storm;
#[path = "live/team.rs"]
mod team;
#[path = "live/tutorial_crd.rs"]
mod tutorial_crd;

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use support::{ControlPlane, eventually};

use cluster::{
    WAIT, apply, apply_all, create_hello_world, ensure_condition, example, guest, hello_worlds,
    live_pods, module_config_map, prepare, sha256, take, wait_greeting_pod, wait_status,
    wait_status_pods,
};
use flavours::Flavour;
use kubewasm_test_support::registry::Registry;
use restarter::{Owner, create_pod, ensure_pods, wait_digest, wait_pods};
use runtime::{RuntimeProcess, finish};

/// Garbage collection of a fresh CRD's children may wait for kube-controller-manager's
/// garbage collector to rediscover the API (every 30 s), so it gets longer than [`WAIT`].
const GC_WAIT: Duration = Duration::from_secs(90);

/// How long "nothing happens" is watched for where no event says it is over.
const QUIET: Duration = Duration::from_secs(3);

/// The annotation that opts a ConfigMap into the restarter.
const SELECTOR_ANNOTATION: &str = "magalix.com/podDeleteMatch";

/// A JSON merge patch, as `kubectl patch --type merge` sends.
fn merge(value: Value) -> Patch<Value> {
    Patch::Merge(value)
}

/// Skips (returns true) where no kube-controller-manager runs (envtest binaries).
fn without_controller_manager(control_plane: &ControlPlane) -> bool {
    let missing = !control_plane.has_controller_manager();
    if missing {
        eprintln!("skipped: no kube-controller-manager in this control plane");
    }
    missing
}

#[tokio::test]
async fn hello_world_tutorial_step_by_step() {
    hello_world_tutorial(Flavour::Rust).await;
}

/// The same steps for the Python HelloWorld (`guests/python-hello-world`), its module from a
/// registry.
#[tokio::test]
async fn python_hello_world_tutorial_step_by_step() {
    let registry = Registry::start().expect("starting docker-registry");
    hello_world_tutorial(Flavour::Python(&registry)).await;
}

async fn hello_world_tutorial(flavour: Flavour<'_>) {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "hello").await;
    let mut runtime = flavour.start_runtime(control_plane, &ns);
    let result = hello_world(control_plane, &client, &ns, flavour, &mut runtime.process).await;
    finish(result, &mut [&mut runtime.process]);
    drop(runtime);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn hello_world(
    control_plane: &ControlPlane,
    client: &Client,
    ns: &str,
    flavour: Flavour<'_>,
    runtime: &mut RuntimeProcess,
) -> Result<()> {
    if let Flavour::Python(_) = flavour {
        // The runtime's watch of HelloWorlds (a ClusterRole) comes with the Rust example.
        let cluster_wide: Vec<Value> = example("hello-world/rbac.yaml", ns)?
            .into_iter()
            .filter(|d| d["kind"].as_str().is_some_and(|k| k.starts_with("Cluster")))
            .collect();
        apply_all(client, &cluster_wide).await?;
    }
    apply_all(client, &flavour.example("hello-world", "rbac.yaml", ns)?).await?;
    let wasm = flavour
        .install_controller(client, ns, "hello-world", "hello-controller", "hello-world")
        .await?;
    apply_all(client, &flavour.example("hello-world", "hello.yaml", ns)?).await?;

    let hellos = hello_worlds(client, ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let parent = hellos.get("your-name").await?;
    let pod = wait_greeting_pod(&pods, "your-name", "Hello, Your Name!", None).await?;
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .context("Pod your-name has no controller ownerReference")?;
    ensure!(
        owner.api_version == "example.com/v1"
            && owner.kind == "HelloWorld"
            && owner.name == "your-name"
            && Some(owner.uid.as_str()) == parent.uid().as_deref(),
        "Pod your-name is owned by {owner:?}, not by HelloWorld your-name ({:?})",
        parent.uid()
    );
    wait_status_pods(client, ns, "your-name", 1).await?;
    let digest = sha256(&wasm);
    wait_status(
        client,
        ns,
        "hello-world",
        "WasmController hello-world reports its module loaded and itself ready",
        |s| {
            ensure_condition(s, "ModuleReady", "True")?;
            ensure_condition(s, "Ready", "True")?;
            ensure!(
                s.module_digest.as_deref() == Some(digest.as_str()),
                "moduleDigest is {:?}, want {digest}",
                s.module_digest
            );
            ensure!(s.reconciles > 0, "no reconciles counted yet");
            Ok(())
        },
    )
    .await?;
    // The same, as Prometheus and a kubelet probe see it.
    let (ready, _) = runtime.http_get("/readyz").await?;
    ensure!(ready == 200, "/readyz answered {ready}");
    let (code, metrics) = runtime.http_get("/metrics").await?;
    ensure!(code == 200, "/metrics answered {code}");
    let series =
        format!(r#"kubewasm_reconciles_total{{controller="{ns}/hello-world",result="success"}} "#);
    let count: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .with_context(|| format!("no `{series}` in /metrics:\n{metrics}"))?
        .trim()
        .parse()?;
    ensure!(count > 0, "no successful reconciles counted in /metrics");
    // At least the Pod applied and the status written (`pods: 1`), each with a token.
    let series = format!(r#"kubewasm_api_requests_total{{controller="{ns}/hello-world"}} "#);
    let requests: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .with_context(|| format!("no `{series}` in /metrics:\n{metrics}"))?
        .trim()
        .parse()?;
    ensure!(
        requests >= 2,
        "{requests} API requests counted, want at least 2"
    );
    ensure!(
        metrics.contains("kubewasm_controllers_running 1"),
        "controllers_running is not 1:\n{metrics}"
    );

    let old_uid = pod.uid().unwrap_or_default();
    hellos
        .patch(
            "your-name",
            &PatchParams::default(),
            &merge(json!({"spec": {"who": "My Name"}})),
        )
        .await?;
    wait_greeting_pod(&pods, "your-name", "Hello, My Name!", Some(&old_uid)).await?;

    hellos.delete("your-name", &DeleteParams::default()).await?;
    if !without_controller_manager(control_plane) {
        eventually(
            "the garbage collector deletes Pod your-name once HelloWorld your-name is gone",
            GC_WAIT,
            || async {
                match pods.get_opt("your-name").await? {
                    None => Ok(Some(())),
                    Some(pod) => bail!(
                        "Pod your-name (uid {:?}) still exists",
                        pod.uid().unwrap_or_default()
                    ),
                }
            },
        )
        .await?;
    }
    runtime.ensure_running()
}

#[tokio::test]
async fn configmap_restarter_tutorial_restarts_exactly_the_selected_pods() {
    configmap_restarter_tutorial(Flavour::Rust).await;
}

/// The same steps for the Python restarter (`guests/python-configmap-restarter`), its module
/// from a registry, under the tutorial's `joe`: killed mid-restart too.
#[tokio::test]
async fn python_configmap_restarter_tutorial_restarts_exactly_the_selected_pods() {
    let registry = Registry::start().expect("starting docker-registry");
    configmap_restarter_tutorial(Flavour::Python(&registry)).await;
}

async fn configmap_restarter_tutorial(flavour: Flavour<'_>) {
    let control_plane = ControlPlane::shared();
    if without_controller_manager(control_plane) {
        return;
    }
    let (client, ns) = prepare(control_plane, "test-space").await;
    let mut runtime = flavour.start_runtime(control_plane, &ns);
    let result = configmap_restarter(&client, &ns, flavour, &mut runtime.process).await;
    finish(result, &mut [&mut runtime.process]);
    drop(runtime);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn configmap_restarter(
    client: &Client,
    ns: &str,
    flavour: Flavour<'_>,
    runtime: &mut RuntimeProcess,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let tutorial = "configmap-restarter";
    apply_all(client, &flavour.example(tutorial, "rbac.yaml", ns)?).await?;
    apply_all(client, &flavour.example(tutorial, "frontend.yaml", ns)?).await?;
    create_pod(&pods, "other", "other").await?;
    let frontend = wait_pods(&pods, "the frontend Deployment has 2 Pods", None).await?;
    let other = pods.get("other").await?.uid();

    // The controller comes after the Pods, so that its first sighting has Pods to spare.
    let offset = runtime.log_len();
    flavour
        .install_controller(client, ns, tutorial, tutorial, tutorial)
        .await?;
    let owner = Owner::Namespaced(ns, "configmap-restarter");
    let key = format!("{ns}/frontend-config");
    let first = wait_digest(client, owner, &key, None).await?;
    runtime
        .wait_reconciled(offset, &format!("{ns}/frontend-config"), "actions=1")
        .await?;
    ensure_pods(&pods, "app=frontend", &frontend, "after the first sighting").await?;

    // A data change: exactly the app=frontend Pods go, an Event says so.
    let offset = runtime.log_len();
    config_maps
        .patch(
            "frontend-config",
            &PatchParams::default(),
            &merge(json!({"data": {"TEXT1": "Hello"}})),
        )
        .await?;
    let restarted = wait_pods(
        &pods,
        "the data change replaces both frontend Pods",
        Some(&frontend),
    )
    .await?;
    ensure!(
        pods.get("other").await?.uid() == other,
        "Pod `other` (app=other) was replaced too"
    );
    let second = wait_digest(client, owner, &key, Some(&first)).await?;
    // joe may not create Events: the work is done all the same, and the log says what was
    // not recorded.
    eventually(
        "the log saying the PodsRestarted Event was not recorded",
        WAIT,
        || async {
            let log = runtime.log_since(offset);
            Ok(log
                .lines()
                .any(|l| {
                    l.contains("Event PodsRestarted on ConfigMap") && l.contains("not recorded")
                })
                .then_some(()))
        },
    )
    .await?;
    runtime
        .wait_reconciled(offset, &format!("{ns}/frontend-config"), "actions=4")
        .await?;

    // An unannotated ConfigMap whose data changes: the guest is asked and does nothing.
    let offset = runtime.log_len();
    apply(
        client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "plain-config", "namespace": ns}, "data": {"a": "1"}}),
    )
    .await?;
    runtime
        .wait_reconciled(offset, &format!("{ns}/plain-config"), "actions=0")
        .await?;
    let offset = runtime.log_len();
    config_maps
        .patch(
            "plain-config",
            &PatchParams::default(),
            &merge(json!({"data": {"a": "2"}})),
        )
        .await?;
    runtime
        .wait_reconciled(offset, &format!("{ns}/plain-config"), "actions=0")
        .await?;
    ensure_pods(
        &pods,
        "app=frontend",
        &restarted,
        "after an unannotated ConfigMap changed",
    )
    .await?;

    // A metadata-only change of the annotated ConfigMap: same data digest, nothing to do.
    let offset = runtime.log_len();
    config_maps
        .patch(
            "frontend-config",
            &PatchParams::default(),
            &merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await?;
    runtime
        .wait_reconciled(offset, &format!("{ns}/frontend-config"), "actions=0")
        .await?;
    ensure_pods(&pods, "app=frontend", &restarted, "after a label was added").await?;

    // A change while the runtime is down is acted on when it is back (level-based).
    runtime.stop()?;
    config_maps
        .patch(
            "frontend-config",
            &PatchParams::default(),
            &merge(json!({"data": {"TEXT2": "Martians"}})),
        )
        .await?;
    tokio::time::sleep(QUIET).await;
    ensure_pods(
        &pods,
        "app=frontend",
        &restarted,
        "while the runtime is stopped",
    )
    .await?;
    runtime.start_again();
    let restarted = wait_pods(
        &pods,
        "the change made while the runtime was down replaces both frontend Pods once it is back",
        Some(&restarted),
    )
    .await?;
    let third = wait_digest(client, owner, &key, Some(&second)).await?;
    ensure!(
        pods.get("other").await?.uid() == other,
        "Pod `other` (app=other) was replaced"
    );

    // The same change again by the same field manager (a value of an existing key): Kubernetes
    // 1.20 keeps that manager's `managedFields` time at the first change, so the Pods made since
    // then must be found by their own creation times.
    config_maps
        .patch(
            "frontend-config",
            &PatchParams::default(),
            &merge(json!({"data": {"TEXT2": "Venusians"}})),
        )
        .await?;
    let restarted = wait_pods(
        &pods,
        "a second change of the same key by the same manager replaces both frontend Pods",
        Some(&restarted),
    )
    .await?;
    let third = wait_digest(client, owner, &key, Some(&third)).await?;

    // A runtime killed after deleting the Pods and before saving the digest. Made exactly:
    // the runtime is killed, and the saved state is set back to `pending:<digest>@<bound>`,
    // what the restart saves before it deletes anything, as if the last save had never
    // happened (the bound: Pod `other`'s creation, older than the replacements, as the newest
    // old Pod was). Back up, it deletes only Pods created up to the bound — the replacements
    // are newer.
    runtime.kill()?;
    let bound = pods
        .get("other")
        .await?
        .metadata
        .creation_timestamp
        .context("Pod `other` has a creationTimestamp")?
        .0
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let pending = format!("pending:{third}@{bound}");
    rewind_state(client, ns, "configmap-restarter", &key, &pending).await?;
    let offset = runtime.log_len();
    runtime.start_again();
    wait_digest(client, owner, &key, Some(&pending)).await?;
    runtime.wait_reconciled(offset, &key, "actions=3").await?;
    tokio::time::sleep(QUIET).await;
    ensure_pods(
        &pods,
        "app=frontend",
        &restarted,
        "after a restart that found the digest unsaved (a second restart)",
    )
    .await?;
    ensure!(owner.saved(client, &key).await?.as_deref() == Some(third.as_str()));

    // And killed for real with SIGKILL the moment the first Pod is seen deleted: wherever
    // the kill lands, each Pod is restarted once.
    config_maps
        .patch(
            "frontend-config",
            &PatchParams::default(),
            &merge(json!({"data": {"TEXT3": "Hello from the new frontend"}})),
        )
        .await?;
    eventually("a frontend Pod being deleted", WAIT, || async {
        let now = live_pods(&pods, "app=frontend").await?;
        Ok(restarted.keys().any(|n| !now.contains_key(n)).then_some(()))
    })
    .await?;
    runtime.kill()?;
    let saved = owner.saved(client, &key).await?.unwrap_or_default();
    eprintln!(
        "SIGKILL landed {}",
        if saved.starts_with("pending:") {
            "inside the window: Pods deleted, the new digest not saved yet"
        } else {
            "after the new digest was saved"
        }
    );
    runtime.start_again();
    let replaced = wait_pods(
        &pods,
        "both frontend Pods replaced once after the SIGKILL",
        Some(&restarted),
    )
    .await?;
    wait_digest(client, owner, &key, Some(&third)).await?;
    tokio::time::sleep(QUIET).await;
    ensure_pods(
        &pods,
        "app=frontend",
        &replaced,
        "after the runtime killed mid-restart came back (a second restart)",
    )
    .await?;
    runtime.ensure_running()
}

/// Sets the state WasmController `controller` saved for `key` back to `digest` (as the
/// admin, in its WasmControllerState: what a runtime killed before its save leaves).
async fn rewind_state(
    client: &Client,
    ns: &str,
    controller: &str,
    key: &str,
    digest: &str,
) -> Result<()> {
    cluster::set_saved_state(client, ns, "WasmController", controller, key, digest).await
}

#[tokio::test]
async fn runtime_survives_an_api_server_restart() {
    let control_plane = StopOnDrop::start("live-apiserver-restart");
    let (client, ns) = prepare(&control_plane.0, "restart").await;
    let mut runtime = RuntimeProcess::start(&control_plane.0.runtime_kubeconfig(), &ns);
    let result = api_server_restart(&control_plane.0, &client, &ns, &mut runtime).await;
    finish(result, &mut [&mut runtime]);
}

/// Stops a control plane of a test's own, also when the test fails.
struct StopOnDrop(ControlPlane);

impl StopOnDrop {
    /// Starts a control plane of the test's own, named `name` (and this process).
    fn start(name: &str) -> StopOnDrop {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join("control-planes")
            .join(format!("{name}.{}", std::process::id()));
        let control_plane = ControlPlane::start(&dir, Some(std::process::id()))
            .expect("starting a control plane of this test's own");
        StopOnDrop(control_plane)
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Err(error) = self.0.stop() {
            eprintln!("stopping the control plane: {error:#}");
        }
    }
}

async fn api_server_restart(
    control_plane: &ControlPlane,
    client: &Client,
    ns: &str,
    runtime: &mut RuntimeProcess,
) -> Result<()> {
    let wasm = guest("hello_world");
    apply_all(client, &example("hello-world/rbac.yaml", ns)?).await?;
    apply(
        client,
        &module_config_map(ns, "hello-controller", "hello_world.wasm", &wasm),
    )
    .await?;
    apply_all(client, &example("hello-world/controller.yaml", ns)?).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    create_hello_world(client, ns, "first", "First").await?;
    let first = wait_greeting_pod(&pods, "first", "Hello, First!", None).await?;

    let state_dir = control_plane.state_dir().context("no state directory")?;
    let pid = apiserver::restart(state_dir)?;
    eprintln!("kube-apiserver restarted (pid {pid})");
    eventually("the restarted kube-apiserver answers", WAIT, || async {
        let client = control_plane.client().await?;
        Api::<Pod>::namespaced(client, ns)
            .list(&ListParams::default())
            .await?;
        Ok(Some(()))
    })
    .await?;

    // Fresh clients for the test; the runtime keeps its own.
    let client = control_plane.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    hello_worlds(&client, ns)
        .patch(
            "first",
            &PatchParams::default(),
            &merge(json!({"spec": {"who": "Again"}})),
        )
        .await?;
    create_hello_world(&client, ns, "second", "Second").await?;
    wait_greeting_pod(&pods, "second", "Hello, Second!", None).await?;
    wait_greeting_pod(&pods, "first", "Hello, Again!", first.uid().as_deref()).await?;
    runtime.ensure_running()
}

#[tokio::test]
async fn rbac_refuses_what_the_service_account_may_not_do() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "rbac-forbidden").await;
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = restarter_refused(&client, &ns, Refusal::Rbac).await;
    finish(result, &mut [&mut runtime]);
    drop(runtime);
    let _ = control_plane.delete_namespace(&ns).await;
}

#[tokio::test]
async fn undeclared_actions_are_refused_before_the_api_server() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "undeclared").await;
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = restarter_refused(&client, &ns, Refusal::Undeclared).await;
    finish(result, &mut [&mut runtime]);
    drop(runtime);
    let _ = control_plane.delete_namespace(&ns).await;
}

/// How the restarter is kept from deleting Pods.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Refusal {
    /// Its Role lacks `delete pods`: the API server says 403.
    Rbac,
    /// Its WasmController has no Pod grant: the runtime says no.
    Undeclared,
}

async fn restarter_refused(client: &Client, ns: &str, refusal: Refusal) -> Result<()> {
    let mut rbac = example("configmap-restarter/rbac.yaml", ns)?;
    let mut controller = example("configmap-restarter/controller.yaml", ns)?;
    match refusal {
        Refusal::Rbac => {
            let role = rbac
                .iter_mut()
                .find(|d| d["kind"] == "Role" && d["metadata"]["name"] == "list-delete-pods")
                .context("no Role list-delete-pods")?;
            for rule in role["rules"].as_array_mut().context("Role without rules")? {
                if rule["resources"] == json!(["pods"]) {
                    rule["verbs"] = json!(["get", "list", "watch"]);
                }
            }
        }
        Refusal::Undeclared => {
            let mut wc = take(&mut controller, "WasmController")?;
            wc["spec"]
                .as_object_mut()
                .context("no spec")?
                .remove("grants");
            controller.push(wc);
        }
    }
    apply_all(client, &rbac).await?;
    let mut frontend = example("configmap-restarter/frontend.yaml", ns)?;
    apply(client, &take(&mut frontend, "ConfigMap")?).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    create_pod(&pods, "frontend-pod", "frontend").await?;
    let before = live_pods(&pods, "app=frontend").await?;
    let wasm = guest("configmap_restarter");
    apply(
        client,
        &module_config_map(ns, "configmap-restarter", "configmap_restarter.wasm", &wasm),
    )
    .await?;
    apply_all(client, &controller).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let owner = Owner::Namespaced(ns, "configmap-restarter");
    let key = format!("{ns}/frontend-config");
    let recorded = wait_digest(client, owner, &key, None).await?;

    config_maps
        .patch(
            "frontend-config",
            &PatchParams::default(),
            &merge(json!({"data": {"TEXT1": "Hello"}})),
        )
        .await?;
    let (what, wanted): (&str, &[&str]) = match refusal {
        Refusal::Rbac => (
            "Degraded=True saying the API server forbade deleting Pods",
            &["forbidden", "delete"],
        ),
        Refusal::Undeclared => (
            "Degraded=True saying deleting Pods is not declared",
            &["not declared", "spec.grants"],
        ),
    };
    wait_status(client, ns, "configmap-restarter", what, |s| {
        let degraded = ensure_condition(s, "Degraded", "True")?;
        for word in wanted {
            ensure!(
                degraded.message.contains(word),
                "Degraded says {:?}",
                degraded.message
            );
        }
        Ok(())
    })
    .await?;
    ensure_pods(&pods, "app=frontend", &before, "after a refused restart").await?;
    let saved = owner.saved(client, &key).await?.unwrap_or_default();
    ensure!(
        saved == recorded || saved.starts_with("pending:"),
        "the new digest was saved although the Pods were not restarted: {saved}"
    );
    Ok(())
}

#[tokio::test]
async fn many_controllers_share_one_watch_per_kind() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "shared-watch").await;
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = shared_watches(&client, &ns, &runtime).await;
    finish(result, &mut [&mut runtime]);
    drop(runtime);
    let _ = control_plane.delete_namespace(&ns).await;
}

/// Five restarters (ConfigMap parents, Pod grants) in one runtime: one ConfigMap watch and
/// one Pod watch serve them all.
async fn shared_watches(client: &Client, ns: &str, runtime: &RuntimeProcess) -> Result<()> {
    apply_all(client, &example("configmap-restarter/rbac.yaml", ns)?).await?;
    let wasm = guest("configmap_restarter");
    let module = module_config_map(ns, "configmap-restarter", "configmap_restarter.wasm", &wasm);
    apply(client, &module).await?;
    let mut controller = example("configmap-restarter/controller.yaml", ns)?;
    let template = take(&mut controller, "WasmController")?;
    let names: Vec<String> = (1..=5).map(|i| format!("restarter-{i}")).collect();
    for name in &names {
        let mut wc = template.clone();
        wc["metadata"]["name"] = json!(name);
        apply(client, &wc).await?;
    }
    for name in &names {
        wait_status(client, ns, name, &format!("{name} becoming Ready"), |s| {
            ensure_condition(s, "Ready", "True").map(drop)
        })
        .await?;
    }
    let log = runtime.log();
    for kind in ["ConfigMap (v1)", "Pod (v1)"] {
        let starts = log
            .lines()
            .filter(|l| l.contains("starting shared watch") && l.contains(kind))
            .count();
        ensure!(
            starts == 1,
            "{kind}: {starts} watches started for 5 controllers, expected 1"
        );
    }
    Ok(())
}

#[tokio::test]
async fn cluster_wasm_controller_acts_in_every_namespace() {
    let control_plane = StopOnDrop::start("live-cluster-scoped");
    let (client, modules) = prepare(&control_plane.0, "modules").await;
    let module_dir = tempfile::tempdir().expect("a temporary module directory");
    let dir_arg = module_dir.path().to_string_lossy().into_owned();
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.0.runtime_kubeconfig(),
        "",
        &["--module-dir", &dir_arg],
    );
    let result = async {
        cluster_scoped(&control_plane.0, &client, &modules).await?;
        guitars::guitar_reviews(&control_plane.0, &client, &modules, &runtime).await?;
        pods::pod_watcher(&control_plane.0, &client, &modules, &mut runtime).await?;
        tutorial_crd::hello_world_with_the_tutorials_crd(&control_plane.0, &client).await?;
        file_module(&client, &modules, module_dir.path()).await
    }
    .await;
    finish(result, &mut [&mut runtime]);
}

/// A ClusterWasmController (module and ServiceAccount in one namespace, a ClusterRole for its
/// rights) restarts the selected Pods in two other namespaces.
async fn cluster_scoped(
    control_plane: &ControlPlane,
    client: &Client,
    modules: &str,
) -> Result<()> {
    let wasm = guest("configmap_restarter");
    apply(
        client,
        &module_config_map(modules, "restarter", "restarter.wasm", &wasm),
    )
    .await?;
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "restarter", "namespace": modules, "annotations": {"kubewasm.dev/wasm-controllers": "allowed"}}});
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": format!("{modules}-restarter")},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{modules}-restarter")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{modules}-restarter")},
        "subjects": [{"kind": "ServiceAccount", "name": "restarter", "namespace": modules}]});
    apply_all(client, &[account, role, binding]).await?;
    let controller = json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "ClusterWasmController",
        "metadata": {"name": format!("{modules}-restarter")},
        "spec": {
            "module": {"configMap": {"name": "restarter", "key": "restarter.wasm", "namespace": modules}},
            "parent": {"apiVersion": "v1", "kind": "ConfigMap"},
            "grants": [{"apiVersion": "v1", "kind": "Pod", "verbs": ["list", "delete"]}],
            "serviceAccountName": "restarter"}});
    apply(client, &controller).await?;

    let mut tenants = Vec::new();
    for prefix in ["tenant-a", "tenant-b"] {
        let ns = control_plane.namespace(prefix).await?;
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": ns,
                "annotations": {SELECTOR_ANNOTATION: "app=web"}},
            "data": {"colour": "blue"}});
        apply(client, &config).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        create_pod(&pods, "web", "web").await?;
        create_pod(&pods, "db", "db").await?;
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let owner_name = format!("{modules}-restarter");
        wait_digest(
            client,
            Owner::Cluster(&owner_name),
            &format!("{ns}/settings"),
            None,
        )
        .await?;
        tenants.push((ns, pods, config_maps));
    }
    for (_, pods, config_maps) in &tenants {
        let db = live_pods(pods, "app=db").await?;
        config_maps
            .patch(
                "settings",
                &PatchParams::default(),
                &merge(json!({"data": {"colour": "green"}})),
            )
            .await?;
        eventually("the app=web Pod being deleted", WAIT, || async {
            Ok(live_pods(pods, "app=web").await?.is_empty().then_some(()))
        })
        .await?;
        ensure!(
            live_pods(pods, "app=db").await? == db,
            "the app=db Pod was touched"
        );
    }
    let cwc: Api<kubewasm::api::ClusterWasmController> = Api::all(client.clone());
    let name = format!("{modules}-restarter");
    eventually(
        "the ClusterWasmController's status: Ready, reconciles in both namespaces",
        WAIT,
        || async {
            let Some(status) = cwc.get_status(&name).await?.status else {
                return Ok(None);
            };
            ensure_condition(&status, "Ready", "True")?;
            Ok((status.reconciles >= 4).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// The status of ClusterWasmController `name` once it passes `check`.
async fn wait_cluster_status<F>(client: &Client, name: &str, what: &str, check: F) -> Result<()>
where
    F: Fn(&kubewasm::api::WasmControllerStatus) -> Result<()>,
{
    let api: Api<kubewasm::api::ClusterWasmController> = Api::all(client.clone());
    eventually(what, cluster::WAIT, || async {
        let status = api.get(name).await?.status.unwrap_or_default();
        check(&status)?;
        Ok(Some(()))
    })
    .await
}

/// Module files, as a ConfigMap volume would mount them (gzipped here), for
/// ClusterWasmControllers only and only under `--module-dir`: a file there runs; garbage
/// written over it keeps the last good module running with ModuleReady=False; a wrong sha256
/// pin is refused without showing the file's digest; files outside the directory
/// (`/etc/hostname`, `/dev/zero`) are refused, and a WasmController may not name a file at all.
async fn file_module(client: &Client, ns: &str, dir: &std::path::Path) -> Result<()> {
    use std::io::Write as _;
    let path = dir.join("hello_world.wasm.gz");
    let wasm = guest("hello_world");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&wasm)?;
    std::fs::write(&path, gz.finish()?)?;

    let mut wc = take(
        &mut example("hello-world/controller.yaml", ns)?,
        "WasmController",
    )?;
    wc["spec"]["module"] = json!({"path": "/etc/hostname"});
    let refused = apply(client, &wc).await.err().map(|e| format!("{e:#}"));
    ensure!(
        refused
            .as_deref()
            .is_some_and(|e| e.contains("spec.module.path")),
        "a WasmController naming a module file was not refused by the API server: {refused:?}"
    );

    apply_all(client, &example("hello-world/rbac.yaml", ns)?).await?;
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": format!("{ns}-hello")},
        "rules": [
            {"apiGroups": ["example.com"], "resources": ["helloworlds"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["example.com"], "resources": ["helloworlds/status"], "verbs": ["get", "patch", "update"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{ns}-hello")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{ns}-hello")},
        "subjects": [{"kind": "ServiceAccount", "name": "hello-controller", "namespace": ns}]});
    apply_all(client, &[role, binding]).await?;
    let controller = |name: &str, module: Value, selector: &str| {
        json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "ClusterWasmController",
            "metadata": {"name": format!("{ns}-{name}")},
            "spec": {
                "module": module,
                "parent": {"apiVersion": "example.com/v1", "kind": "HelloWorld", "labelSelector": selector},
                "children": [{"apiVersion": "v1", "kind": "Pod", "updateStrategy": "Recreate"}],
                "serviceAccountName": "hello-controller", "serviceAccountNamespace": "default"}})
    };
    // A module from a file has no namespace: the ServiceAccount's is named, `default`.
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "hello-controller", "namespace": "default", "annotations": {"kubewasm.dev/wasm-controllers": "allowed"}}});
    let default_binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{ns}-hello-default")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("{ns}-hello")},
        "subjects": [{"kind": "ServiceAccount", "name": "hello-controller", "namespace": "default"}]});
    // A cluster admin opts `default` in to WasmControllers (the runtime acts as it there).
    let opt_in = crate::support::tenant_binding("default")?;
    let (key, value) = crate::support::TENANT_LABEL;
    let enabled = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "default", "labels": {key: value}}});
    apply_all(client, &[account, default_binding, opt_in, enabled]).await?;
    let file = path.to_string_lossy().into_owned();
    apply(
        client,
        &controller("from-file", json!({"path": file}), "!never"),
    )
    .await?;
    apply(
        client,
        &controller(
            "pinned",
            json!({"path": file, "sha256": "0".repeat(64)}),
            "never=matches",
        ),
    )
    .await?;
    apply(
        client,
        &controller(
            "hostname",
            json!({"path": "/etc/hostname"}),
            "never=matches",
        ),
    )
    .await?;
    apply(
        client,
        &controller(
            "zero",
            json!({"path": "/dev/zero", "sha256": "0".repeat(64)}),
            "never=matches",
        ),
    )
    .await?;

    create_hello_world(client, ns, "from-file", "File").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_greeting_pod(&pods, "from-file", "Hello, File!", None).await?;
    let digest = sha256(&wasm);
    let refused = |reason: &'static str, says: &'static str| {
        let digest = digest.clone();
        move |s: &kubewasm::api::WasmControllerStatus| {
            let c = ensure_condition(s, "ModuleReady", "False")?;
            ensure!(c.reason == reason, "reason is {}: {}", c.reason, c.message);
            ensure!(
                c.message.contains(says),
                "the message does not say `{says}`: {}",
                c.message
            );
            ensure!(
                !c.message.contains(&digest[7..]),
                "the message shows the file's digest: {}",
                c.message
            );
            ensure!(
                s.module_digest.is_none(),
                "moduleDigest is {:?}",
                s.module_digest
            );
            ensure_condition(s, "Ready", "False").map(drop)
        }
    };
    wait_cluster_status(
        client,
        &format!("{ns}-pinned"),
        "the pinned controller refusing the file",
        refused(
            "DigestMismatch",
            "does not match the spec.module.sha256 pin",
        ),
    )
    .await?;
    for name in ["hostname", "zero"] {
        wait_cluster_status(
            client,
            &format!("{ns}-{name}"),
            &format!("{name}: a file outside --module-dir refused"),
            refused(
                "ModuleNotFound",
                "is not a regular file under the module directory",
            ),
        )
        .await?;
    }

    std::fs::write(&path, b"not a module at all")?;
    wait_cluster_status(
        client,
        &format!("{ns}-from-file"),
        "ModuleReady=False after garbage replaced the file",
        |s| {
            let c = ensure_condition(s, "ModuleReady", "False")?;
            ensure!(
                c.reason == "ModuleInvalid",
                "reason is {}: {}",
                c.reason,
                c.message
            );
            ensure!(
                s.module_digest.as_deref() == Some(digest.as_str()),
                "moduleDigest changed: {:?}",
                s.module_digest
            );
            Ok(())
        },
    )
    .await?;
    create_hello_world(client, ns, "still-running", "Still").await?;
    wait_greeting_pod(&pods, "still-running", "Hello, Still!", None).await?;
    Ok(())
}
