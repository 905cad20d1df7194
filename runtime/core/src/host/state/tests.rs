//! The saved states: bounds, group commit, saves left behind, and the accounts per namespace.

use super::entries::cost;
use super::*;
use crate::api::{Reason, state_prefix};
use kube::Client;
use serde_json::{Value, json};

/// A book of a namespace with no cap.
fn unbounded() -> StateBook {
    StateAccounts::new(usize::MAX).open(Some("ns"))
}

#[tokio::test]
async fn saves_forgets_and_refuses_past_the_quota() {
    let state = GuestState::new(
        StateOwner::Memory,
        10 * cost("ns/0", "v"),
        unbounded(),
        BTreeMap::new(),
    );
    state.set("ns/a", Some("one")).await.unwrap();
    assert_eq!(state.get("ns/a").as_deref(), Some("one"));
    assert!(!state.changes("ns/a", Some("one")));
    state.set("ns/a", None).await.unwrap();
    assert_eq!(state.get("ns/a"), None);
    assert_eq!(state.used_bytes(), 0);

    let big = "x".repeat(MAX_GUEST_STATE_BYTES + 1);
    let err = state.set("ns/a", Some(&big)).await.unwrap_err();
    assert!(matches!(err, StateError::TooLarge { .. }), "{err}");

    for i in 0..10 {
        state.set(&format!("ns/{i}"), Some("v")).await.unwrap();
    }
    let err = state.set("ns/x", Some("v")).await.unwrap_err();
    assert!(
        err.to_string().contains("--max-state-bytes-per-controller"),
        "{err}"
    );
    // Replacing an existing entry by one as large, or forgetting one, still works when
    // full.
    state.set("ns/0", Some("w")).await.unwrap();
    state.set("ns/1", None).await.unwrap();
    state.set("ns/x", Some("v")).await.unwrap();
    assert_eq!(state.len(), 10);
}

#[tokio::test]
async fn ten_thousand_objects_fit_the_default_quota() {
    let state = GuestState::new(StateOwner::Memory, 8 << 20, unbounded(), BTreeMap::new());
    let value = "s".repeat(MAX_GUEST_STATE_BYTES);
    for i in 0..10_000 {
        state
            .set(
                &format!("namespace-{:04}/pod-{i:05}", i % 1000),
                Some(&value),
            )
            .await
            .unwrap();
    }
    assert_eq!(state.len(), 10_000);
    assert!(state.used_bytes() <= 8 << 20, "{}", state.used_bytes());
}

#[tokio::test]
async fn states_found_in_the_status_are_loaded_within_the_bounds() {
    let found = BTreeMap::from([
        ("ns/ok".to_owned(), "v".to_owned()),
        ("ns/big".to_owned(), "x".repeat(MAX_GUEST_STATE_BYTES + 1)),
    ]);
    let state = GuestState::new(StateOwner::Memory, usize::MAX, unbounded(), found);
    assert_eq!(state.get("ns/ok"), None, "nothing before the load");
    state.load(None).await.unwrap();
    assert_eq!(state.get("ns/ok").as_deref(), Some("v"));
    assert_eq!(state.get("ns/big"), None);
}

#[test]
fn keys_spread_over_every_shard() {
    let mut seen = vec![0usize; STATE_SHARDS as usize];
    for i in 0..1600 {
        seen[shard_of_key(&format!("ns/pod-{i}"))] += 1;
    }
    assert!(seen.iter().all(|&n| (50..=150).contains(&n)), "{seen:?}");
}

/// What the mock API server was sent: method, path, body.
type Sent = std::sync::Arc<Mutex<Vec<(String, String, Value)>>>;

/// A mock API server that answers every request with HTTP `status` (200: a
/// WasmControllerState) after a moment, recording method, path and body.
fn api_server_answering(status: u16) -> (Client, Sent) {
    use http::{Request, Response};
    use kube::client::Body;
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let sent = std::sync::Arc::new(Mutex::new(Vec::new()));
    tokio::spawn({
        let sent = sent.clone();
        async move {
            while let Some((request, respond)) = handle.next_request().await {
                let method = request.method().to_string();
                let path = request.uri().path().to_owned();
                let bytes = request
                    .into_body()
                    .collect_bytes()
                    .await
                    .unwrap_or_default();
                let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                sent.locked().push((method, path, body));
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                let reply = if status == 200 {
                    json!({"apiVersion": "kubewasm.dev/v1alpha1",
                        "kind": "WasmControllerState", "metadata": {"name": "s"},
                        "spec": {"controller": "c", "shard": 0}})
                } else {
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "etcd is unhappy", "reason": "InternalError", "code": status})
                };
                respond.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                        .unwrap(),
                );
            }
        }
    });
    (Client::new(service, "ns"), sent)
}

