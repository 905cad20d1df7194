//! The local control plane (deploy/dev/local/cluster.sh) is a real one: Deployments get Pods,
//! deleted Pods are replaced, garbage is collected, RBAC holds for ServiceAccounts, two
//! control planes run side by side (and `make down` stops only its checkout's), and none
//! outlives the process that started it.

use kubewasm_test_support as support;

use std::{collections::BTreeSet, path::Path, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Namespace, Pod, ServiceAccount},
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use support::{ControlPlane, eventually};

/// Long enough for kube-controller-manager on a busy 2-core machine.
const WAIT: Duration = Duration::from_secs(60);

/// The tutorial's frontend: a Deployment in `test-space` whose Pods mount `frontend-config`.
/// (Each test run uses a fresh `test-space-<random>` namespace instead of `test-space`.)
const FRONTEND: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: frontend-config
data:
  greeting: Hello from the frontend
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: frontend
  labels:
    app: frontend
spec:
  replicas: 2
  selector:
    matchLabels:
      app: frontend
  template:
    metadata:
      labels:
        app: frontend
    spec:
      containers:
        - name: frontend
          image: nginx:1.25
          volumeMounts:
            - name: config
              mountPath: /etc/frontend
      volumes:
        - name: config
          configMap:
            name: frontend-config
"#;

/// Skips (returns true) where no kube-controller-manager runs, e.g. with envtest binaries.
fn without_controller_manager(control_plane: &ControlPlane) -> bool {
    let missing = !control_plane.has_controller_manager();
    if missing {
        eprintln!("skipped: no kube-controller-manager in this control plane");
    }
    missing
}

/// Names of the Pods matching `selector` that are not being deleted.
async fn live_pods(pods: &Api<Pod>, selector: &str) -> Result<BTreeSet<String>> {
    let list = pods.list(&ListParams::default().labels(selector)).await?;
    Ok(list
        .into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .map(|pod| pod.name_any())
        .collect())
}

#[tokio::test]
async fn tutorial_frontend_deployment_gets_pods_and_deleted_pods_are_replaced() -> Result<()> {
    let control_plane = ControlPlane::shared();
    if without_controller_manager(control_plane) {
        return Ok(());
    }
    let client = control_plane.client().await?;
    let namespace = control_plane.namespace("test-space").await?;
    let mut documents = FRONTEND.split("\n---\n");
    let config: ConfigMap = serde_yaml::from_str(documents.next().context("no ConfigMap")?)?;
    let deployment: Deployment = serde_yaml::from_str(documents.next().context("no Deployment")?)?;
    Api::<ConfigMap>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &config)
        .await?;
    Api::<Deployment>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &deployment)
        .await?;

    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let first = eventually("the frontend Deployment has 2 Pods", WAIT, || async {
        let names = live_pods(&pods, "app=frontend").await?;
        if names.len() != 2 {
            bail!("{} Pods: {names:?}", names.len());
        }
        Ok(Some(names))
    })
    .await?;
    let pod = pods.get(first.first().context("no Pod")?).await?;
    let volumes = pod
        .spec
        .context("Pod without spec")?
        .volumes
        .unwrap_or_default();
    ensure!(
        volumes
            .iter()
            .any(|v| { v.config_map.as_ref().map(|c| c.name.as_str()) == Some("frontend-config") }),
        "the frontend Pod does not mount ConfigMap frontend-config: {volumes:?}"
    );

    pods.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("app=frontend"),
    )
    .await?;
    eventually(
        "the deleted frontend Pods are replaced by 2 new ones",
        WAIT,
        || async {
            let names = live_pods(&pods, "app=frontend").await?;
            if names.len() != 2 || !names.is_disjoint(&first) {
                bail!("Pods {names:?}, deleted were {first:?}");
            }
            Ok(Some(()))
        },
    )
    .await?;
    control_plane.delete_namespace(&namespace).await
}

