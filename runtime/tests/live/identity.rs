//! The runtime's own identity (`deploy/runtime/rbac.yaml`) is least privilege: as its
//! ServiceAccount, with the very kubeconfig `kubewasm run` gets in these tests, what the
//! runtime needs is allowed and the rest refused.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, Config};
use serde_json::json;

use crate::cluster::{WAIT, apply_all, example, prepare};
use crate::support::{ControlPlane, RUNTIME_NAMESPACE, eventually};

/// One request the runtime might make: verb, API group, resource (`resource/subresource`),
/// namespace (`""`: all namespaces or cluster-scoped).
type Request<'a> = (&'a str, &'a str, &'a str, &'a str);

#[tokio::test]
async fn runtime_identity_is_least_privilege() {
    let control_plane = ControlPlane::shared();
    let (admin, ns) = prepare(control_plane, "identity").await;
    let result = least_privilege(control_plane, &admin, &ns).await;
    let _ = control_plane.delete_namespace(&ns).await;
    result.expect("the runtime's identity");
}

async fn least_privilege(control_plane: &ControlPlane, admin: &Client, ns: &str) -> Result<()> {
    let runtime = control_plane.runtime_client().await?;
    let allowed: &[Request] = &[
        ("get", "kubewasm.dev", "wasmcontrollers", ns),
        ("get", "kubewasm.dev", "clusterwasmcontrollers", ""),
        ("list", "kubewasm.dev", "wasmcontrollers", ""),
        ("watch", "kubewasm.dev", "wasmcontrollers", ""),
        ("list", "kubewasm.dev", "clusterwasmcontrollers", ""),
        ("watch", "kubewasm.dev", "clusterwasmcontrollers", ""),
        ("patch", "kubewasm.dev", "wasmcontrollers/status", ns),
        ("patch", "kubewasm.dev", "clusterwasmcontrollers/status", ""),
        ("list", "kubewasm.dev", "wasmcontrollerstates", ns),
        ("create", "kubewasm.dev", "wasmcontrollerstates", ns),
        ("patch", "kubewasm.dev", "wasmcontrollerstates", ns),
        ("list", "", "configmaps", ""),
        ("watch", "", "configmaps", ""),
        ("create", "authorization.k8s.io", "subjectaccessreviews", ""),
        // Which namespaces a cluster admin enabled (their label): watched, read by name.
        ("list", "", "namespaces", ""),
        ("watch", "", "namespaces", ""),
        ("get", "", "namespaces", ""),
        ("impersonate", "", "serviceaccounts", ns),
        // Each ServiceAccount's own opt-in (an annotation), in opted-in namespaces.
        ("get", "", "serviceaccounts", ns),
        ("get", "coordination.k8s.io", "leases", RUNTIME_NAMESPACE),
        ("create", "coordination.k8s.io", "leases", RUNTIME_NAMESPACE),
        ("update", "coordination.k8s.io", "leases", RUNTIME_NAMESPACE),
        // Shards: the set's Leases listed every round, a gone replica's member Lease deleted.
        ("list", "coordination.k8s.io", "leases", RUNTIME_NAMESPACE),
        ("delete", "coordination.k8s.io", "leases", RUNTIME_NAMESPACE),
        // The quarantined modules (ConfigMap kubewasm-quarantine).
        ("create", "", "configmaps", RUNTIME_NAMESPACE),
        // Aggregated into kubewasm-runtime-watch: kinds controllers may make it watch.
        ("list", "", "pods", ""),
        ("watch", "", "pods", ""),
        ("watch", "", "services", ""),
        ("watch", "", "persistentvolumeclaims", ""),
        ("watch", "apps", "deployments", ""),
        ("watch", "apps", "statefulsets", ""),
        ("watch", "batch", "jobs", ""),
        ("watch", "batch", "cronjobs", ""),
    ];
    let refused: &[Request] = &[
        // Only in namespaces a cluster admin opted in (deploy/runtime/tenant.yaml), as `ns`.
        ("impersonate", "", "serviceaccounts", "kube-system"),
        ("impersonate", "", "serviceaccounts", ""),
        ("get", "", "serviceaccounts", "kube-system"),
        ("get", "", "secrets", ns),
        ("list", "", "secrets", ""),
        ("watch", "", "secrets", ""),
        ("impersonate", "", "users", ""),
        ("impersonate", "", "groups", ""),
        (
            "impersonate",
            "authentication.k8s.io",
            "userextras/scopes",
            "",
        ),
        ("create", "", "pods", ns),
        ("delete", "", "pods", ns),
        ("patch", "", "configmaps", ns),
        ("get", "", "configmaps", ns),
        ("create", "", "serviceaccounts/token", ns),
        ("update", "kubewasm.dev", "wasmcontrollers", ns),
        ("patch", "kubewasm.dev", "wasmcontrollers", ns),
        ("delete", "kubewasm.dev", "wasmcontrollers", ns),
        ("delete", "kubewasm.dev", "wasmcontrollerstates", ns),
        ("update", "kubewasm.dev", "wasmcontrollerstates", ns),
        (
            "list",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "",
        ),
        (
            "create",
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "",
        ),
        ("bind", "rbac.authorization.k8s.io", "clusterroles", ""),
        ("escalate", "rbac.authorization.k8s.io", "clusterroles", ""),
        ("create", "coordination.k8s.io", "leases", "default"),
        ("list", "coordination.k8s.io", "leases", "default"),
        ("delete", "coordination.k8s.io", "leases", "kube-system"),
        ("create", "", "namespaces", ""),
        ("patch", "", "namespaces", ""),
        ("update", "", "namespaces", ""),
        ("list", "", "nodes", ""),
    ];
    let mut wrong = Vec::new();
    for (want, requests) in [(true, allowed), (false, refused)] {
        for request in requests {
            if may(&runtime, request).await? != want {
                wrong.push(format!(
                    "{} {request:?}",
                    if want { "refused" } else { "allowed" }
                ));
            }
        }
    }
    ensure!(
        wrong.is_empty(),
        "deploy/runtime/rbac.yaml grants the wrong rights:\n{}",
        wrong.join("\n")
    );

    // The same, with real requests.
    forbidden(
        "list Secrets",
        Api::<Secret>::all(runtime.clone())
            .list(&ListParams::default())
            .await,
    )?;
    forbidden(
        "list ClusterRoleBindings",
        Api::<ClusterRoleBinding>::all(runtime.clone())
            .list(&ListParams::default())
            .await,
    )?;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "not-allowed"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }))?;
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    forbidden(
        "create a Pod",
        Api::<Pod>::namespaced(runtime.clone(), ns)
            .create(&dry_run, &pod)
            .await,
    )?;
    Api::<SubjectAccessReview>::all(runtime.clone())
        .create(&PostParams::default(), &subject_access_review(ns))
        .await
        .context("creating a SubjectAccessReview")?;

    // Impersonation: a ServiceAccount without naming its groups (the API server adds
    // `system:authenticated`, whose system:basic-user role allows the review); never a user,
    // never a group.
    let account = format!("system:serviceaccount:{ns}:default");
    let as_account = impersonating(control_plane, &account, None).await?;
    let review = self_review(&as_account, &("list", "", "pods", ns)).await?;
    ensure!(
        review.status.is_some_and(|s| !s.allowed),
        "ServiceAccount {ns}/default should not list Pods"
    );
    for (user, groups) in [
        ("admin", None),
        (account.as_str(), Some(vec!["system:masters".to_owned()])),
    ] {
        let client = impersonating(control_plane, user, groups.clone()).await?;
        forbidden(
            &format!("impersonate user {user} with groups {groups:?}"),
            self_review(&client, &("list", "", "pods", ns)).await,
        )?;
    }

    // An admin lets the runtime watch a CRD with a labelled ClusterRole, aggregated into
    // kubewasm-runtime-watch by kube-controller-manager.
    apply_all(admin, &example("hello-world/rbac.yaml", ns)?).await?;
    eventually(
        "the runtime may watch HelloWorlds once hello-world/rbac.yaml is applied",
        WAIT,
        || async {
            let list = may(&runtime, &("list", "example.com", "helloworlds", "")).await?;
            let watch = may(&runtime, &("watch", "example.com", "helloworlds", "")).await?;
            Ok((list && watch).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// Whether `client`'s identity may make `request` (a SelfSubjectAccessReview).
async fn may(client: &Client, request: &Request<'_>) -> Result<bool> {
    let review = self_review(client, request).await?;
    Ok(review.status.is_some_and(|s| s.allowed))
}

async fn self_review(
    client: &Client,
    &(verb, group, resource, namespace): &Request<'_>,
) -> Result<SelfSubjectAccessReview, kube::Error> {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_owned())),
        None => (resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                namespace: (!namespace.is_empty()).then(|| namespace.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
}

/// Asks whether ServiceAccount `<ns>/default` may list ConfigMaps, as the runtime will ask
/// about each controller's ServiceAccount.
fn subject_access_review(ns: &str) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{ns}:default")),
            resource_attributes: Some(ResourceAttributes {
                verb: Some("list".into()),
                resource: Some("configmaps".into()),
                namespace: Some(ns.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The runtime's client, impersonating `user` (and `groups`).
async fn impersonating(
    control_plane: &ControlPlane,
    user: &str,
    groups: Option<Vec<String>>,
) -> Result<Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(control_plane.runtime_kubeconfig())?;
    let mut config =
        Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await?;
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = groups;
    Ok(Client::try_from(config)?)
}

/// Fails unless the API server answered 403 Forbidden.
fn forbidden<T>(what: &str, result: Result<T, kube::Error>) -> Result<()> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(()),
        Err(error) => Err(error).context(format!("{what}: want 403 Forbidden")),
        Ok(_) => anyhow::bail!("{what}: allowed, want 403 Forbidden"),
    }
}
