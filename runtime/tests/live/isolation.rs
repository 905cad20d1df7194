//! Tenant isolation, tried the way a hostile tenant would: team-a's ServiceAccount may touch
//! only its own `Probe` objects, and team-a's guest (`guests/testing/intruder`) and WasmControllers
//! try to read and touch everything else through the runtime. Every attempt must be refused
//! with its reason, nothing of team-b, of team-a's Secrets or of the cluster may show up in
//! any status, Event or log, and team-b's controller keeps reconciling throughout. Granting
//! team-a's ServiceAccount a Role then makes its waiting controller Ready by itself.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Event;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::{
    WAIT, apply, apply_all, condition, ensure_condition, guest, module_config_map, prepare,
    wait_status,
};
use crate::runtime::{RuntimeProcess, finish};
use crate::support::Kubectl;
use crate::support::eventually;
use crate::{StopOnDrop, merge};

pub(crate) const GROUP: &str = "isolation.kubewasm.dev";

/// Most the runtime may grow to while team-a attacks (it starts at about 50 MiB).
const MAX_RUNTIME_RSS_BYTES: u64 = 512 << 20;

/// Text that must never leave the object it is in, unless RBAC allows it.
struct Markers {
    a_secret: String,
    a_config: String,
    b_secret: String,
    b_config: String,
}

impl Markers {
    fn new() -> Self {
        let salt = std::process::id();
        Markers {
            a_secret: format!("A-SECRET-{salt}-never-shown"),
            a_config: format!("A-CONFIG-{salt}-only-with-rbac"),
            b_secret: format!("B-SECRET-{salt}-never-shown"),
            b_config: format!("B-CONFIG-{salt}-never-shown"),
        }
    }

    /// Fails if `text` (`where_` says what it is) holds a marker it must not hold.
    fn ensure_hidden(&self, where_: &str, text: &str, a_config_allowed: bool) -> Result<()> {
        let mut never = vec![&self.a_secret, &self.b_secret, &self.b_config];
        if !a_config_allowed {
            never.push(&self.a_config);
        }
        for marker in never {
            ensure!(
                !text.contains(marker.as_str()),
                "{where_} reveals `{marker}`"
            );
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_tenant_reads_and_touches_only_what_its_rbac_allows() {
    // Its own control plane: the runtime hosts every namespace (as an installed one does).
    let control_plane = StopOnDrop::start("live-isolation");
    let (client, team_a) = prepare(&control_plane.0, "team-a").await;
    let team_b = control_plane
        .0
        .namespace("team-b")
        .await
        .expect("creating team-b's namespace");
    // As installed: with the runtime's own identity from deploy/runtime/rbac.yaml.
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.0.runtime_kubeconfig(),
        "",
        &["--access-review-seconds", "2"],
    );
    let kubectl = control_plane.0.kubectl();
    let result = isolation(&client, &kubectl, &team_a, &team_b, &runtime).await;
    finish(result, &mut [&mut runtime]);
}

pub(crate) fn probes(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, "v1", "Probe"));
    Api::namespaced_with(client.clone(), namespace, &resource)
}

pub(crate) fn probe(namespace: &str, name: &str, role: &str, spec: Value) -> Value {
    json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Probe",
        "metadata": {"name": name, "namespace": namespace, "labels": {"role": role}},
        "spec": spec})
}

pub(crate) fn controller(namespace: &str, name: &str, spec: Value) -> Value {
    let mut full = json!({
        "module": {"configMap": {"name": "intruder", "key": "intruder.wasm"}},
        "parent": {"apiVersion": format!("{GROUP}/v1"), "kind": "Probe", "labelSelector": format!("role={name}")},
        "serviceAccountName": "prober",
    });
    for (k, v) in spec.as_object().into_iter().flatten() {
        full[k] = v.clone();
    }
    json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "WasmController",
        "metadata": {"name": name, "namespace": namespace}, "spec": full})
}