#[tokio::test]
async fn a_child_of_a_deleted_parent_is_garbage_collected() -> Result<()> {
    let control_plane = ControlPlane::shared();
    if without_controller_manager(control_plane) {
        return Ok(());
    }
    let client = control_plane.client().await?;
    let namespace = control_plane.namespace("gc").await?;
    let parents: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let parent: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "parent" }
    }))?;
    let parent = parents.create(&PostParams::default(), &parent).await?;
    let child: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "child",
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "parent", "uid": parent.uid(),
            }],
        },
        "spec": { "containers": [{ "name": "main", "image": "nginx:1.25" }] },
    }))?;
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    pods.create(&PostParams::default(), &child).await?;

    parents.delete("parent", &DeleteParams::default()).await?;
    eventually(
        "Pod child of the deleted ConfigMap parent is garbage-collected",
        WAIT,
        || async {
            match pods.get_opt("child").await? {
                None => Ok(Some(())),
                Some(pod) => bail!(
                    "Pod child still there (deletion {:?})",
                    pod.metadata.deletion_timestamp
                ),
            }
        },
    )
    .await?;
    control_plane.delete_namespace(&namespace).await
}

#[tokio::test]
async fn a_service_account_may_list_pods_only_once_rbac_allows_it() -> Result<()> {
    let control_plane = ControlPlane::shared();
    let admin = control_plane.client().await?;
    let namespace = control_plane.namespace("rbac").await?;
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": "reader" } }))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &account)
        .await?;
    let reader = control_plane
        .client_for_service_account(&namespace, "reader")
        .await?;
    let pods: Api<Pod> = Api::namespaced(reader.clone(), &namespace);
    expect_forbidden(
        pods.list(&ListParams::default()).await,
        "listing Pods without a Role",
    )?;

    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "pod-reader" },
        "rules": [{ "apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"] }],
    }))?;
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "reader-reads-pods" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader" },
        "subjects": [{ "kind": "ServiceAccount", "name": "reader", "namespace": namespace }],
    }))?;
    Api::<Role>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &role)
        .await?;
    Api::<RoleBinding>::namespaced(admin, &namespace)
        .create(&PostParams::default(), &binding)
        .await?;

    eventually(
        "ServiceAccount reader may list Pods after the RoleBinding",
        WAIT,
        || async {
            pods.list(&ListParams::default()).await?;
            Ok(Some(()))
        },
    )
    .await?;
    // The Role grants this namespace only.
    let elsewhere: Api<Pod> = Api::namespaced(reader.clone(), "default");
    expect_forbidden(
        elsewhere.list(&ListParams::default()).await,
        "listing Pods in default",
    )?;
    let namespaces: Api<Namespace> = Api::all(reader);
    expect_forbidden(
        namespaces.list(&ListParams::default()).await,
        "listing Namespaces",
    )?;
    control_plane.delete_namespace(&namespace).await
}

