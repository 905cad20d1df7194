//! The cluster the end-to-end test installs kubewasm into: a local control plane with one real
//! node (`cluster.sh up --node --watch-pid <this process>`), the runtime image pushed into the
//! node's registry, and what the steps share: the inputs `make` builds, reading Pods, their
//! logs and the shard Leases.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::support::{ControlPlane, Kubectl, cluster_script, ensure_greeting_pod, eventually};

/// What anything on the node may take (a Pod scheduled, its image pulled, run to the end) on
/// the busy 2-core machine.
pub const WAIT: Duration = Duration::from_secs(90);

/// How long "nothing more happens" is watched for.
pub const QUIET: Duration = Duration::from_secs(5);

/// The image the Deployment runs (`deploy/kustomization.yaml`'s `images:`).
pub const RUNTIME_IMAGE: &str = "kubewasm/runtime:dev";

/// The runtime's namespace (Deployment, Leases, module ConfigMap).
pub const SYSTEM: &str = "kubewasm-system";

/// The runtime Pods' labels.
pub const RUNTIME_SELECTOR: &str =
    "app.kubernetes.io/name=kubewasm,app.kubernetes.io/component=runtime";

/// The shard Lease of `tenant` (a namespace, or a ClusterWasmController's name) as the
/// Deployment runs: `kubewasm run`'s default `--leader-election-id` and `--shards`.
pub fn shard_lease(tenant: &str) -> String {
    format!(
        "kubewasm-shard-{:03}",
        kubewasm::controller::shard_of(tenant, kubewasm::controller::DEFAULT_SHARDS)
    )
}

pub use kubewasm_test_support::cluster::{sha256, workspace};

/// What `make image install-files` builds, found and checked before anything starts.
#[derive(Debug)]
pub struct Inputs {
    /// The runtime image (docker-archive).
    pub image_tar: PathBuf,
    /// `hello_world.wasm` (`make guests`).
    pub hello_wasm: PathBuf,
    /// `configmap_restarter.wasm`.
    pub restarter_wasm: PathBuf,
    /// `hostile.wasm`, the hostile tenant's guest.
    pub hostile_wasm: PathBuf,
}

impl Inputs {
    /// The image (`KUBEWASM_IMAGE_TAR`, else `$KUBEWASM_CACHE/images/kubewasm.tar`), the guests
    /// (`KUBEWASM_GUEST_DIR`, else `target/wasm32-wasip2/guest`) and the tutorials overlay's
    /// generated files, which must be copies of what they are made from.
    pub fn find() -> Result<Inputs> {
        let image_tar = match std::env::var_os("KUBEWASM_IMAGE_TAR").filter(|v| !v.is_empty()) {
            Some(path) => PathBuf::from(path),
            None => {
                let cache = match std::env::var_os("KUBEWASM_CACHE").filter(|v| !v.is_empty()) {
                    Some(cache) => PathBuf::from(cache),
                    None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?)
                        .join(".cache/kubewasm"),
                };
                cache.join("images/kubewasm.tar")
            }
        };
        ensure!(
            image_tar.is_file(),
            "no runtime image at {} (KUBEWASM_IMAGE_TAR, else $KUBEWASM_CACHE/images/kubewasm.tar): run `make image` first",
            image_tar.display()
        );
        let guests = match std::env::var_os("KUBEWASM_GUEST_DIR").filter(|v| !v.is_empty()) {
            Some(dir) => PathBuf::from(dir),
            None => workspace().join("target/wasm32-wasip2/guest"),
        };
        // The tutorial guests as shipped (and packed by `make install-files`): built without WASI.
        let shipped = match std::env::var_os("KUBEWASM_GUEST_DIR_NO_WASI").filter(|v| !v.is_empty())
        {
            Some(dir) => PathBuf::from(dir),
            None => workspace().join("target/wasm32-unknown-unknown/guest"),
        };
        let hello_wasm = shipped.join("hello_world.wasm");
        let restarter_wasm = shipped.join("configmap_restarter.wasm");
        let hostile_wasm = guests.join("hostile.wasm");
        for guest in [&hello_wasm, &restarter_wasm, &hostile_wasm] {
            ensure!(
                guest.is_file(),
                "no guest {}: run `make guests` (or `make install-files`) first",
                guest.display()
            );
        }
        check_overlay(&hello_wasm, &restarter_wasm)?;
        Ok(Inputs {
            image_tar,
            hello_wasm,
            restarter_wasm,
            hostile_wasm,
        })
    }
}