/// The Probe CRD, and the labelled ClusterRole that lets the runtime watch Probes.
pub(crate) async fn install_probe_crd(client: &Client) -> Result<()> {
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("probes.{GROUP}")},
        "spec": {"group": GROUP, "scope": "Namespaced",
            "names": {"plural": "probes", "singular": "probe", "kind": "Probe"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}});
    let watch = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "kubewasm-runtime-watch-probes",
            "labels": {"kubewasm.dev/aggregate-to-runtime": "true"}},
        "rules": [{"apiGroups": [GROUP], "resources": ["probes"], "verbs": ["list", "watch"]}]});
    apply_all(client, &[crd, watch]).await?;
    crate::cluster::wait_established(client, &format!("probes.{GROUP}")).await
}

/// A tenant: ServiceAccount `prober` whose Role allows its Probes (and their status) and
/// Events only; a Secret and a ConfigMap it may not read; the guest in a ConfigMap.
pub(crate) async fn install_tenant(
    client: &Client,
    ns: &str,
    secret: &str,
    config: &str,
) -> Result<()> {
    let rbac = |kind: &str, body: Value| {
        let mut o = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
            "metadata": {"name": "prober", "namespace": ns}});
        for (k, v) in body.as_object().into_iter().flatten() {
            o[k] = v.clone();
        }
        o
    };
    apply_all(
        client,
        &[
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prober", "namespace": ns,
                "annotations": {"kubewasm.dev/wasm-controllers": "allowed"}}}),
            rbac("Role", json!({"rules": [
                {"apiGroups": [GROUP], "resources": ["probes"], "verbs": ["get", "list", "watch", "patch", "update"]},
                {"apiGroups": [GROUP], "resources": ["probes/status"], "verbs": ["get", "patch", "update"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]})),
            rbac("RoleBinding", json!({
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "prober"},
                "subjects": [{"kind": "ServiceAccount", "name": "prober", "namespace": ns}]})),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token", "namespace": ns},
                "stringData": {"token": secret}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "private", "namespace": ns},
                "data": {"value": config}}),
            module_config_map(ns, "intruder", "intruder.wasm", &guest("intruder")),
        ],
    )
    .await
}

async fn isolation(
    client: &Client,
    kubectl: &Kubectl,
    a: &str,
    b: &str,
    runtime: &RuntimeProcess,
) -> Result<()> {
    let markers = Markers::new();
    install_probe_crd(client).await?;
    install_tenant(client, a, &markers.a_secret, &markers.a_config).await?;
    install_tenant(client, b, &markers.b_secret, &markers.b_config).await?;

    // team-b: a well-behaved controller that must keep working whatever team-a does.
    apply(client, &controller(b, "steady", json!({}))).await?;
    apply(client, &probe(b, "steady", "steady", json!({"echo": "0"}))).await?;
    wait_echo(client, b, "steady", "0").await?;

    attacks_through_reads(client, a, b, &markers).await?;
    attacks_through_the_spec(client, a, &markers).await?;
    attacks_through_actions_and_errors(client, a, runtime).await?;
    read_granted_later_makes_the_controller_ready(client, kubectl, a, &markers).await?;

    // team-b was served throughout, and still is.
    probes(client, b)
        .patch(
            "steady",
            &Default::default(),
            &merge(json!({"spec": {"echo": "1"}})),
        )
        .await?;
    wait_echo(client, b, "steady", "1").await?;

    // Nothing leaked into any status, Event or log line.
    for ns in [a, b] {
        let all = probes(client, ns).list(&ListParams::default()).await?;
        for p in all.items {
            let allowed = ns == a && p.metadata.name.as_deref() == Some("nosy");
            let text = serde_json::to_string(&p.data["status"])?;
            markers.ensure_hidden(
                &format!("status of Probe {ns}/{:?}", p.metadata.name),
                &text,
                allowed,
            )?;
        }
        let controllers: Api<kubewasm::api::WasmController> = Api::namespaced(client.clone(), ns);
        for wc in controllers.list(&ListParams::default()).await?.items {
            let text = serde_json::to_string(&wc.status)?;
            markers.ensure_hidden(
                &format!("status of WasmController {ns}/{:?}", wc.metadata.name),
                &text,
                false,
            )?;
        }
        let events: Api<Event> = Api::namespaced(client.clone(), ns);
        for e in events.list(&ListParams::default()).await?.items {
            let text = format!("{:?} {:?}", e.reason, e.message);
            markers.ensure_hidden(&format!("Event {ns}/{:?}", e.metadata.name), &text, false)?;
        }
    }
    markers.ensure_hidden("the runtime's log", &runtime.log(), true)?;
    let rss = resident_bytes(runtime.pid())?;
    eprintln!(
        "isolation: the runtime is {} MiB resident after the attacks",
        rss >> 20
    );
    ensure!(
        rss < MAX_RUNTIME_RSS_BYTES,
        "the runtime grew to {} MiB resident under team-a's attacks",
        rss >> 20
    );

    // Once no controller needs Probes, the runtime stops watching them.
    for ns in [a, b] {
        let controllers: Api<kubewasm::api::WasmController> = Api::namespaced(client.clone(), ns);
        controllers
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await?;
    }
    eventually("the runtime stops its Probe watch", WAIT, || async {
        let stopped = runtime
            .log()
            .lines()
            .any(|l| l.contains("stopped shared watch") && l.contains("kind=Probe"));
        Ok(stopped.then_some(()))
    })
    .await
}