/// The runtime's access check answers from a ServiceAccount's rules (one SelfSubjectRulesReview
/// made as it) only where RBAC allows; everything else goes to SubjectAccessReviews, so a
/// rule that names objects, a verb not granted and a revoked binding are all refused as
/// before, with the runtime's own identity (deploy/runtime/rbac.yaml).
#[tokio::test]
async fn access_reviews_allow_from_rules_only_what_rbac_allows() -> Result<()> {
    use kubewasm::controller::Resolver;
    use kubewasm::host::{AccessReviews, Asked, ServiceAccount as Account};

    let control_plane = ControlPlane::shared();
    let admin = control_plane.client().await?;
    let namespace = control_plane.namespace("rules").await?;
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": "prober" } }))?;
    Api::<ServiceAccount>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &account)
        .await?;
    bind_role(
        &admin,
        &namespace,
        "prober",
        serde_json::json!([
            { "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"] },
            { "apiGroups": [""], "resources": ["secrets"], "verbs": ["*"], "resourceNames": ["one"] },
            { "apiGroups": [""], "resources": ["pods"], "verbs": ["list"] },
        ]),
    )
    .await?;

    let runtime = control_plane.runtime_client().await?;
    let resolver = Resolver::new(runtime.clone());
    let (config_maps, secrets, pods) = (
        resolver.resolve("v1", "ConfigMap").await?,
        resolver.resolve("v1", "Secret").await?,
        resolver.resolve("v1", "Pod").await?,
    );
    let prober = Account {
        namespace: namespace.clone(),
        name: "prober".into(),
    };
    let ttl = Duration::from_millis(500);
    // RBAC reaches the API server's authorizer through an informer: wait for the binding.
    eventually("prober's Role in force", WAIT, || async {
        let reviews = AccessReviews::new(runtime.clone(), ttl);
        let checked = reads(&reviews, &prober, &namespace, &[&config_maps]).await?;
        Ok(checked.is_ok().then_some(()))
    })
    .await?;

    let reviews = AccessReviews::new(runtime.clone(), ttl);
    let checked = reads(&reviews, &prober, &namespace, &[&config_maps]).await?;
    ensure!(checked.is_ok(), "ConfigMaps refused: {checked:?}");
    ensure!(
        reviews.asked()
            == Asked {
                rules: 1,
                access: 0,
                impersonation: 0,
                accounts: 0,
                namespaces: 0,
            },
        "allowed by its rules with one review: {:?}",
        reviews.asked()
    );

    // A rule that names one Secret grants no read of every Secret; `list` alone is not
    // `get` and `watch`. The refusals name exactly what is missing.
    let missing = reads(&reviews, &prober, &namespace, &[&secrets, &pods])
        .await?
        .err()
        .context("Secrets and Pods were allowed")?;
    let want = std::collections::BTreeMap::from([
        ("pods".to_owned(), vec!["get", "watch"]),
        ("secrets".to_owned(), vec!["get", "list", "watch"]),
    ]);
    ensure!(
        missing.missing() == &want,
        "missing {:?}, want {want:?}",
        missing.missing()
    );
    ensure!(
        reviews.asked()
            == Asked {
                rules: 1,
                access: 5,
                impersonation: 0,
                accounts: 0,
                namespaces: 0,
            },
        "the five refusals each asked of a SubjectAccessReview: {:?}",
        reviews.asked()
    );

    // Revoked: once the TTL is over, the rules no longer allow, and the review refuses.
    Api::<RoleBinding>::namespaced(admin, &namespace)
        .delete("prober", &DeleteParams::default())
        .await?;
    eventually(
        "ConfigMaps refused once the binding is gone",
        WAIT,
        || async {
            tokio::time::sleep(ttl).await;
            let checked = reads(&reviews, &prober, &namespace, &[&config_maps]).await?;
            Ok(checked.is_err().then_some(()))
        },
    )
    .await?;
    control_plane.delete_namespace(&namespace).await
}