#[tokio::test]
async fn saves_of_one_shard_waiting_for_a_write_go_together_in_the_next() {
    let (state, sent) = store_answering(200);
    let keys = keys_of_shard_7(50);
    let saves = keys.iter().map(|k| state.set(k, Some("seen")));
    for saved in futures::future::join_all(saves).await {
        saved.unwrap();
    }
    let sent = sent.locked().clone();
    assert!(
        sent.len() <= 3,
        "{} writes for 50 saves of one shard",
        sent.len()
    );
    let mut written = std::collections::BTreeSet::new();
    for (method, path, body) in &sent {
        assert_eq!(method, "PATCH");
        assert!(
            path.ends_with(&format!(
                "/namespaces/ns/wasmcontrollerstates/{}-07",
                state_prefix("WasmController", "hello")
            )),
            "{path}"
        );
        written.extend(body["spec"]["entries"].as_object().unwrap().keys().cloned());
    }
    assert_eq!(written, keys.iter().cloned().collect());
    assert_eq!(state.len(), 50);
}

/// The states of WasmController ns/hello, kept through a mock API server answering
/// `status`.
fn store_answering(status: u16) -> (Arc<GuestState>, Sent) {
    store_answering_in(status, unbounded())
}

/// The states of WasmController ns/hello, charged to `book`, kept through a mock API server
/// answering `status`.
fn store_answering_in(status: u16, book: StateBook) -> (Arc<GuestState>, Sent) {
    let (client, sent) = api_server_answering(status);
    let owner = StateOwner::of(
        client,
        Some("ns"),
        "hello",
        Some("uid-1"),
        "kubewasm-system",
    );
    (
        Arc::new(GuestState::new(owner, usize::MAX, book, BTreeMap::new())),
        sent,
    )
}

/// Keys of one shard (7).
fn keys_of_shard_7(n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("ns/pod-{i}"))
        .filter(|k| shard_of_key(k) == 7)
        .take(n)
        .collect()
}

#[tokio::test]
async fn saves_left_behind_go_in_one_write_and_the_next_reconcile_waits_for_it() {
    let (state, sent) = store_answering(200);
    let keys = keys_of_shard_7(40);
    for k in &keys {
        state
            .set_behind(k, Some("seen"), crate::controller::Fence::default())
            .unwrap();
    }
    assert!(
        sent.locked().is_empty(),
        "nothing written before the linger"
    );
    assert_eq!(
        state.get(&keys[0]),
        None,
        "not in memory before it is stored"
    );
    // The next reconcile of an object waits for its save.
    state.settled(&keys[39]).await.unwrap();
    assert_eq!(state.get(&keys[39]).as_deref(), Some("seen"));
    assert_eq!(state.len(), 40);
    let sent = sent.locked().clone();
    assert_eq!(sent.len(), 1, "40 saves in {} writes", sent.len());
    assert_eq!(sent[0].2["spec"]["entries"].as_object().unwrap().len(), 40);
    // An object with nothing waiting does not wait.
    state.settled("ns/other").await.unwrap();
}

#[tokio::test]
async fn a_save_left_behind_that_fails_fails_the_next_reconcile_and_is_not_kept() {
    let (state, sent) = store_answering(500);
    let key = &keys_of_shard_7(1)[0];
    state
        .set_behind(key, Some("seen"), crate::controller::Fence::default())
        .unwrap();
    let err = state.settled(key).await.unwrap_err().to_string();
    assert!(err.contains("etcd is unhappy"), "{err}");
    assert_eq!(state.get(key), None);
    assert!(!sent.locked().is_empty());
    // Said once: the reconcile after the failed one goes on with what is stored.
    state.settled(key).await.unwrap();
}

#[tokio::test]
async fn a_save_left_behind_is_written_when_its_shard_is_being_given_up() {
    let (state, sent) = store_answering(200);
    let key = &keys_of_shard_7(1)[0];
    let fence = crate::controller::Fence::default();
    state.set_behind(key, Some("seen"), fence.clone()).unwrap();
    fence.leave(); // handed over: the Lease is kept until the controller has stopped
    assert_eq!(state.flush().await, 0);
    assert_eq!(sent.locked().len(), 1);
    assert_eq!(state.get(key).as_deref(), Some("seen"));
}