/// team-a's guest reads Secrets and ConfigMaps (its own namespace and team-b's), a
/// ClusterRoleBinding and a Node, team-b's Probe, and names made to bend a URL.
async fn attacks_through_reads(client: &Client, a: &str, b: &str, markers: &Markers) -> Result<()> {
    apply(client, &controller(a, "intruder", json!({}))).await?;
    let obj = |api_version: &str, kind: &str, namespace: Option<&str>, name: &str| {
        let mut v = json!({"apiVersion": api_version, "kind": kind, "name": name});
        if let Some(ns) = namespace {
            v["namespace"] = json!(ns);
        }
        v
    };
    let probes_v1 = format!("{GROUP}/v1");
    let rbac = "rbac.authorization.k8s.io/v1";
    let gets = vec![
        obj("v1", "Secret", None, "token"),
        obj("v1", "Secret", Some(b), "token"),
        obj("v1", "ConfigMap", None, "private"),
        obj("v1", "ConfigMap", Some(b), "private"),
        obj(rbac, "ClusterRoleBinding", None, "cluster-admin"),
        obj("v1", "Node", None, "node-1"),
        obj(&probes_v1, "Probe", Some(b), "steady"),
        obj(&probes_v1, "Probe", None, "x?fieldManager=y"),
        obj(&probes_v1, "Probe", None, "a/b"),
        obj(&probes_v1, "Probe", None, ".."),
    ];
    let lists = vec![
        json!({"apiVersion": "v1", "kind": "Secret"}),
        json!({"apiVersion": "v1", "kind": "Secret", "namespace": b}),
        json!({"apiVersion": "v1", "kind": "ConfigMap"}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "namespace": b}),
        json!({"apiVersion": rbac, "kind": "ClusterRoleBinding"}),
        json!({"apiVersion": probes_v1, "kind": "Probe", "namespace": b}),
        json!({"apiVersion": probes_v1, "kind": "Probe", "labelSelector": "!nonexistent,x in ("}),
    ];
    let attempts = gets.len() + lists.len();
    apply(
        client,
        &probe(
            a,
            "reads",
            "intruder",
            json!({"echo": "r", "gets": gets, "lists": lists}),
        ),
    )
    .await?;
    let status = eventually("team-a's guest reports its reads", WAIT, || async {
        let p = probes(client, a).get("reads").await?;
        let results = p
            .data
            .pointer("/status/results")
            .and_then(Value::as_array)
            .cloned();
        Ok(results
            .filter(|r| r.len() == attempts)
            .map(|_| p.data["status"].clone()))
    })
    .await?;
    for result in status["results"].as_array().into_iter().flatten() {
        let outcome = result["outcome"].as_str().unwrap_or_default();
        ensure!(
            outcome.starts_with("refused: "),
            "{} {} was not refused: {outcome}",
            result["op"],
            result["target"]
        );
    }
    let text = serde_json::to_string(&status)?;
    ensure!(
        text.contains("may not get Secret (v1) in namespace")
            && text.contains("only in its own namespace")
            && text.contains("invalid object name"),
        "the refusals do not say why: {text}"
    );
    markers.ensure_hidden("team-a's read results", &text, false)
}

