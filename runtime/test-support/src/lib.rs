//! What kubewasm's tests and benches share, one crate instead of files included by path:
//! a real Kubernetes control plane ([`ControlPlane`]), the runtime as a child process
//! ([`runtime`]), the live tests' cluster helpers ([`cluster`]), the built guests
//! ([`guests`]), manifests, waits and logs.
//!
//! [`ControlPlane::shared`] starts one control plane per test binary with
//! `deploy/dev/local/cluster.sh up --watch-pid <this process>` (etcd, kube-apiserver and
//! kube-controller-manager on free loopback ports). The script's detached watchdog stops it
//! within seconds once the test binary is gone, however it ended — even by SIGKILL — so no
//! process outlives the tests. With `KUBEWASM_TEST_KUBECONFIG` set to a kubeconfig, the same
//! tests run against that cluster instead and nothing is started.
//!
//! Only the started control plane (a kubeconfig path) is shared: every `#[tokio::test]` has
//! its own runtime, and a `Client` made in one runtime dies with it, so each test makes its
//! own clients with [`ControlPlane::client`].

pub mod cluster;
pub mod guests;
pub mod hostile_registry;
mod identity;
mod kubectl;
mod log_server;
mod logs;
mod manifest;
pub mod registry;
pub mod runtime;
pub mod shards;
mod team;
mod wait;

