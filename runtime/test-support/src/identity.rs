//! The runtime's own identity for the tests: `deploy/runtime/rbac.yaml` applied to the control
//! plane, and a kubeconfig that authenticates as its ServiceAccount with a TokenRequest token,
//! so that `kubewasm run` under test has exactly the rights a real install gives it.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;

use super::{ControlPlane, apply_all, documents, eventually};

/// Namespace of the runtime's ServiceAccount (and of its leader-election Lease).
pub const RUNTIME_NAMESPACE: &str = "kubewasm-system";

/// The runtime's ServiceAccount.
pub const RUNTIME_ACCOUNT: &str = "kubewasm";

/// The ClusterRole that kube-controller-manager fills with the kinds the runtime may watch.
pub const RUNTIME_WATCH_ROLE: &str = "kubewasm-runtime-watch";

/// Lifetime of the runtime's token: longer than any test binary runs.
const TOKEN_LIFETIME: Duration = Duration::from_secs(4 * 3600);

/// How long kube-controller-manager may take to aggregate the watch ClusterRole.
const AGGREGATED: Duration = Duration::from_secs(30);

/// `deploy/runtime/tenant.yaml` of this checkout, for `namespace`: the RoleBinding with which
/// a cluster admin opts a namespace in to WasmControllers (the runtime may then act as its
/// ServiceAccounts).
pub fn tenant_binding(namespace: &str) -> Result<serde_json::Value> {
    let file = super::workspace().join("deploy/runtime/tenant.yaml");
    let yaml = std::fs::read_to_string(&file).with_context(|| format!("{}", file.display()))?;
    let mut binding = documents(&yaml)?
        .into_iter()
        .next()
        .context("deploy/runtime/tenant.yaml is empty")?;
    binding["metadata"]["namespace"] = json!(namespace);
    Ok(binding)
}

/// The label with which a cluster admin lets a namespace use the runtime (a namespace admin
/// cannot set it: the built-in `admin` role may not patch its Namespace).
pub const TENANT_LABEL: (&str, &str) = ("kubewasm.dev/tenant", "enabled");

/// `deploy/runtime/rbac.yaml` of this checkout.
pub fn runtime_rbac() -> PathBuf {
    super::workspace().join("deploy/runtime/rbac.yaml")
}

impl ControlPlane {
    /// The cluster admin's step for a team: labels namespace `name` [`TENANT_LABEL`]
    /// (`kubectl label namespace NAME kubewasm.dev/tenant=enabled`).
    pub async fn enable_tenant(&self, name: &str) -> Result<()> {
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client().await?);
        let (key, value) = TENANT_LABEL;
        let patch = json!({"metadata": {"labels": {key: value}}});
        namespaces
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .with_context(|| format!("labelling namespace {name} {key}={value}"))?;
        Ok(())
    }

    /// A kubeconfig for ServiceAccount `kubewasm-system/kubewasm` (same server and CA as the
    /// admin's), to run `kubewasm run` with. The first call applies `deploy/runtime/rbac.yaml`
    /// and requests the token, blocking; later calls return the same file. Panics when the
    /// identity cannot be set up.
    pub fn runtime_kubeconfig(&self) -> PathBuf {
        let made = self.runtime_kubeconfig.get_or_init(|| {
            // Our own async runtime on a thread of its own: callers are tests running on
            // theirs, which cannot be blocked on from inside.
            let installed = std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()?
                            .block_on(self.install_runtime_identity())
                    })
                    .join()
            });
            match installed {
                Ok(Ok(path)) => Ok(path),
                Ok(Err(error)) => Err(format!("{error:#}")),
                Err(_) => Err("installing it panicked".to_owned()),
            }
        });
        match made {
            Ok(path) => path.clone(),
            Err(error) => {
                panic!("no identity for `kubewasm run` (deploy/runtime/rbac.yaml): {error}")
            }
        }
    }

    /// A client that authenticates exactly as `kubewasm run` under test does (with
    /// [`Self::runtime_kubeconfig`]), bound to the calling test's runtime.
    pub async fn runtime_client(&self) -> Result<Client> {
        let path = self.runtime_kubeconfig();
        let kubeconfig =
            Kubeconfig::read_from(&path).with_context(|| format!("reading {}", path.display()))?;
        let config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// Applies the runtime's RBAC (server-side, so again and again does no harm), waits until
    /// its watch ClusterRole is aggregated, and writes the kubeconfig.
    async fn install_runtime_identity(&self) -> Result<PathBuf> {
        let client = self.client().await?;
        let file = runtime_rbac();
        let yaml = std::fs::read_to_string(&file).with_context(|| format!("{}", file.display()))?;
        apply_all(&client, &documents(&yaml)?).await?;
        // And the log server's (deploy/runtime/logs.yaml): reviews, the front proxy's CA.
        apply_all(&client, &super::logs_rbac()?).await?;
        let roles: Api<ClusterRole> = Api::all(client);
        eventually(
            &format!(
                "ClusterRole {RUNTIME_WATCH_ROLE} aggregates the built-in kinds (kube-controller-manager's clusterrole-aggregation controller)"
            ),
            AGGREGATED,
            || async {
                let rules = roles.get(RUNTIME_WATCH_ROLE).await?.rules.unwrap_or_default();
                let pods = rules.iter().any(|r| {
                    r.resources.as_ref().is_some_and(|rs| rs.iter().any(|r| r == "pods"))
                });
                Ok(pods.then_some(()))
            },
        )
        .await?;

        let path = match &self.state_dir {
            Some(dir) => dir.join("runtime.kubeconfig"),
            None => super::target_tmp().join(format!("runtime.{}.kubeconfig", std::process::id())),
        };
        self.write_service_account_kubeconfig(
            RUNTIME_NAMESPACE,
            RUNTIME_ACCOUNT,
            TOKEN_LIFETIME,
            &path,
        )
        .await?;
        Ok(path)
    }

    /// Writes to `path` (mode 0600) a kubeconfig that authenticates as ServiceAccount
    /// `namespace/name` with a TokenRequest token of `lifetime`, with the admin's server and
    /// CA: what a program run "as" that account (`kubewasm run`, another controller) uses.
    pub async fn write_service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        lifetime: Duration,
        path: &Path,
    ) -> Result<()> {
        let token = self
            .service_account_token(namespace, name, lifetime)
            .await?;
        let admin = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("reading {}", self.kubeconfig.display()))?;
        let context = admin
            .current_context
            .as_deref()
            .and_then(|name| admin.contexts.iter().find(|c| c.name == name))
            .and_then(|c| c.context.as_ref())
            .context("the admin kubeconfig has no current context")?;
        let cluster = admin
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .and_then(|c| c.cluster.as_ref())
            .with_context(|| format!("the admin kubeconfig has no cluster {}", context.cluster))?;
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": cluster}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name,
                "context": {"cluster": "cluster", "user": name}}],
            "current-context": name,
        });
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("creating {}", path.display()))?;
        out.write_all(serde_yaml::to_string(&kubeconfig)?.as_bytes())?;
        Ok(())
    }
}