/// Specs that name what the tenant may not have: Secrets (not watchable), cluster-scoped
/// parents and children, runtime files.
async fn attacks_through_the_spec(client: &Client, a: &str, markers: &Markers) -> Result<()> {
    let refused = [
        (
            "greedy",
            json!({"grants": [{"apiVersion": "v1", "kind": "Secret", "verbs": ["get", "list"]}]}),
            "NotWatchable",
        ),
        (
            "cluster-parent",
            json!({"parent": {"apiVersion": "v1", "kind": "Node"}}),
            "InvalidSpec",
        ),
        (
            "cluster-child",
            json!({"children": [{"apiVersion": "v1", "kind": "Namespace"}]}),
            "InvalidSpec",
        ),
    ];
    for (name, spec, _) in &refused {
        apply(client, &controller(a, name, spec.clone())).await?;
    }
    for (name, _, reason) in &refused {
        wait_status(
            client,
            a,
            name,
            &format!("WasmController {name} refused with {reason}"),
            |s| {
                let c = ensure_condition(s, "Ready", "False")?;
                ensure!(
                    c.reason == *reason,
                    "Ready reason is {}: {}",
                    c.reason,
                    c.message
                );
                Ok(())
            },
        )
        .await?;
    }
    let s = crate::cluster::controller_status(client, a, "cluster-parent").await?;
    let message = &condition(&s, "Ready")?.message;
    ensure!(message.contains("Node (v1) is cluster-scoped"), "{message}");
    markers.ensure_hidden("a refusal", message, false)?;

    // Runtime files: refused by the API server itself.
    let wcs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        a,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "kubewasm.dev",
            "v1alpha1",
            "WasmController",
        )),
    );
    for (name, module) in [
        ("hostname", json!({"path": "/etc/hostname"})),
        (
            "zero",
            json!({"path": "/dev/zero", "sha256": "0".repeat(64)}),
        ),
    ] {
        let mut wc = controller(a, name, json!({}));
        wc["spec"]["module"] = module;
        let wc: DynamicObject = serde_json::from_value(wc)?;
        match wcs.create(&PostParams::default(), &wc).await {
            Err(kube::Error::Api(e)) if e.code == 422 => ensure!(
                e.message.contains("spec.module.path"),
                "refused, but not for spec.module.path: {}",
                e.message
            ),
            Err(e) => bail!("WasmController {name}: unexpected error {e}"),
            Ok(_) => bail!("the API server accepted a WasmController with a module path ({name})"),
        }
    }
    Ok(())
}

/// Actions with names made to bend a URL, and an error of 1 MiB: refused and bounded.
async fn attacks_through_actions_and_errors(
    client: &Client,
    a: &str,
    runtime: &RuntimeProcess,
) -> Result<()> {
    let api = probes(client, a);
    let delete =
        json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Probe", "name": "x?fieldManager=y"});
    apply(
        client,
        &probe(a, "bad-delete", "intruder", json!({"deletes": [delete]})),
    )
    .await?;
    wait_status(client, a, "intruder", "the bad delete refused", |s| {
        let e = s.last_error.as_deref().unwrap_or_default();
        ensure!(
            e.contains("bad-delete") && e.contains("invalid object name"),
            "lastError is {e:?}"
        );
        Ok(())
    })
    .await?;
    api.delete("bad-delete", &DeleteParams::default()).await?;

    // An undeclared kind is refused as such: the runtime does not go and discover it.
    let ghost = json!({"apiVersion": "ghost.example.com/v1", "kind": "Ghost", "name": "g"});
    apply(
        client,
        &probe(a, "ghost-delete", "intruder", json!({"deletes": [ghost]})),
    )
    .await?;
    wait_status(
        client,
        a,
        "intruder",
        "the delete of an undeclared kind refused",
        |s| {
            let e = s.last_error.as_deref().unwrap_or_default();
            ensure!(
                e.contains("ghost-delete")
                    && e.contains("may not delete Ghost (ghost.example.com/v1)")
                    && e.contains("not declared"),
                "lastError is {e:?}"
            );
            Ok(())
        },
    )
    .await?;
    api.delete("ghost-delete", &DeleteParams::default()).await?;

    apply(
        client,
        &probe(a, "loud", "intruder", json!({"failBytes": 1 << 20})),
    )
    .await?;
    let status = wait_status(
        client,
        a,
        "intruder",
        "the 1 MiB error reported, bounded",
        |s| {
            let e = s.last_error.as_deref().unwrap_or_default();
            ensure!(
                e.contains("loud") && e.contains("EEEE"),
                "lastError is {:.200?}",
                e
            );
            Ok(())
        },
    )
    .await?;
    let error = status.last_error.unwrap_or_default();
    ensure!(
        error.len() <= 4096,
        "lastError is {} bytes long",
        error.len()
    );
    let longest_log_line = runtime.log().lines().map(str::len).max().unwrap_or(0);
    ensure!(
        longest_log_line <= 16 << 10,
        "the runtime logged a line of {longest_log_line} bytes"
    );
    api.delete("loud", &DeleteParams::default()).await?;
    Ok(())
}

