//! Declarations without a cluster: a manager whose API server is a closed port on loopback,
//! so every start fails fast and says why, and what is left to check is the bookkeeping —
//! which declarations start, restart and are forgotten, and what is forgotten with them.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::logs::ControllerKey;
use crate::manager::ManagerConfig;
use crate::manager::life::Phase;

/// A manager whose API server refuses every connection (port 1 on loopback).
fn manager() -> Manager {
    let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
    Manager::new(config, ManagerConfig::default()).unwrap()
}

fn id(namespace: Option<&str>, name: &str) -> ControllerId {
    ControllerId {
        namespace: namespace.map(str::to_owned),
        name: name.to_owned(),
    }
}

fn spec(module: serde_json::Value) -> WasmControllerSpec {
    serde_json::from_value(json!({
        "parent": {"apiVersion": "v1", "kind": "ConfigMap"},
        "module": module,
    }))
    .unwrap()
}

fn seen(id: &ControllerId, generation: i64) -> Declared {
    let module = match id.namespace {
        Some(_) => json!({"configMap": {"name": "m", "key": "m.wasm"}}),
        None => json!({"configMap": {"name": "m", "key": "m.wasm", "namespace": "team"}}),
    };
    Declared::Upsert(Box::new(Seen {
        id: id.clone(),
        uid: Some(format!("uid-{}", id.name)),
        generation: Some(generation),
        spec: spec(module),
        guest_state: Default::default(),
    }))
}

fn ids(manager: &Manager) -> HashSet<ControllerId> {
    manager.controllers.keys().cloned().collect()
}

#[tokio::test(start_paused = true)]
async fn a_declaration_seen_again_unchanged_is_not_started_again() {
    let mut manager = manager();
    let a = id(Some("team"), "a");
    assert!(manager.on_declared(vec![seen(&a, 1)]).await, "new: started");
    assert!(
        !manager.on_declared(vec![seen(&a, 1)]).await,
        "the same generation and spec: left alone"
    );
    assert_eq!(ids(&manager), [a].into());
}

#[tokio::test(start_paused = true)]
async fn a_changed_declaration_starts_anew_and_keeps_the_guests_saved_state() {
    let mut manager = manager();
    let a = id(Some("team"), "a");
    manager.on_declared(vec![seen(&a, 1)]).await;
    let state = manager.controllers[&a].state.clone();
    assert!(
        manager.on_declared(vec![seen(&a, 2)]).await,
        "a new generation"
    );
    let m = &manager.controllers[&a];
    assert_eq!(m.generation, Some(2));
    assert!(
        Arc::ptr_eq(&m.state, &state),
        "the state this process holds is not read again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_start_that_cannot_reach_the_api_server_is_refused_and_says_why() {
    let mut manager = manager();
    let a = id(Some("team"), "a");
    manager.on_declared(vec![seen(&a, 1)]).await;
    let m = &manager.controllers[&a];
    assert!(m.life.guest().is_none(), "nothing was read");
    let Phase::Refused(problem) = m.life.phase() else {
        panic!("not refused")
    };
    assert_eq!(
        problem.reason,
        crate::api::Reason::AccessReviewFailed,
        "{problem:?}"
    );

    // A module source a WasmController may not name: said as the spec's fault, nothing read.
    let b = id(Some("team"), "b");
    let Declared::Upsert(mut file) = seen(&b, 1) else {
        unreachable!()
    };
    file.spec = spec(json!({"path": "/modules/m.wasm"}));
    manager.on_declared(vec![Declared::Upsert(file)]).await;
    let Phase::ModuleFailed(problem) = manager.controllers[&b].life.phase() else {
        panic!("its module did not fail")
    };
    assert_eq!(problem.reason, crate::api::Reason::InvalidSpec);
    assert_eq!(problem.message, crate::api::NO_MODULE_FILES);
}

#[tokio::test(start_paused = true)]
async fn a_relist_forgets_only_what_its_own_kind_no_longer_lists_and_their_logs() {
    let mut manager = manager();
    let (a, b, cluster) = (id(Some("team"), "a"), id(Some("team"), "b"), id(None, "c"));
    manager
        .on_declared(vec![seen(&a, 1), seen(&b, 1), seen(&cluster, 1)])
        .await;
    let logs = manager.config.logs.clone();
    let key = |id: &ControllerId| ControllerKey {
        namespace: id.namespace.clone(),
        name: id.name.clone(),
    };
    for id in [&a, &b, &cluster] {
        logs.push(&key(id), k8s_openapi::jiff::Timestamp::now(), "a line");
    }

    // WasmControllers relisted without b: b goes, the ClusterWasmController stays.
    let listed = Declared::Relisted([a.clone()].into(), false);
    assert!(!manager.on_declared(vec![listed]).await, "nothing started");
    assert_eq!(ids(&manager), [a.clone(), cluster.clone()].into());
    assert!(!manager.declared.contains_key(&b));
    assert_eq!(
        logs.ring_bytes(&key(&b)),
        0,
        "b's log lines are forgotten with it"
    );
    assert!(logs.ring_bytes(&key(&a)) > 0, "a's are kept");

    // ClusterWasmControllers relisted empty: c goes, a stays.
    manager
        .on_declared(vec![Declared::Relisted(HashSet::new(), true)])
        .await;
    assert_eq!(ids(&manager), [a.clone()].into());
    assert_eq!(logs.ring_bytes(&key(&cluster)), 0);

    // Deleted: gone, with what is remembered of it.
    manager.on_declared(vec![Declared::Delete(a.clone())]).await;
    assert!(manager.controllers.is_empty() && manager.declared.is_empty());
    assert_eq!(logs.ring_bytes(&key(&a)), 0);
}
