//! A team's identity for the tests: a person who is only `admin` of its own namespace (the
//! built-in ClusterRole, bound by a RoleBinding there), as a cluster admin makes a team on a
//! shared cluster. What such a user may do is what Kubernetes RBAC gives it: the tests of a
//! team's day on the runtime act through it, never as the cluster admin.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;

use super::{ControlPlane, apply_all, eventually};

/// How long a new RoleBinding may take to reach the API server's authorizer.
const BOUND: Duration = Duration::from_secs(20);

/// A user who is `admin` of one namespace and nothing else.
#[derive(Debug, Clone)]
pub struct TeamUser {
    /// The user's name, as the API server knows it (group `system:authenticated` only).
    pub name: String,
    /// The namespace it is `admin` of.
    pub namespace: String,
    /// A kubeconfig that acts as this user (mode 0600): for `kubectl` and `kubewasm` commands
    /// run as the team.
    pub kubeconfig: PathBuf,
}

impl TeamUser {
    /// A client that acts as this user.
    pub async fn client(&self) -> Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("reading {}", self.kubeconfig.display()))?;
        let config =
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }
}

impl ControlPlane {
    /// Makes `user` the `admin` of `namespace` (a RoleBinding of the built-in ClusterRole
    /// `admin`, as a cluster admin does for a team) and returns its identity, once the API
    /// server's authorizer knows the binding.
    ///
    /// The user is impersonated with the admin's credentials (`as:` in the kubeconfig, as
    /// `kubectl --as` does): the API server authenticates the admin, then authorizes every
    /// request as `user` in group `system:authenticated` alone.
    pub async fn namespace_admin(&self, namespace: &str, user: &str) -> Result<TeamUser> {
        self.namespace_user(namespace, user, "admin").await
    }

    /// As [`Self::namespace_admin`], with the built-in ClusterRole `role` (`view`, `edit`,
    /// `admin`) in `namespace`.
    pub async fn namespace_user(
        &self,
        namespace: &str,
        user: &str,
        role: &str,
    ) -> Result<TeamUser> {
        let admin = self.client().await?;
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": { "name": format!("team-{role}-{user}"), "namespace": namespace },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
        });
        apply_all(&admin, &[binding]).await?;

        let mut kubeconfig = Kubeconfig::read_from(self.kubeconfig())
            .with_context(|| format!("reading {}", self.kubeconfig().display()))?;
        for named in &mut kubeconfig.auth_infos {
            if let Some(auth) = named.auth_info.as_mut() {
                auth.impersonate = Some(user.to_owned());
            }
        }
        let path = match self.state_dir() {
            Some(dir) => dir.join(format!("team.{namespace}.{user}.kubeconfig")),
            None => super::target_tmp().join(format!(
                "team.{namespace}.{user}.{}.kubeconfig",
                std::process::id()
            )),
        };
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        out.write_all(serde_yaml::to_string(&kubeconfig)?.as_bytes())?;

        let team = TeamUser {
            name: user.to_owned(),
            namespace: namespace.to_owned(),
            kubeconfig: path,
        };
        let reviews: Api<SelfSubjectAccessReview> = Api::all(team.client().await?);
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.to_owned()),
                    verb: Some("get".to_owned()),
                    resource: Some("configmaps".to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        eventually(
            &format!("user {user} may get ConfigMaps in {namespace} (RoleBinding to {role})"),
            BOUND,
            || async {
                let answer = reviews.create(&PostParams::default(), &review).await?;
                Ok(answer.status.is_some_and(|s| s.allowed).then_some(()))
            },
        )
        .await?;
        Ok(team)
    }
}
