//! The Chronos pod watcher from `deploy/examples/pod-watcher/`, as a read-only
//! ClusterWasmController: one line in the runtime's log per change of a Pod (added, updated
//! saying what changed, deleted), findable by the controller field, and no write at all — in
//! two namespaces, across a restart of the runtime during which Pods are changed, deleted and
//! created: every change is reported exactly once, in order.

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{WAIT, apply, apply_all, example, guest, module_config_map, take};
use crate::merge;
use crate::restarter::{Owner, create_pod};
use crate::runtime::RuntimeProcess;
use crate::support::{ControlPlane, eventually};

/// The pod watcher's messages about Pod `namespace/name` in `log`, in order.
fn lines_about(log: &str, namespace: &str, name: &str) -> Vec<String> {
    let pod = format!("pod {namespace}/{name} ");
    log.lines()
        .filter(|l| l.contains("controller=\"pod-watcher\""))
        .filter_map(|l| {
            let line = &l[l.find(&pod)?..];
            // The guest's fields follow its message.
            let end = line.find(" controller=\"").unwrap_or(line.len());
            Some(line[..end].trim_end().to_owned())
        })
        .collect()
}

/// Installs the example (module and ServiceAccount in `modules`), then changes Pods in two
/// namespaces of their own before, during and after a restart (SIGTERM) of `runtime`.
pub async fn pod_watcher(
    control_plane: &ControlPlane,
    client: &Client,
    modules: &str,
    runtime: &mut RuntimeProcess,
) -> Result<()> {
    apply_all(client, &example("pod-watcher/rbac.yaml", modules)?).await?;
    apply(
        client,
        &module_config_map(
            modules,
            "pod-watcher",
            "pod_watcher.wasm",
            &guest("pod_watcher"),
        ),
    )
    .await?;
    let mut controller = example("pod-watcher/controller.yaml", modules)?;
    let mut controller = take(&mut controller, "ClusterWasmController")?;
    controller["spec"]["module"]["configMap"]["namespace"] = json!(modules);
    apply(client, &controller).await?;

    let a = control_plane.namespace("chronos-a").await?;
    let b = control_plane.namespace("chronos-b").await?;
    let pods_a: Api<Pod> = Api::namespaced(client.clone(), &a);
    let pods_b: Api<Pod> = Api::namespaced(client.clone(), &b);
    let offset = runtime.log_len();
    let logged = |runtime: &RuntimeProcess, ns: &str, name: &str, line: String| {
        let log = runtime.log_since(offset);
        let seen = lines_about(&log, ns, name);
        (seen.contains(&line), seen)
    };
    macro_rules! wait_line {
        ($ns:expr, $name:expr, $line:expr) => {{
            let (ns, name, line): (&str, &str, String) = ($ns, $name, $line);
            eventually(
                &format!("the runtime logs {line:?} for pod-watcher"),
                WAIT,
                || async {
                    let (found, seen) = logged(runtime, ns, name, line.clone());
                    ensure!(found, "lines about {ns}/{name} so far: {seen:?}");
                    Ok(Some(()))
                },
            )
            .await?;
        }};
    }
    let saved = |key: String, has: &'static str| async move {
        eventually(
            &format!("the pod watcher's saved state for {key} to contain {has:?}"),
            WAIT,
            || async {
                let state = Owner::Cluster("pod-watcher").saved(client, &key).await?;
                ensure!(
                    state.as_deref().is_some_and(|s| s.contains(has)),
                    "the saved state of {key} is {state:?}"
                );
                Ok(Some(()))
            },
        )
        .await
    };
    let relabel = |pods: &Api<Pod>, name: &'static str, labels: serde_json::Value| {
        let pods = pods.clone();
        async move {
            pods.patch(
                name,
                &Default::default(),
                &merge(json!({"metadata": {"labels": labels}})),
            )
            .await
            .map(drop)
        }
    };

    // Before the restart.
    create_pod(&pods_a, "one", "web").await?;
    create_pod(&pods_b, "two", "db").await?;
    wait_line!(
        &a,
        "one",
        format!("pod {a}/one added: phase Pending, node -, labels {{app=web}}")
    );
    wait_line!(
        &b,
        "two",
        format!("pod {b}/two added: phase Pending, node -, labels {{app=db}}")
    );
    relabel(&pods_a, "one", json!({"tier": "front"})).await?;
    wait_line!(
        &a,
        "one",
        format!("pod {a}/one updated: labels {{app=web}} → {{app=web,tier=front}}")
    );
    saved(format!("{a}/one"), "front").await?;
    saved(format!("{b}/two"), "db").await?;

    // While the runtime is down: a change, a deletion, a creation.
    runtime.stop()?;
    relabel(&pods_b, "two", json!({"app": "cache"})).await?;
    pods_a.delete("one", &DeleteParams::default()).await?;
    create_pod(&pods_a, "three", "web").await?;
    runtime.start_again();
    wait_line!(
        &b,
        "two",
        format!("pod {b}/two updated: labels {{app=db}} → {{app=cache}}")
    );
    wait_line!(&a, "one", format!("pod {a}/one deleted"));
    wait_line!(
        &a,
        "three",
        format!("pod {a}/three added: phase Pending, node -, labels {{app=web}}")
    );

    // After it.
    relabel(&pods_a, "three", json!({"app": "shop"})).await?;
    wait_line!(
        &a,
        "three",
        format!("pod {a}/three updated: labels {{app=web}} → {{app=shop}}")
    );
    pods_b.delete("two", &DeleteParams::default()).await?;
    pods_a.delete("three", &DeleteParams::default()).await?;
    wait_line!(&b, "two", format!("pod {b}/two deleted"));
    wait_line!(&a, "three", format!("pod {a}/three deleted"));

    // Every change once, in order: nothing lost, nothing repeated by the restart.
    let log = runtime.log_since(offset);
    let expected = [
        (
            &a,
            "one",
            vec![
                format!("pod {a}/one added: phase Pending, node -, labels {{app=web}}"),
                format!("pod {a}/one updated: labels {{app=web}} → {{app=web,tier=front}}"),
                format!("pod {a}/one deleted"),
            ],
        ),
        (
            &b,
            "two",
            vec![
                format!("pod {b}/two added: phase Pending, node -, labels {{app=db}}"),
                format!("pod {b}/two updated: labels {{app=db}} → {{app=cache}}"),
                format!("pod {b}/two deleted"),
            ],
        ),
        (
            &a,
            "three",
            vec![
                format!("pod {a}/three added: phase Pending, node -, labels {{app=web}}"),
                format!("pod {a}/three updated: labels {{app=web}} → {{app=shop}}"),
                format!("pod {a}/three deleted"),
            ],
        ),
    ];
    for (ns, name, lines) in &expected {
        let seen = lines_about(&log, ns, name);
        ensure!(
            &seen == lines,
            "the pod watcher's lines about {ns}/{name}:\n{seen:#?}\nexpected:\n{lines:#?}"
        );
    }
    // What it kept about them went with them.
    for key in [format!("{a}/one"), format!("{b}/two"), format!("{a}/three")] {
        eventually(
            &format!("the state of {key} to be forgotten"),
            WAIT,
            || async {
                let state = Owner::Cluster("pod-watcher").saved(client, &key).await?;
                ensure!(state.is_none(), "the saved state of {key} is {state:?}");
                Ok(Some(()))
            },
        )
        .await?;
    }
    ensure!(
        !log.lines()
            .any(|l| l.contains("controller=\"pod-watcher\"") && l.contains("applied ")),
        "the pod watcher wrote something"
    );
    Ok(())
}