#[tokio::test]
async fn a_save_left_behind_is_not_sent_once_the_fence_is_shut() {
    let (state, sent) = store_answering(200);
    let key = &keys_of_shard_7(1)[0];
    let fence = crate::controller::Fence::default();
    state.set_behind(key, Some("seen"), fence.clone()).unwrap();
    fence.close(); // the shard lost before the linger ended
    let err = state.settled(key).await.unwrap_err().to_string();
    assert!(err.contains("no longer holds"), "{err}");
    assert!(sent.locked().is_empty(), "sent: {:?}", sent.locked());
    assert_eq!(state.get(key), None);
}

// Paused time: the linger is 100 ms of the test's clock, the mock's answers 20 ms each.
#[tokio::test(start_paused = true)]
async fn a_flush_waits_for_the_write_a_lingering_writer_has_in_flight() {
    let (state, sent) = store_answering(200);
    let key = &keys_of_shard_7(1)[0];
    state
        .set_behind(key, Some("seen"), crate::controller::Fence::default())
        .unwrap();
    // The linger is over and its writer has sent the save; the answer takes 20 ms more.
    tokio::time::sleep(LINGER + std::time::Duration::from_millis(5)).await;
    assert_eq!(sent.locked().len(), 1, "the lingering writer sent it");
    assert_eq!(state.get(key), None, "not answered yet");
    assert_eq!(state.flush().await, 0);
    assert_eq!(
        state.get(key).as_deref(),
        Some("seen"),
        "answered when flush returns"
    );
}

// Paused time: the linger is 100 ms of the test's clock, the mock's answers 20 ms each.
#[tokio::test(start_paused = true)]
async fn a_flush_writes_the_saves_left_behind_at_once() {
    let (state, sent) = store_answering(200);
    let keys = keys_of_shard_7(3);
    let other = (0..)
        .map(|i| format!("ns/other-{i}"))
        .find(|k| shard_of_key(k) != 7)
        .unwrap();
    for k in keys.iter().chain([&other]) {
        state
            .set_behind(k, Some("seen"), crate::controller::Fence::default())
            .unwrap();
    }
    let started = tokio::time::Instant::now();
    assert_eq!(state.flush().await, 0);
    assert!(started.elapsed() < LINGER, "waited for the linger");
    assert_eq!(state.len(), 4, "every save stored when the flush returns");
    assert_eq!(sent.locked().len(), 2, "one write per shard");
    // The lingering writers find nothing left.
    tokio::time::sleep(LINGER * 2).await;
    assert_eq!(sent.locked().len(), 2);
}

/// The states of a controller of `namespace`, in memory, charged to `accounts`.
fn in_namespace(accounts: &Arc<StateAccounts>, namespace: &str) -> Arc<GuestState> {
    let book = accounts.open(Some(namespace));
    Arc::new(GuestState::new(
        StateOwner::Memory,
        usize::MAX,
        book,
        BTreeMap::new(),
    ))
}

#[tokio::test]
async fn a_namespace_s_controllers_share_its_cap_and_a_dropped_one_gives_its_bytes_back() {
    let one = cost("team-a/o-00", "v");
    let accounts = StateAccounts::new(10 * one);
    let (a, b) = (
        in_namespace(&accounts, "team-a"),
        in_namespace(&accounts, "team-a"),
    );
    let other = in_namespace(&accounts, "team-b");
    for i in 0..6 {
        a.set(&format!("team-a/o-{i:02}"), Some("v")).await.unwrap();
    }
    for i in 6..10 {
        b.set(&format!("team-a/o-{i:02}"), Some("v")).await.unwrap();
    }
    assert_eq!(accounts.used(Some("team-a")), 10 * one);
    let err = a.set("team-a/o-10", Some("v")).await.unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err, StateError::NamespaceFull { used, mine, .. } if used == 10 * one && mine == 6 * one),
        "{err:?}"
    );
    assert_eq!(err.reason(), Reason::StateBudgetExceeded);
    for said in [
        "namespace team-a's controllers",
        "--max-state-bytes-per-namespace",
        &format!("{} bytes used", 10 * one),
        "setState(null)",
    ] {
        assert!(message.contains(said), "{message}");
    }
    assert_eq!(a.get("team-a/o-10"), None, "refused, so not kept");
    assert_eq!(
        accounts.used(Some("team-a")),
        10 * one,
        "a refusal charges nothing"
    );
    // Another namespace is not held back by team-a.
    other.set("team-b/o-00", Some("v")).await.unwrap();
    // What one controller forgets, another may save; a value as large in place of one is fine.
    b.set("team-a/o-09", None).await.unwrap();
    a.set("team-a/o-10", Some("v")).await.unwrap();
    a.set("team-a/o-10", Some("w")).await.unwrap();
    assert!(b.set("team-a/o-11", Some("v")).await.is_err());
    // A controller deleted (or handed over): its states dropped, its bytes credited.
    drop(a);
    assert_eq!(accounts.used(Some("team-a")), 3 * one);
    for i in 11..18 {
        b.set(&format!("team-a/o-{i:02}"), Some("v")).await.unwrap();
    }
    assert_eq!(accounts.used(Some("team-a")), 10 * one);
    drop((b, other));
    assert_eq!(accounts.tenants(), 0, "every book credited");
}