/// Whether the runtime may act as a ServiceAccount costs one review where it may: the rules
/// review made as the account (an impersonation the API server authorizes first), whose rules
/// the read check then uses. Where the namespace is not opted in, that review is refused and
/// a SelfSubjectAccessReview says so; an account without the opt-in annotation is refused.
#[tokio::test]
async fn acting_as_an_account_is_proven_by_its_rules_review() -> Result<()> {
    use kubewasm::controller::Resolver;
    use kubewasm::host::{
        AccessReviews, Acting, Asked, OptIns, SERVICE_ACCOUNT_OPT_IN, ServiceAccount as Account,
    };

    let control_plane = ControlPlane::shared();
    let admin = control_plane.client().await?;
    let namespace = control_plane.namespace("acting").await?;
    for (name, annotated) in [("lender", true), ("keeper", false)] {
        let mut account = serde_json::json!({ "metadata": { "name": name } });
        if annotated {
            account["metadata"]["annotations"] =
                serde_json::json!({ SERVICE_ACCOUNT_OPT_IN: "allowed" });
        }
        Api::<ServiceAccount>::namespaced(admin.clone(), &namespace)
            .create(&PostParams::default(), &serde_json::from_value(account)?)
            .await?;
    }
    bind_role(
        &admin,
        &namespace,
        "lender",
        serde_json::json!([
            { "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"] },
        ]),
    )
    .await?;
    let runtime = control_plane.runtime_client().await?;
    let config_maps = Resolver::new(runtime.clone())
        .resolve("v1", "ConfigMap")
        .await?;
    let account = |name: &str| Account {
        namespace: namespace.clone(),
        name: name.into(),
    };
    let ttl = Duration::from_secs(600);
    // RBAC reaches the authorizer through an informer: wait until the lender may read.
    eventually("lender's Role in force", WAIT, || async {
        let reviews = AccessReviews::new(runtime.clone(), ttl);
        let checked = reads(&reviews, &account("lender"), &namespace, &[&config_maps]).await?;
        Ok(checked.is_ok().then_some(()))
    })
    .await?;

    let reviews = AccessReviews::new(runtime.clone(), ttl);
    let acting = reviews.may_act_as(&account("lender")).await?;
    ensure!(acting == Acting::Allowed, "lender: {acting:?}");
    let checked = reads(&reviews, &account("lender"), &namespace, &[&config_maps]).await?;
    ensure!(checked.is_ok(), "ConfigMaps refused: {checked:?}");
    let one = Asked {
        rules: 1,
        access: 0,
        impersonation: 0,
        accounts: 1,
        namespaces: 1,
    };
    ensure!(
        reviews.asked() == one,
        "acting and reading proven by one rules review (and the account read): {:?}",
        reviews.asked()
    );
    let acting = reviews.may_act_as(&account("keeper")).await?;
    ensure!(acting == Acting::AccountNotOptedIn, "keeper: {acting:?}");

    // With the watch of opt-ins (the runtime's own `list`/`watch` on ServiceAccounts): the
    // lender's opt-in is not read again; the keeper's *no* is read, never taken from a watch.
    // The namespace's label from the watch of Namespaces (`list`/`watch` on namespaces): not
    // read at all.
    let watched = AccessReviews::new(runtime.clone(), ttl);
    let opt_ins = OptIns::watch(runtime.clone(), runtime.clone(), Some(&namespace));
    opt_ins.first_list(WAIT).await;
    watched.watch_opt_ins(opt_ins);
    let namespaces = OptIns::watch_namespaces(runtime.clone(), runtime.clone(), Some(&namespace));
    namespaces.first_list(WAIT).await;
    watched.watch_namespaces(namespaces);
    let acting = watched.may_act_as(&account("lender")).await?;
    ensure!(acting == Acting::Allowed, "lender, watched: {acting:?}");
    let acting = watched.may_act_as(&account("keeper")).await?;
    ensure!(
        acting == Acting::AccountNotOptedIn,
        "keeper, watched: {acting:?}"
    );
    ensure!(
        watched.asked()
            == Asked {
                rules: 2,
                access: 0,
                impersonation: 0,
                accounts: 1,
                namespaces: 0,
            },
        "the lender's opt-in from the watch, the keeper read: {:?}",
        watched.asked()
    );
    // The lender's owner withdraws its opt-in: a start after the watch saw it is refused.
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), &namespace);
    let annotate = |value: serde_json::Value| {
        kube::api::Patch::Merge(
            serde_json::json!({"metadata": {"annotations": {SERVICE_ACCOUNT_OPT_IN: value}}}),
        )
    };
    let params = kube::api::PatchParams::default();
    accounts
        .patch("lender", &params, &annotate(serde_json::Value::Null))
        .await?;
    let opt_ins = OptIns::watch(runtime.clone(), runtime.clone(), Some(&namespace));
    opt_ins.first_list(WAIT).await;
    let watched = AccessReviews::new(runtime.clone(), ttl);
    watched.watch_opt_ins(opt_ins);
    let acting = watched.may_act_as(&account("lender")).await?;
    ensure!(
        acting == Acting::AccountNotOptedIn,
        "lender, withdrawn: {acting:?}"
    );
    accounts
        .patch("lender", &params, &annotate(serde_json::json!("allowed")))
        .await?;

    // The namespace's opt-in taken back: the rules review as the account is refused, and a
    // SelfSubjectAccessReview says the runtime may not impersonate.
    let opt_in = support::tenant_binding(&namespace)?;
    let opt_in = opt_in["metadata"]["name"]
        .as_str()
        .context("the tenant binding's name")?;
    Api::<RoleBinding>::namespaced(admin.clone(), &namespace)
        .delete(opt_in, &DeleteParams::default())
        .await?;
    eventually("the namespace's opt-in gone", WAIT, || async {
        let reviews = AccessReviews::new(runtime.clone(), ttl);
        let acting = reviews.may_act_as(&account("lender")).await?;
        if acting != Acting::NamespaceNotOptedIn {
            return Ok(None);
        }
        let asked = reviews.asked();
        ensure!(
            asked.rules == 1 && asked.impersonation == 1,
            "a refused rules review, then one SelfSubjectAccessReview: {asked:?}"
        );
        Ok(Some(()))
    })
    .await?;

    // The cluster admin's label taken away: refused before anything is asked of RBAC, whether
    // the watch of Namespaces has seen it yet or not (a *no* is read, never taken from it).
    let (key, _) = support::TENANT_LABEL;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin)
        .patch(
            &namespace,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {key: null}}})),
        )
        .await?;
    let reviews = AccessReviews::new(runtime.clone(), ttl);
    let acting = reviews.may_act_as(&account("lender")).await?;
    ensure!(
        acting == Acting::NamespaceNotEnabled,
        "lender, the namespace not enabled: {acting:?}"
    );
    ensure!(
        reviews.asked()
            == Asked {
                namespaces: 1,
                ..Asked::default()
            },
        "only the Namespace read: {:?}",
        reviews.asked()
    );
    control_plane.delete_namespace(&namespace).await
}