use std::{
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::{Namespace, Pod, ServiceAccount},
};
use kube::{
    Api, Client, Config,
    api::{DeleteParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
// Each test binary uses its own part of these too.
#[allow(unused_imports)]
pub use identity::{
    RUNTIME_ACCOUNT, RUNTIME_NAMESPACE, RUNTIME_WATCH_ROLE, TENANT_LABEL, runtime_rbac,
    tenant_binding,
};
#[allow(unused_imports)]
pub use kubectl::Kubectl;
#[allow(unused_imports)]
pub use log_server::{LOGS_API_SERVICE, free_port, host_address, logs_manifest, logs_rbac};
#[allow(unused_imports)]
pub use logs::{LogLines, json_log_lines};
#[allow(unused_imports)]
pub use manifest::{FIELD_MANAGER, apply, apply_all, documents};
#[allow(unused_imports)]
pub use team::TeamUser;
#[allow(unused_imports)]
pub use wait::{ensure_greeting_pod, eventually};

/// Names a kubeconfig of an existing cluster to run the tests against.
pub const TEST_KUBECONFIG_ENV: &str = "KUBEWASM_TEST_KUBECONFIG";

/// Label put on every namespace that [`ControlPlane::namespace`] creates.
pub const TEST_NAMESPACE_LABEL: &str = "kubewasm.dev/test";

/// How long a fresh namespace may take until Pods can be created in it.
const NAMESPACE_READY: Duration = Duration::from_secs(30);

/// A Kubernetes API server the tests talk to: one this process started, or an existing one.
#[derive(Debug)]
pub struct ControlPlane {
    kubeconfig: PathBuf,
    /// The `cluster.sh` state directory, for a control plane that we started.
    state_dir: Option<PathBuf>,
    /// The kubeconfig `kubewasm run` uses, made on first use ([`Self::runtime_kubeconfig`]).
    runtime_kubeconfig: OnceLock<Result<PathBuf, String>>,
}

/// `deploy/dev/local/cluster.sh` of this checkout.
pub fn cluster_script() -> PathBuf {
    workspace().join("deploy/dev/local/cluster.sh")
}

impl ControlPlane {
    /// The control plane of this test binary, started on first use (blocking; a cold cache
    /// builds Kubernetes first, which takes minutes). Panics with the script's output if it
    /// cannot be started.
    pub fn shared() -> &'static ControlPlane {
        static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
        match SHARED.get_or_init(|| Self::start_shared().map_err(|e| format!("{e:#}"))) {
            Ok(control_plane) => control_plane,
            Err(error) => panic!("no Kubernetes control plane for the tests: {error}"),
        }
    }

    fn start_shared() -> Result<ControlPlane> {
        if let Some(path) = std::env::var_os(TEST_KUBECONFIG_ENV).filter(|p| !p.is_empty()) {
            let kubeconfig = PathBuf::from(path);
            if !kubeconfig.is_file() {
                bail!(
                    "{TEST_KUBECONFIG_ENV}={} is not a file",
                    kubeconfig.display()
                );
            }
            return Ok(ControlPlane {
                kubeconfig,
                state_dir: None,
                runtime_kubeconfig: OnceLock::new(),
            });
        }
        Self::start(&Self::state_dir_of_this_process(), Some(std::process::id()))
    }

    /// `target/tmp/control-planes/<test binary>.<pid>/`: where this test process keeps the
    /// state (and logs) of a control plane it starts. State directories of test processes
    /// that are gone and whose control plane was stopped are removed first.
    pub fn state_dir_of_this_process() -> PathBuf {
        let root = target_tmp().join("control-planes");
        prune_stale_state_dirs(&root);
        let binary = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "tests".to_owned());
        root.join(format!("{binary}.{}", std::process::id()))
    }

    /// Starts a control plane of its own in `state_dir` (`cluster.sh up`). With `watch_pid`,
    /// the script's watchdog stops it once that process is gone; without, call [`Self::stop`].
    pub fn start(state_dir: &Path, watch_pid: Option<u32>) -> Result<ControlPlane> {
        Self::up(state_dir, watch_pid, false, true)
    }

    /// Like [`Self::start`], without kube-controller-manager's token controller (no token
    /// Secret per ServiceAccount, as from Kubernetes 1.24 on; Pods cannot be created then):
    /// for a bench of many namespaces, which 1.20's token controller would otherwise write
    /// Secrets into for most of an hour beside every run.
    pub fn start_without_tokens(state_dir: &Path, watch_pid: Option<u32>) -> Result<ControlPlane> {
        Self::up(state_dir, watch_pid, false, false)
    }

    /// Like [`Self::start`], with one real node that runs Pods (`cluster.sh up --node`: the
    /// kubelet, containerd, kube-scheduler and a local registry; root only, one node per
    /// machine). Returns once the Node is Ready. [`Self::stop`] stops the node too.
    pub fn start_with_node(state_dir: &Path, watch_pid: Option<u32>) -> Result<ControlPlane> {
        Self::up(state_dir, watch_pid, true, true)
    }

    fn up(
        state_dir: &Path,
        watch_pid: Option<u32>,
        node: bool,
        tokens: bool,
    ) -> Result<ControlPlane> {
        std::fs::create_dir_all(state_dir)
            .with_context(|| format!("creating {}", state_dir.display()))?;
        let mut up = Command::new("bash");
        up.arg(cluster_script()).arg("up");
        if node {
            up.arg("--node");
        }
        if let Some(pid) = watch_pid {
            up.arg("--watch-pid").arg(pid.to_string());
        }
        up.arg(state_dir).stdin(Stdio::null());
        if !tokens {
            up.env("KUBEWASM_NO_TOKEN_CONTROLLER", "1");
        }
        let started = Instant::now();
        let out = up
            .output()
            .context("running deploy/dev/local/cluster.sh up")?;
        let log = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!(
                "`cluster.sh up {}{}` failed ({}):\n{log}",
                if node { "--node " } else { "" },
                state_dir.display(),
                out.status
            );
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let kubeconfig = stdout
            .lines()
            .last()
            .and_then(|line| line.strip_prefix("export KUBECONFIG="))
            .with_context(|| format!("`cluster.sh up` printed no KUBECONFIG:\n{stdout}\n{log}"))?;
        eprintln!("control plane started in {:.1?}:\n{log}", started.elapsed());
        Ok(ControlPlane {
            kubeconfig: kubeconfig.into(),
            state_dir: Some(state_dir.to_owned()),
            runtime_kubeconfig: OnceLock::new(),
        })
    }

    /// Stops a control plane that we started (`cluster.sh down`); does nothing for an
    /// existing cluster.
    pub fn stop(&self) -> Result<()> {
        let Some(state_dir) = &self.state_dir else {
            return Ok(());
        };
        // Traced (`bash -x`), the trace kept in the state directory: a teardown that fails
        // says where. `down` is idempotent, and a node's teardown can race its containers'
        // last exits: a failure is said and tried once more; only a second failure fails.
        let trace = state_dir.join("down-trace.log");
        let down = |traced: bool| -> Result<std::process::Output> {
            let mut command = Command::new("bash");
            if traced {
                command.arg("-x");
            }
            command
                .arg(cluster_script())
                .arg("down")
                .arg(state_dir)
                .stdin(Stdio::null())
                .output()
                .context("running deploy/dev/local/cluster.sh down")
        };
        let first = down(true)?;
        let _ = std::fs::write(&trace, &first.stderr);
        if first.status.success() {
            return Ok(());
        }
        let tail = |out: &std::process::Output| {
            let text = String::from_utf8_lossy(&out.stderr);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        eprintln!(
            "`cluster.sh down` failed ({}), trying once more; the end of its trace ({}):\n{}",
            first.status,
            trace.display(),
            tail(&first)
        );
        std::thread::sleep(std::time::Duration::from_secs(2));
        let second = down(false)?;
        if !second.status.success() {
            bail!(
                "`cluster.sh down` failed twice ({}): {}\nthe first attempt's trace: {}",
                second.status,
                String::from_utf8_lossy(&second.stderr),
                trace.display()
            );
        }
        Ok(())
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The `cluster.sh` state directory (logs, pids), if we started this control plane.
    pub fn state_dir(&self) -> Option<&Path> {
        self.state_dir.as_deref()
    }

    /// Pids recorded in the state directory (etcd, kube-apiserver, ..., watchdog).
    pub fn recorded_pids(&self) -> Vec<u32> {
        let Some(dir) = &self.state_dir else {
            return Vec::new();
        };
        let Ok(entries) = std::fs::read_dir(dir.join("pids")) else {
            return Vec::new();
        };
        entries
            .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path()).ok())
            .filter_map(|pid| pid.trim().parse().ok())
            .collect()
    }

    /// The variables `cluster.sh up` wrote to `cluster.env` (ports, version, ...).
    pub fn cluster_env(&self) -> HashMap<String, String> {
        let Some(dir) = &self.state_dir else {
            return HashMap::new();
        };
        std::fs::read_to_string(dir.join("cluster.env"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect()
    }

    /// The loopback ports this control plane listens on (empty for an existing cluster).
    pub fn ports(&self) -> Vec<u16> {
        let env = self.cluster_env();
        [
            "KUBEWASM_APISERVER_PORT",
            "KUBEWASM_ETCD_PORT",
            "KUBEWASM_ETCD_PEER_PORT",
        ]
        .iter()
        .filter_map(|key| env.get(*key)?.parse().ok())
        .collect()
    }

    /// Whether kube-controller-manager runs (Deployments get Pods, garbage is collected).
    /// Assumed for an existing cluster.
    pub fn has_controller_manager(&self) -> bool {
        self.state_dir.is_none()
            || self
                .cluster_env()
                .get("KUBEWASM_KUBE_CONTROLLER_MANAGER")
                .map(String::as_str)
                == Some("true")
    }

    /// A client config for the admin (group `system:masters`).
    pub async fn config(&self) -> Result<Config> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("reading {}", self.kubeconfig.display()))?;
        Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    /// A new admin client, bound to the calling test's runtime.
    pub async fn client(&self) -> Result<Client> {
        Ok(Client::try_from(self.config().await?)?)
    }

    /// A client that authenticates as ServiceAccount `namespace/name` with a token from the
    /// TokenRequest API, so Kubernetes RBAC decides what it may do.
    pub async fn client_for_service_account(&self, namespace: &str, name: &str) -> Result<Client> {
        let token = self
            .service_account_token(namespace, name, Duration::from_secs(3600))
            .await?;
        let mut config = self.config().await?;
        config.auth_info = serde_json::from_value(serde_json::json!({ "token": token }))?;
        Ok(Client::try_from(config)?)
    }

    /// A token for ServiceAccount `namespace/name` from the TokenRequest API.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
        lifetime: Duration,
    ) -> Result<String> {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client().await?, namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(lifetime.as_secs().try_into()?),
                ..Default::default()
            },
            ..Default::default()
        };
        Ok(accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .with_context(|| format!("TokenRequest for ServiceAccount {namespace}/{name}"))?
            .status
            .context("TokenRequest came back without a status")?
            .token)
    }

    /// Creates a namespace named `<prefix>-<random>`, labelled [`TEST_NAMESPACE_LABEL`], and
    /// waits until Pods can be created in it (its `default` ServiceAccount, which the
    /// ServiceAccount admission plugin needs, comes from kube-controller-manager a moment later).
    pub async fn namespace(&self, prefix: &str) -> Result<String> {
        let client = self.client().await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let prefix: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        let mut tries = 0;
        let name = loop {
            let name = format!("{prefix}-{:08x}", RandomState::new().hash_one(tries) as u32);
            let namespace: Namespace = serde_json::from_value(serde_json::json!({
                "metadata": { "name": name, "labels": { TEST_NAMESPACE_LABEL: "true" } }
            }))?;
            match namespaces.create(&PostParams::default(), &namespace).await {
                Ok(_) => break name,
                Err(kube::Error::Api(status)) if status.code == 409 && tries < 5 => tries += 1,
                Err(error) => return Err(error).context(format!("creating namespace {name}")),
            }
        };
        self.opt_in(client, &name).await?;
        Ok(name)
    }

    /// Creates namespace `name` exactly (a test that needs names of its choosing, e.g. tenants
    /// in given shards), as [`Self::namespace`] does.
    pub async fn namespace_named(&self, name: &str) -> Result<String> {
        let client = self.client().await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { TEST_NAMESPACE_LABEL: "true" } }
        }))?;
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        self.opt_in(client, name).await?;
        Ok(name.to_owned())
    }

    /// Opts namespace `name` in and waits until Pods can be created in it.
    async fn opt_in(&self, client: Client, name: &str) -> Result<()> {
        let name = name.to_owned();
        // Opted in to WasmControllers: the cluster admin's label, and deploy/runtime/tenant.yaml.
        self.enable_tenant(&name).await?;
        apply_all(&client, &[identity::tenant_binding(&name)?]).await?;
        let pods: Api<Pod> = Api::namespaced(client, &name);
        let probe: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "admission-probe" },
            "spec": { "containers": [{ "name": "probe", "image": "registry.k8s.io/pause:3.9" }] }
        }))?;
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        eventually(
            &format!("Pods can be created in namespace {name} (its default ServiceAccount)"),
            NAMESPACE_READY,
            || async {
                match pods.create(&dry_run, &probe).await {
                    Ok(_) => Ok(Some(())),
                    // Only a missing ServiceAccount (or its token) is worth waiting for.
                    Err(error) if error.to_string().to_lowercase().contains("service account") => {
                        Err(error.into())
                    }
                    Err(_) => Ok(Some(())),
                }
            },
        )
        .await
    }

    /// Deletes a namespace made by [`Self::namespace`] (without waiting for it to go).
    pub async fn delete_namespace(&self, name: &str) -> Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.client().await?);
        match namespaces.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error).context(format!("deleting namespace {name}")),
        }
    }
}