#[tokio::test]
async fn saves_not_yet_written_count_against_the_cap() {
    let one = cost("team-a/o-00", "v");
    let accounts = StateAccounts::new(10 * one);
    let state = in_namespace(&accounts, "team-a");
    let fence = crate::controller::Fence::default();
    // Twenty saves left behind within one linger: nothing is stored yet when each is checked.
    let refused = (0..20)
        .filter(|i| {
            state
                .set_behind(&format!("team-a/o-{i:02}"), Some("v"), fence.clone())
                .is_err()
        })
        .count();
    assert_eq!(
        refused, 10,
        "saves waiting for their write were not counted"
    );
    assert_eq!(state.len(), 0, "none written yet");
    assert_eq!(state.flush().await, 0);
    assert_eq!(state.len(), 10);
    assert_eq!(accounts.used(Some("team-a")), 10 * one);
    // A second save of a key waiting replaces the first in its batch: counted once.
    state
        .set_behind("team-a/o-00", None, fence.clone())
        .unwrap();
    state
        .set_behind("team-a/o-00", Some("w"), fence.clone())
        .unwrap();
    state.set_behind("team-a/o-00", None, fence).unwrap();
    assert_eq!(state.flush().await, 0);
    assert_eq!(accounts.used(Some("team-a")), 9 * one);
}

#[tokio::test]
async fn a_failed_write_gives_back_what_its_saves_reserved() {
    let accounts = StateAccounts::new(1 << 20);
    let (state, _) = store_answering_in(500, accounts.open(Some("ns")));
    let key = &keys_of_shard_7(1)[0];
    state
        .set_behind(key, Some("seen"), crate::controller::Fence::default())
        .unwrap();
    assert!(accounts.used(Some("ns")) > 0, "reserved while waiting");
    assert!(state.settled(key).await.is_err());
    assert_eq!(accounts.used(Some("ns")), 0);
}

// Paused time: the mock's answers take 20 ms of the test's clock.
#[tokio::test(start_paused = true)]
async fn a_write_dropped_unanswered_gives_back_what_its_saves_reserved() {
    let accounts = StateAccounts::new(1 << 20);
    let (state, sent) = store_answering_in(200, accounts.open(Some("ns")));
    let key = &keys_of_shard_7(1)[0];
    let cancelled = tokio::time::timeout(
        std::time::Duration::from_millis(5),
        state.set(key, Some("seen")),
    )
    .await;
    assert!(cancelled.is_err(), "the write was answered within 5 ms");
    assert_eq!(sent.locked().len(), 1, "it was sent");
    assert_eq!(accounts.used(Some("ns")), 0);
    assert_eq!(state.get(key), None);
}

#[tokio::test]
async fn states_loaded_past_the_cap_are_charged_and_only_forgets_pass() {
    let one = cost("ns/o-0", "v");
    let accounts = StateAccounts::new(2 * one);
    let found: BTreeMap<String, String> = (0..3)
        .map(|i| (format!("ns/o-{i}"), "v".to_owned()))
        .collect();
    let state = GuestState::new(
        StateOwner::Memory,
        usize::MAX,
        accounts.open(Some("ns")),
        found,
    );
    state.load(None).await.unwrap();
    assert_eq!(state.len(), 3, "what is stored is loaded, whatever the cap");
    assert_eq!(accounts.used(Some("ns")), 3 * one);
    let err = state.set("ns/o-3", Some("v")).await.unwrap_err();
    assert!(matches!(err, StateError::NamespaceFull { .. }), "{err}");
    state.set("ns/o-0", None).await.unwrap();
    state.set("ns/o-1", Some("w")).await.unwrap();
    assert_eq!(accounts.used(Some("ns")), 2 * one);
}

#[tokio::test]
async fn a_controller_over_its_own_quota_says_so_with_the_same_reason() {
    let state = GuestState::new(StateOwner::Memory, 1, unbounded(), BTreeMap::new());
    let err = state.set("ns/a", Some("v")).await.unwrap_err();
    assert!(matches!(err, StateError::Full { .. }), "{err}");
    assert_eq!(err.reason(), Reason::StateBudgetExceeded);
}