/// Whether `account` may read every kind of `kinds` in `namespace`, as a controller's start
/// asks it.
async fn reads(
    reviews: &kubewasm::host::AccessReviews,
    account: &kubewasm::host::ServiceAccount,
    namespace: &str,
    kinds: &[&kubewasm::controller::Kind],
) -> Result<Result<(), kubewasm::host::MissingReads>> {
    Ok(reviews
        .check_reads(
            "probe",
            account,
            Some(namespace),
            kinds,
            &kubewasm::host::NeededRules::default(),
        )
        .await?)
}

/// A Role `name` in `namespace` with `rules`, bound to the ServiceAccount `name` there.
async fn bind_role(
    admin: &Client,
    namespace: &str,
    name: &str,
    rules: serde_json::Value,
) -> Result<()> {
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "rules": rules,
    }))?;
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
        "subjects": [{ "kind": "ServiceAccount", "name": name, "namespace": namespace }],
    }))?;
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await?;
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await?;
    Ok(())
}

fn expect_forbidden<T: std::fmt::Debug>(result: kube::Result<T>, what: &str) -> Result<()> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(()),
        other => bail!("{what} as ServiceAccount reader: want 403 Forbidden, got {other:?}"),
    }
}

/// Whether a process runs (a zombie does not: nobody may reap orphans here).
fn process_runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(") ")
                .map(|(_, rest)| !rest.starts_with('Z'))
        })
        .unwrap_or(false)
}

fn port_free(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Starts a control plane of its own in `dir`, off the test's runtime (it blocks for seconds).
async fn start_own(dir: &Path, watch_pid: u32) -> Result<ControlPlane> {
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || ControlPlane::start(&dir, Some(watch_pid))).await?
}

/// Waits until every recorded process of `control_plane` has exited and its ports are free.
async fn wait_gone(
    control_plane: &ControlPlane,
    pids: &[u32],
    ports: &[u16],
    why: &str,
) -> Result<()> {
    let what = format!(
        "the control plane in {:?} is gone {why}",
        control_plane.state_dir()
    );
    eventually(&what, Duration::from_secs(40), || async {
        let running: Vec<_> = pids.iter().filter(|pid| process_runs(**pid)).collect();
        let busy: Vec<_> = ports.iter().filter(|port| !port_free(**port)).collect();
        if !running.is_empty() || !busy.is_empty() {
            bail!("pids {running:?} still run, ports {busy:?} still taken");
        }
        Ok(Some(()))
    })
    .await
}