/// The tutorials overlay's `generated/` holds what `make install-files` copies there, and the
/// copies are current (the same CRDs, manifests and guests as the checkout's).
fn check_overlay(hello_wasm: &Path, restarter_wasm: &Path) -> Result<()> {
    let ws = workspace();
    let generated = ws.join("deploy/overlays/tutorials/generated");
    let copies = [
        (
            "crds/kubewasm.dev.yaml",
            ws.join("deploy/crds/kubewasm.dev.yaml"),
        ),
        (
            "hello-world/crd.yaml",
            ws.join("deploy/examples/hello-world/crd.yaml"),
        ),
        (
            "hello-world/rbac.yaml",
            ws.join("deploy/examples/hello-world/rbac.yaml"),
        ),
        (
            "hello-world/controller.yaml",
            ws.join("deploy/examples/hello-world/controller.yaml"),
        ),
        (
            "configmap-restarter/rbac.yaml",
            ws.join("deploy/examples/configmap-restarter/rbac.yaml"),
        ),
        (
            "configmap-restarter/controller.yaml",
            ws.join("deploy/examples/configmap-restarter/controller.yaml"),
        ),
    ];
    for (copy, source) in copies {
        let path = generated.join(copy);
        let copied = std::fs::read(&path).map_err(|e| {
            anyhow::anyhow!("{}: {e}: run `make install-files` first", path.display())
        })?;
        let original = std::fs::read(&source).with_context(|| source.display().to_string())?;
        ensure!(
            copied == original,
            "{} differs from {}: run `make install-files` again",
            path.display(),
            source.display()
        );
    }
    for (gz, guest) in [
        ("hello_world.wasm.gz", hello_wasm),
        ("configmap_restarter.wasm.gz", restarter_wasm),
    ] {
        let path = generated.join(gz);
        let file = std::fs::File::open(&path).map_err(|e| {
            anyhow::anyhow!("{}: {e}: run `make install-files` first", path.display())
        })?;
        let mut unpacked = Vec::new();
        flate2::read::GzDecoder::new(file)
            .read_to_end(&mut unpacked)
            .with_context(|| format!("gunzipping {}", path.display()))?;
        let built = std::fs::read(guest).with_context(|| guest.display().to_string())?;
        ensure!(
            unpacked == built,
            "{} is not {} as built now: run `make install-files` again",
            path.display(),
            guest.display()
        );
    }
    Ok(())
}

/// Whether this process runs as root (`up --node` runs containerd and the kubelet).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let uids = status.lines().find(|l| l.starts_with("Uid:"))?.to_owned();
            Some(uids.split_whitespace().nth(1)? == "0")
        })
        .unwrap_or(false)
}

/// The control plane with its node, for the whole run; `cluster.sh down` when stopped or
/// dropped (a panic included), and the watchdog of `--watch-pid` when the process dies.
pub struct NodeCluster {
    control_plane: Option<ControlPlane>,
    state_dir: PathBuf,
    /// `kubectl` as the admin.
    pub kubectl: Kubectl,
    /// An admin client.
    pub client: Client,
    /// containerd's socket on the node (`ctr --address`).
    pub containerd_socket: String,
}

impl NodeCluster {
    /// `cluster.sh up --node --watch-pid <this process>` in
    /// `target/tmp/control-planes/e2e.<pid>/`; returns once Node `kubewasm-node` is Ready.
    pub async fn start() -> Result<NodeCluster> {
        ensure!(
            is_root(),
            "the end-to-end test needs root: `cluster.sh up --node` runs containerd and the kubelet"
        );
        let state_dir = ControlPlane::state_dir_of_this_process();
        let dir = state_dir.clone();
        let pid = std::process::id();
        let control_plane =
            tokio::task::spawn_blocking(move || ControlPlane::start_with_node(&dir, Some(pid)))
                .await??;
        let env = control_plane.cluster_env();
        ensure!(
            env.get("KUBEWASM_NODE").map(String::as_str) == Some("true"),
            "`cluster.sh up --node` started no node (cluster.env: {env:?})"
        );
        let containerd_socket = env
            .get("KUBEWASM_CONTAINERD_SOCK")
            .cloned()
            .unwrap_or_else(|| "/run/kubewasm-node/containerd.sock".to_owned());
        let kubectl = control_plane.kubectl();
        let client = match control_plane.client().await {
            Ok(client) => client,
            Err(error) => {
                let _ = control_plane.stop();
                return Err(error);
            }
        };
        Ok(NodeCluster {
            control_plane: Some(control_plane),
            state_dir,
            kubectl,
            client,
            containerd_socket,
        })
    }

    /// Where the cluster's state and logs are (kept after `down`).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The control plane (its identities: the runtime's, a team's).
    pub fn control_plane(&self) -> Result<&ControlPlane> {
        self.control_plane
            .as_ref()
            .context("the control plane was stopped")
    }

