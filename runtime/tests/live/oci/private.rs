//! A private repository needs a pull secret that the controller's ServiceAccount may read,
//! and a controller without one does not get the module by naming the digest another
//! controller pulled with its secret.

use super::*;

#[tokio::test]
async fn a_private_repository_needs_a_pull_secret_the_service_account_may_read() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "oci-auth").await;
    let registry =
        Registry::with_basic_auth("pusher", "s3cret-pw").expect("starting docker-registry");
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &[
            "--insecure-registry",
            registry.addr(),
            "--access-review-seconds",
            "2",
        ],
    );
    let result = private(&client, &ns, &registry).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn private(client: &Client, ns: &str, registry: &Registry) -> Result<()> {
    install_account(client, ns).await?;
    let file = crate::support::guests::guest_dir().join("hostile.wasm");
    let tag = format!("{}/team/private:v1", registry.addr());
    ensure!(
        push(&file, &tag, None).is_err(),
        "an anonymous push was let through"
    );
    let digest = push(&file, &tag, Some(("pusher", "s3cret-pw")))?;

    // No pull secret: the registry says no.
    apply(
        client,
        &controller(ns, "anonymous", &tag, None, "anonymous"),
    )
    .await?;
    wait_module(
        client,
        ns,
        "anonymous",
        "the anonymous pull refused",
        |_, st, reason, m| {
            ensure!(
                st == "False" && reason == "ModuleNotFound" && m.contains(registry.addr()),
                "not refused yet"
            );
            Ok(())
        },
    )
    .await?;

    // A pull secret the ServiceAccount may not read: the status names the fix.
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode("pusher:s3cret-pw");
    let dockerconfig = json!({"auths": {registry.addr(): {"auth": auth}}}).to_string();
    apply(
        client,
        &json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": "regcred", "namespace": ns},
            "stringData": {".dockerconfigjson": dockerconfig}}),
    )
    .await?;
    apply(
        client,
        &controller(ns, "private", &tag, Some("regcred"), "private"),
    )
    .await?;
    let fix = format!(
        "kubectl -n {ns} create role regcred-reader --verb=get --resource=secrets --resource-name=regcred"
    );
    wait_module(
        client,
        ns,
        "private",
        "Forbidden with the kubectl fix",
        |_, st, reason, m| {
            ensure!(st == "False" && reason == "Forbidden", "not refused yet");
            ensure!(
                m.contains(&fix) && m.contains(&format!("--serviceaccount={ns}:reloader")),
                "{m}"
            );
            Ok(())
        },
    )
    .await?;

    // The fix the status names: the module loads.
    apply_all(
        client,
        &[
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "regcred-reader", "namespace": ns},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["regcred"], "verbs": ["get"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "regcred-reader", "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "regcred-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "reloader", "namespace": ns}]}),
        ],
    )
    .await?;
    let hostile = guest("hostile");
    wait_module(
        client,
        ns,
        "private",
        "the private module loaded",
        |s, st, _, _| {
            ensure!(st == "True", "not loaded yet");
            ensure!(
                s.module_digest == Some(sha256(&hostile)),
                "moduleDigest {:?}",
                s.module_digest
            );
            Ok(())
        },
    )
    .await?;

    // The digest the private controller runs, named without a pull secret: the registry is
    // asked (anonymously) and says no — the module loaded with another's secret is not shared.
    let pinned = format!("{}/team/private@{digest}", registry.addr());
    apply(
        client,
        &controller(ns, "by-digest", &pinned, None, "by-digest"),
    )
    .await?;
    wait_module(
        client,
        ns,
        "by-digest",
        "the anonymous pull of the digest refused",
        |s, st, reason, m| {
            ensure!(
                st == "False" && reason == "ModuleNotFound" && m.contains(registry.addr()),
                "not refused yet"
            );
            ensure!(
                s.module_digest.is_none(),
                "moduleDigest {:?}",
                s.module_digest
            );
            Ok(())
        },
    )
    .await?;
    Ok(())
}