async fn namespace_names(client: Client) -> Result<BTreeSet<String>> {
    let list = Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await?;
    Ok(list.into_iter().map(|ns| ns.name_any()).collect())
}

#[tokio::test]
async fn two_control_planes_run_side_by_side() -> Result<()> {
    let first = ControlPlane::shared();
    if first.state_dir().is_none() {
        eprintln!("skipped: the tests run against an existing cluster, which starts no others");
        return Ok(());
    }
    // The second lives where `make up` used to put every checkout's demo cluster: this
    // checkout's `make down` and `make cluster-down` must leave it alone.
    let cache = tempfile::tempdir()?;
    let dir = cache.path().join("clusters/demo");
    let second = start_own(&dir, std::process::id()).await?;
    let (pids, ports) = (second.recorded_pids(), second.ports());
    let result = async {
        let make = tokio::process::Command::new("make")
            .args(["-s", "down", "cluster-down"])
            .current_dir(support::workspace())
            .env("KUBEWASM_CACHE", cache.path())
            .env_remove("KUBEWASM_DEMO_DIR")
            .env_remove("KUBEWASM_CLUSTER_DIR")
            .env_remove("MAKEFLAGS")
            .output()
            .await
            .context("running make down cluster-down")?;
        ensure!(
            make.status.success(),
            "make down cluster-down failed: {}",
            String::from_utf8_lossy(&make.stderr)
        );
        ensure!(
            pids.iter().all(|pid| process_runs(*pid)),
            "this checkout's `make down cluster-down` stopped another's control plane: {}",
            String::from_utf8_lossy(&make.stderr)
        );
        ensure!(
            ports.len() == 3,
            "want 3 ports in cluster.env, got {ports:?}"
        );
        ensure!(
            ports.iter().all(|port| !first.ports().contains(port)),
            "both control planes use a port of {ports:?}"
        );
        let marker: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "only-in-the-second" }
        }))?;
        Api::<Namespace>::all(second.client().await?)
            .create(&PostParams::default(), &marker)
            .await?;
        let in_second = namespace_names(second.client().await?).await?;
        let in_first = namespace_names(first.client().await?).await?;
        ensure!(
            in_second.contains("only-in-the-second"),
            "second lists {in_second:?}"
        );
        ensure!(
            !in_first.contains("only-in-the-second"),
            "first lists {in_first:?}"
        );
        Ok(())
    }
    .await;
    second.stop()?;
    result?;
    wait_gone(&second, &pids, &ports, "after cluster.sh down").await
}

#[tokio::test]
async fn killing_the_starter_stops_the_control_plane() -> Result<()> {
    if ControlPlane::shared().state_dir().is_none() {
        eprintln!("skipped: the tests run against an existing cluster, which starts no others");
        return Ok(());
    }
    // The "starter" stands in for a process that started a control plane; it also ends when
    // this test process does, so that a killed test run leaves nothing running either.
    let mut starter = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "while kill -0 {} 2>/dev/null; do sleep 1; done",
            std::process::id()
        ))
        .spawn()?;
    let dir = tempfile::tempdir()?;
    let control_plane = match start_own(dir.path(), starter.id()).await {
        Ok(control_plane) => control_plane,
        Err(error) => {
            starter.kill()?;
            starter.wait()?;
            return Err(error);
        }
    };
    let (pids, ports) = (control_plane.recorded_pids(), control_plane.ports());
    let want = if control_plane.has_controller_manager() {
        4
    } else {
        3
    };
    ensure!(
        pids.len() == want,
        "want etcd, apiserver, [controller-manager,] watchdog: {pids:?}"
    );
    ensure!(
        pids.iter().all(|pid| process_runs(*pid)),
        "not all of {pids:?} run"
    );
    namespace_names(control_plane.client().await?).await?;

    starter.kill()?; // SIGKILL: the starter gets no chance to clean up
    starter.wait()?;
    wait_gone(
        &control_plane,
        &pids,
        &ports,
        "after its starter was killed",
    )
    .await
}