/// A controller granted reads its ServiceAccount lacks waits as Forbidden, naming the
/// command that fixes it; once an admin runs it, the controller becomes Ready by itself.
async fn read_granted_later_makes_the_controller_ready(
    client: &Client,
    kubectl: &Kubectl,
    a: &str,
    markers: &Markers,
) -> Result<()> {
    let grants =
        json!({"grants": [{"apiVersion": "v1", "kind": "ConfigMap", "verbs": ["get", "list"]}]});
    apply(client, &controller(a, "nosy", grants)).await?;
    apply(
        client,
        &probe(
            a,
            "nosy",
            "nosy",
            json!({"gets": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "private"}]}),
        ),
    )
    .await?;
    let fix_of = |message: &str| {
        message
            .split("echo '")
            .nth(1)
            .and_then(|rest| rest.split("' | kubectl apply -f -").next())
            .map(str::to_owned)
            .with_context(|| format!("no `echo '…' | kubectl apply -f -` in {message}"))
    };
    let refused = wait_status(
        client,
        a,
        "nosy",
        "nosy waiting as Forbidden, naming the fix",
        |s| {
            let c = ensure_condition(s, "Ready", "False")?;
            ensure!(
                c.reason == "Forbidden",
                "Ready reason is {}: {}",
                c.reason,
                c.message
            );
            fix_of(&c.message)?;
            ensure!(
                c.message.contains("asks again every 2 s"),
                "the message does not say when RBAC is asked again: {}",
                c.message
            );
            Ok(())
        },
    )
    .await?;
    let fix = fix_of(&condition(&refused, "Ready")?.message)?;
    // The fix grants everything the spec needs at once: the parent with its status, Events,
    // and the granted reads — not one 403 at a time.
    let list: Value = serde_json::from_str(&fix)?;
    let rules = &list["items"][0]["rules"];
    // Events by a RoleBinding to kubewasm-guest-events, which a namespace admin may make.
    ensure!(
        list["items"][2]["roleRef"]["name"] == "kubewasm-guest-events",
        "the fix does not bind kubewasm-guest-events: {list}"
    );
    for (resource, verb) in [
        ("probes", "patch"),
        ("probes/status", "patch"),
        ("configmaps", "watch"),
    ] {
        ensure!(
            rules
                .as_array()
                .is_some_and(|rules| rules.iter().any(|r| r["resources"][0] == resource
                    && r["verbs"]
                        .as_array()
                        .is_some_and(|v| v.iter().any(|v| v == verb)))),
            "the fix's Role lacks {verb} {resource}: {rules}"
        );
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let nosy = probes(client, a).get("nosy").await?;
    ensure!(
        nosy.data.get("status").is_none_or(Value::is_null),
        "a Forbidden controller reconciled: {:?}",
        nosy.data.get("status")
    );
    // The admin runs the command the status gives, with kubectl.
    kubectl
        .run_with_input(&["apply", "-f", "-"], Some(fix.as_bytes()))
        .await?;
    let granted = std::time::Instant::now();
    wait_status(
        client,
        a,
        "nosy",
        "nosy Ready once its ServiceAccount may read ConfigMaps",
        |s| ensure_condition(s, "Ready", "True").map(drop),
    )
    .await?;
    eprintln!(
        "isolation: nosy Ready {:.1?} after its Role was granted (--access-review-seconds 2)",
        granted.elapsed()
    );
    eventually("nosy reads its own namespace's ConfigMap", WAIT, || async {
        let p = probes(client, a).get("nosy").await?;
        let outcome = p
            .data
            .pointer("/status/results/0/outcome")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if outcome.contains(&markers.a_config) {
            Ok(Some(()))
        } else {
            bail!("outcome is {outcome:?}")
        }
    })
    .await
}