    /// `cluster.sh image-push <tar> kubewasm/runtime:dev`: into the node's registry, which
    /// containerd uses as its docker.io mirror.
    pub async fn push_image(&self, image_tar: &Path) -> Result<()> {
        let out = tokio::process::Command::new("bash")
            .arg(cluster_script())
            .arg("image-push")
            .arg(image_tar)
            .arg(RUNTIME_IMAGE)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .context("running cluster.sh image-push")?;
        if !out.status.success() {
            bail!(
                "`cluster.sh image-push {} {RUNTIME_IMAGE}` failed ({}): {}",
                image_tar.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// `ctr -n k8s.io --address <node's containerd> <args>`.
    pub async fn ctr(&self, args: &[&str]) -> Result<String> {
        let out = tokio::process::Command::new("ctr")
            .args(["-n", "k8s.io", "--address", &self.containerd_socket])
            .args(args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .context("running ctr (containerd's client, installed by `cluster.sh up --node`)")?;
        if !out.status.success() {
            bail!(
                "`ctr {}` failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// What a failure needs to be understood, into `<state dir>/e2e-diagnostics.txt` (the
    /// cluster's own logs are in `<state dir>/logs/`).
    pub async fn diagnostics(&self) {
        let mut text = String::new();
        let commands: &[&[&str]] = &[
            &["get", "nodes", "-o", "wide"],
            &["get", "pods", "-A", "-o", "wide"],
            &["-n", SYSTEM, "get", "leases", "-o", "wide"],
            &["-n", SYSTEM, "describe", "pods", "-l", RUNTIME_SELECTOR],
            &[
                "-n",
                SYSTEM,
                "logs",
                "-l",
                RUNTIME_SELECTOR,
                "--prefix",
                "--tail=5000",
            ],
            &[
                "get",
                "wasmcontrollers,clusterwasmcontrollers",
                "-A",
                "-o",
                "yaml",
            ],
            &["get", "events", "-A", "--sort-by=.lastTimestamp"],
        ];
        for args in commands {
            text.push_str(&format!("### kubectl {}\n", args.join(" ")));
            match self.kubectl.run(args).await {
                Ok(out) => text.push_str(&out),
                Err(error) => text.push_str(&format!("{error:#}\n")),
            }
            text.push('\n');
        }
        let path = self.state_dir.join("e2e-diagnostics.txt");
        match std::fs::write(&path, &text) {
            Ok(()) => eprintln!(
                "e2e: diagnostics in {} (cluster logs in {})",
                path.display(),
                self.state_dir.join("logs").display()
            ),
            Err(error) => eprintln!("e2e: cannot write {}: {error}\n{text}", path.display()),
        }
    }

    /// `cluster.sh down`: the node (every container, the kubelet, containerd, the registry)
    /// and the control plane.
    pub async fn stop(&mut self) -> Result<()> {
        let Some(control_plane) = self.control_plane.take() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || control_plane.stop()).await?
    }
}

impl Drop for NodeCluster {
    fn drop(&mut self) {
        if let Some(control_plane) = self.control_plane.take() {
            eprintln!("e2e: stopping the cluster (cluster.sh down)");
            if let Err(error) = control_plane.stop() {
                eprintln!("e2e: {error:#}");
            }
        }
    }
}

/// The Pods of `namespace` matching `selector` that are not being deleted, by name.
pub async fn live_pods(
    client: &Client,
    namespace: &str,
    selector: &str,
) -> Result<BTreeMap<String, Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    Ok(pods
        .list(&ListParams::default().labels(selector))
        .await?
        .into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .map(|pod| (pod.name_any(), pod))
        .collect())
}

/// Whether a Pod is Running and Ready.
pub fn running_and_ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A Pod's phase, `?` before it has one.
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("?")
}

/// The live Pods matching `selector` once there are `count` of them, all Running and Ready
/// and none of them in `not` (names).
pub async fn wait_running(
    client: &Client,
    namespace: &str,
    selector: &str,
    count: usize,
    not: &[String],
    timeout: Duration,
) -> Result<BTreeMap<String, Pod>> {
    eventually(
        &format!("{count} Pods {selector} in {namespace} are Running and Ready (none of {not:?})"),
        timeout,
        || async {
            let pods = live_pods(client, namespace, selector).await?;
            let states: Vec<String> = pods
                .values()
                .map(|p| {
                    let ready = if running_and_ready(p) {
                        "ready"
                    } else {
                        "not ready"
                    };
                    format!("{} {} {ready}", p.name_any(), phase(p))
                })
                .collect();
            ensure!(
                pods.len() == count && pods.values().all(running_and_ready),
                "{states:?}"
            );
            let old: Vec<&String> = pods.keys().filter(|n| not.contains(n)).collect();
            ensure!(old.is_empty(), "still there: {old:?}");
            Ok(Some(pods))
        },
    )
    .await
}

/// Waits until Pod `namespace/name` runs `echo <greeting>` to the end (`Succeeded`) and, with
/// `replaces`, is another Pod than that uid. Returns it.
pub async fn wait_greeting(
    client: &Client,
    namespace: &str,
    name: &str,
    greeting: &str,
    replaces: Option<&str>,
    timeout: Duration,
) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let what = match replaces {
        Some(uid) => format!(
            "Pod {namespace}/{name} (uid {uid}) is replaced by one that echoes {greeting:?} and Succeeded"
        ),
        None => format!("Pod {namespace}/{name} echoes {greeting:?} and Succeeded"),
    };
    eventually(&what, timeout, || async {
        let Some(pod) = pods.get_opt(name).await? else {
            bail!("no Pod {name}");
        };
        ensure_greeting_pod(&pod, greeting, replaces)?;
        let uid = pod.uid().unwrap_or_default();
        match phase(&pod) {
            "Succeeded" => Ok(Some(pod)),
            "Failed" => bail!("Pod {name} failed: {:?}", pod.status),
            other => bail!("Pod {name} (uid {uid}) is {other}"),
        }
    })
    .await
}

/// `kubectl -n hello patch helloworld your-name` to greet `who` (the tutorial's own step).
pub async fn patch_who(kubectl: &Kubectl, who: &str) -> Result<()> {
    let patch = serde_json::json!({"spec": {"who": who}}).to_string();
    kubectl
        .run(&[
            "-n",
            "hello",
            "patch",
            "helloworld",
            "your-name",
            "--type=merge",
            "-p",
            &patch,
        ])
        .await
        .map(drop)
}

/// Waits until `kubectl -n <namespace> logs <pod>` prints exactly `line`.
pub async fn wait_logs(kubectl: &Kubectl, namespace: &str, pod: &str, line: &str) -> Result<()> {
    eventually(
        &format!("`kubectl -n {namespace} logs {pod}` prints {line:?}"),
        Duration::from_secs(30),
        || async {
            let logs = kubectl.run(&["-n", namespace, "logs", pod]).await?;
            ensure!(logs.trim_end() == line, "it prints {logs:?}");
            Ok(Some(()))
        },
    )
    .await
}

/// The `holderIdentity` (`<HOSTNAME>-<nonce>-<pid>`) of `tenant`'s shard Lease, if anyone
/// holds it.
pub async fn shard_holder(client: &Client, tenant: &str) -> Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), SYSTEM);
    Ok(leases
        .get_opt(&shard_lease(tenant))
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// Waits until the shard Leases are split evenly between the runtime Pods `names` (each
/// Lease held by one of them, none holding more than its share): how many each holds.
pub async fn wait_shares(
    client: &Client,
    names: &[String],
    wait: Duration,
) -> Result<std::collections::BTreeMap<String, usize>> {
    let shards = kubewasm::controller::DEFAULT_SHARDS as usize;
    let share = shards.div_ceil(names.len());
    let leases: Api<Lease> = Api::namespaced(client.clone(), SYSTEM);
    eventually(
        &format!("{shards} shard Leases split between {names:?}, at most {share} each"),
        wait,
        || async {
            let listed = leases
                .list(&kube::api::ListParams::default().labels("kubewasm.dev/role=shard"))
                .await?;
            let mut held: std::collections::BTreeMap<String, usize> =
                names.iter().map(|n| (n.clone(), 0)).collect();
            for lease in &listed.items {
                let holder = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.clone())
                    .unwrap_or_default();
                let pod = holder_pod(&holder, names)
                    .with_context(|| format!("{:?} is held by {holder:?}", lease.metadata.name))?;
                *held.entry(pod).or_default() += 1;
            }
            ensure!(
                held.values().sum::<usize>() == shards && held.values().all(|n| *n <= share),
                "held: {held:?}"
            );
            Ok(Some(held))
        },
    )
    .await
}

/// The runtime Pod that runs `tenant`'s controllers: the one holding its shard.
pub async fn runner_pod(client: &Client, tenant: &str) -> Result<String> {
    let holder = shard_holder(client, tenant)
        .await?
        .with_context(|| format!("nobody holds Lease {}", shard_lease(tenant)))?;
    let names: Vec<String> = live_pods(client, SYSTEM, RUNTIME_SELECTOR)
        .await?
        .into_keys()
        .collect();
    holder_pod(&holder, &names).with_context(|| {
        format!(
            "the holder {holder:?} of {} is none of {names:?}",
            shard_lease(tenant)
        )
    })
}

/// The Pod among `pods` whose name (the runtime's HOSTNAME) a Lease holder's identity
/// starts with.
pub fn holder_pod<'p>(holder: &str, pods: impl IntoIterator<Item = &'p String>) -> Option<String> {
    let matching: Vec<&String> = pods
        .into_iter()
        .filter(|name| holder.starts_with(&format!("{name}-")))
        .collect();
    match matching[..] {
        [one] => Some(one.clone()),
        _ => None,
    }
}