/// Removes state directories (`<binary>.<pid>`) of test processes that are gone and whose
/// control plane was stopped (no pid file left: the watchdog may still be stopping it), so
/// that `target/tmp` keeps only the logs of runs that may still be of interest.
fn prune_stale_state_dirs(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.rsplit('.').next()?.parse::<u32>().ok())
        else {
            continue;
        };
        let stopped = std::fs::read_dir(entry.path().join("pids"))
            .map_or(true, |mut pids| pids.next().is_none());
        if stopped && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The workspace's root directory.
pub fn workspace() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// Cargo's build directory of the running test or bench binary (`<target>/<profile>`): the
/// binary runs from its `deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running test binary");
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .expect("a test binary runs from <target>/<profile>/deps")
}

/// Bytes of the files under `dir`, its subdirectories included (0 when it cannot be read): what
/// a cache directory holds on disk.
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(read) = std::fs::read_dir(dir) else {
        return 0;
    };
    read.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

/// Where tests keep their files (`<target>/tmp`, what cargo names `CARGO_TARGET_TMPDIR`).
pub fn target_tmp() -> PathBuf {
    let dir = profile_dir()
        .parent()
        .map(|target| target.join("tmp"))
        .expect("<target>/<profile> has a parent");
    std::fs::create_dir_all(&dir).expect("creating <target>/tmp");
    dir
}