pub(crate) async fn wait_echo(client: &Client, ns: &str, name: &str, echo: &str) -> Result<()> {
    let api = probes(client, ns);
    eventually(
        &format!("Probe {ns}/{name} reconciled with echo {echo}"),
        WAIT,
        || async {
            let p = api.get(name).await?;
            let seen = p.data.pointer("/status/echo").cloned();
            if seen == Some(json!(echo)) {
                Ok(Some(()))
            } else {
                bail!("status.echo is {seen:?}")
            }
        },
    )
    .await
}

/// VmRSS of a process.
pub(crate) fn resident_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib << 10)
}

/// The runtime acts only in namespaces a cluster admin opted in (deploy/runtime/tenant.yaml)
/// and only as ServiceAccounts whose owner opted in (an annotation): with the namespace's
/// binding withdrawn, and then with the account's annotation, its controller is refused with
/// the command that opts it in, and nothing of its guest runs; opted in again, it starts by
/// itself.
#[tokio::test]
async fn a_namespace_not_opted_in_runs_no_controller() {
    let control_plane = crate::support::ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "not-opted-in").await;
    // As installed; a short review period so that the opt-in is seen soon.
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &["--access-review-seconds", "5"],
    );
    let result = not_opted_in(&client, &ns).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn not_opted_in(client: &Client, ns: &str) -> Result<()> {
    install_probe_crd(client).await?;
    install_tenant(client, ns, "secret", "config").await?;
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(client.clone(), ns);
    bindings
        .delete("kubewasm-runtime-tenant", &DeleteParams::default())
        .await
        .context("withdrawing the namespace's opt-in")?;
    apply(client, &controller(ns, "steady", json!({}))).await?;
    apply(client, &probe(ns, "steady", "steady", json!({"echo": "1"}))).await?;
    wait_status(
        client,
        ns,
        "steady",
        "the controller refused: its namespace is not opted in",
        |s| {
            let ready = ensure_condition(s, "Ready", "False")?;
            ensure!(
                ready.reason == "Forbidden"
                    && ready.message.contains("has no RoleBinding of the runtime")
                    && ready.message.contains(&format!(
                        "the namespace's admin applies it with `kubectl -n {ns} create rolebinding kubewasm-runtime-tenant --clusterrole=kubewasm-runtime-tenant --serviceaccount=kubewasm-system:kubewasm`"
                    )),
                "Ready says {}: {}",
                ready.reason,
                ready.message
            );
            Ok(())
        },
    )
    .await?;
    // The namespace opted in, the account not (its owner removed the annotation).
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), ns);
    let annotation = |value: Value| {
        merge(json!({"metadata": {"annotations": {"kubewasm.dev/wasm-controllers": value}}}))
    };
    accounts
        .patch("prober", &Default::default(), &annotation(Value::Null))
        .await?;
    apply(client, &crate::support::tenant_binding(ns)?).await?;
    wait_status(
        client,
        ns,
        "steady",
        "the controller refused: its ServiceAccount is not opted in",
        |s| {
            let ready = ensure_condition(s, "Ready", "False")?;
            ensure!(
                ready.reason == "Forbidden"
                    && ready.message.contains(&format!(
                        "kubectl -n {ns} annotate serviceaccount prober kubewasm.dev/wasm-controllers=allowed"
                    )),
                "Ready says {}: {}",
                ready.reason,
                ready.message
            );
            Ok(())
        },
    )
    .await?;
    let echoed = probes(client, ns).get("steady").await?;
    ensure!(
        echoed.data.pointer("/status/echo").is_none(),
        "the guest ran before its namespace and ServiceAccount opted in: {:?}",
        echoed.data.get("status")
    );
    accounts
        .patch("prober", &Default::default(), &annotation(json!("allowed")))
        .await?;
    wait_echo(client, ns, "steady", "1").await
}
