//! The shard set's rounds against an in-memory Lease API: a mock of the API server's
//! compare-and-swap on resourceVersion (create refused when the name exists, replace and
//! delete refused when the version moved), enough for replicas to race as they do on a real
//! one. The live `shards` tests run the same rounds on a real control plane; these check the
//! arithmetic of shares, hand-overs and expiries one round at a time.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};

use super::*;

const NAMESPACE: &str = "kubewasm-system";

/// Leases by name, as stored (with `resourceVersion`).
type Store = Arc<Mutex<BTreeMap<String, Value>>>;

fn status(code: u16, reason: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "reason": reason, "message": reason, "code": code}),
    )
}

/// What the store answers to `method` on `path` with `body`.
fn answer(store: &Store, next: &mut u64, method: &str, path: &str, body: Value) -> (u16, Value) {
    let collection = format!("/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases");
    let (path, _query) = path.split_once('?').unwrap_or((path, ""));
    let name = path
        .strip_prefix(&collection)
        .map(|rest| rest.trim_start_matches('/').to_owned())
        .unwrap_or_else(|| panic!("not a Lease path: {path}"));
    let mut leases = store.lock().unwrap();
    let version = |lease: &Value| {
        lease["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_owned)
    };
    match (method, name.is_empty()) {
        ("GET", true) => (
            200,
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "LeaseList",
                "metadata": {"resourceVersion": next.to_string()},
                "items": leases.values().cloned().collect::<Vec<_>>()}),
        ),
        ("GET", false) => match leases.get(&name) {
            Some(lease) => (200, lease.clone()),
            None => status(404, "NotFound"),
        },
        ("POST", true) => {
            let mut lease = body;
            let name = lease["metadata"]["name"].as_str().unwrap().to_owned();
            if leases.contains_key(&name) {
                return status(409, "AlreadyExists");
            }
            *next += 1;
            lease["metadata"]["resourceVersion"] = json!(next.to_string());
            lease["metadata"]["uid"] = json!(format!("uid-{name}"));
            leases.insert(name, lease.clone());
            (201, lease)
        }
        ("PUT", false) => {
            let mut lease = body;
            match leases.get(&name) {
                None => status(404, "NotFound"),
                Some(stored) if version(stored) != version(&lease) => status(409, "Conflict"),
                Some(_) => {
                    *next += 1;
                    lease["metadata"]["resourceVersion"] = json!(next.to_string());
                    leases.insert(name, lease.clone());
                    (200, lease)
                }
            }
        }
        ("DELETE", false) => {
            let wanted = body["preconditions"]["resourceVersion"].as_str();
            match leases.get(&name) {
                None => status(404, "NotFound"),
                Some(stored) if wanted.is_some() && version(stored).as_deref() != wanted => {
                    status(409, "Conflict")
                }
                Some(_) => (200, leases.remove(&name).unwrap()),
            }
        }
        _ => panic!("the shard set does not {method} {path}"),
    }
}

/// A client of an in-memory Lease API, and the store behind it.
fn lease_api() -> (Client, Store) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let store = Store::default();
    tokio::spawn({
        let store = store.clone();
        async move {
            let mut next = 1;
            while let Some((request, respond)) = handle.next_request().await {
                let method = request.method().to_string();
                let path = request.uri().to_string();
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let (code, reply) = answer(&store, &mut next, &method, &path, body);
                let response = Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap();
                respond.send_response(response);
            }
        }
    });
    (Client::new(service, NAMESPACE), store)
}

fn replica(client: &Client, identity: &str, shards: u32) -> ShardHolder {
    ShardHolder::new(
        client.clone(),
        ShardSettings {
            namespace: NAMESPACE.into(),
            prefix: "kubewasm".into(),
            shards,
            identity: identity.into(),
            duration: Duration::from_secs(15),
        },
    )
}

fn held(replica: &ShardHolder) -> Vec<u32> {
    replica.held().keys().copied().collect()
}

/// The holder of each shard Lease in the store.
fn holders(store: &Store) -> BTreeMap<String, Option<String>> {
    store
        .lock()
        .unwrap()
        .iter()
        .filter(|(name, _)| name.contains("-shard-"))
        .map(|(name, lease)| {
            let holder = lease["spec"]["holderIdentity"].as_str().map(str::to_owned);
            (name.clone(), holder)
        })
        .collect()
}

/// Makes every Lease in the store last renewed `seconds` ago (its holder stopped renewing).
fn renewed_ago(store: &Store, seconds: i64) {
    let then = Timestamp::now()
        .checked_sub(SignedDuration::from_secs(seconds))
        .unwrap()
        .to_string();
    for lease in store.lock().unwrap().values_mut() {
        lease["spec"]["renewTime"] = json!(then);
    }
}

/// Says that the runners of every shard `replica` is giving up are stopped.
fn stop_leaving(replica: &ShardHolder) {
    for shard in replica.leaving() {
        replica.stopped(shard);
    }
}

#[tokio::test]
async fn a_second_replica_gets_half_the_shards_handed_over_never_held_twice() {
    let (client, store) = lease_api();
    let (a, b) = (replica(&client, "a", 4), replica(&client, "b", 4));
    a.round().await.unwrap();
    assert_eq!(held(&a), [0, 1, 2, 3], "alone, a takes every shard");
    b.round().await.unwrap();
    assert_eq!(held(&b), [] as [u32; 0], "every shard is held and live");

    // a sees b: its share is two; it leaves the two highest, and keeps their Leases until
    // their runners stopped.
    a.round().await.unwrap();
    assert_eq!(a.leaving(), [2, 3].into());
    let leaving = a.held();
    assert!(
        leaving[&2].is_held() && !leaving[&2].is_open(),
        "left: nothing new acts"
    );
    b.round().await.unwrap();
    assert_eq!(held(&b), [] as [u32; 0], "not before a released them");

    stop_leaving(&a);
    a.round().await.unwrap();
    assert_eq!(held(&a), [0, 1]);
    assert!(
        !leaving[&2].is_held(),
        "a's fence of a released shard is shut"
    );
    b.round().await.unwrap();
    assert_eq!(held(&b), [2, 3]);
    let expected = BTreeMap::from([
        ("kubewasm-shard-000".to_owned(), Some("a".to_owned())),
        ("kubewasm-shard-001".to_owned(), Some("a".to_owned())),
        ("kubewasm-shard-002".to_owned(), Some("b".to_owned())),
        ("kubewasm-shard-003".to_owned(), Some("b".to_owned())),
    ]);
    assert_eq!(holders(&store), expected);

    // Steady: more rounds change nothing.
    for _ in 0..3 {
        a.round().await.unwrap();
        b.round().await.unwrap();
    }
    assert_eq!((held(&a), held(&b)), (vec![0, 1], vec![2, 3]));
    assert_eq!(holders(&store), expected);
}

#[tokio::test]
async fn the_shards_of_a_replica_that_stopped_renewing_go_to_the_others_and_its_fences_shut() {
    let (client, store) = lease_api();
    let (a, b) = (replica(&client, "a", 3), replica(&client, "b", 3));
    a.round().await.unwrap();
    let fences = a.held();
    assert_eq!(fences.len(), 3);
    // a freezes for a minute: every Lease it wrote was last renewed a minute ago.
    renewed_ago(&store, 60);
    b.round().await.unwrap();
    assert_eq!(
        held(&b),
        [0, 1, 2],
        "b alone is live: it takes the expired shards"
    );
    let taken = store.lock().unwrap()["kubewasm-shard-000"].clone();
    assert_eq!(taken["spec"]["holderIdentity"], "b");
    assert_eq!(taken["spec"]["leaseTransitions"], 1);

    // a wakes up: its renewals find b's Leases, so it drops every shard at once.
    a.round().await.unwrap();
    assert_eq!(held(&a), [] as [u32; 0]);
    assert!(
        fences.values().all(|f| !f.is_held()),
        "the frozen replica's fences are shut"
    );
    assert_eq!(
        holders(&store).values().flatten().collect::<Vec<_>>(),
        ["b", "b", "b"]
    );
}

#[tokio::test]
async fn a_member_lease_long_expired_is_deleted_and_not_counted() {
    let (client, store) = lease_api();
    let (a, gone) = (replica(&client, "a", 2), replica(&client, "gone", 2));
    // A replica that crashed long ago: its Leases were last renewed twenty Leases back.
    gone.round().await.unwrap();
    assert_eq!(held(&gone), [0, 1]);
    renewed_ago(&store, 15 * i64::from(STALE_MEMBER_LEASES) + 60);
    a.round().await.unwrap();
    assert_eq!(
        held(&a),
        [0, 1],
        "a replica long gone is not a member: a takes its share"
    );
    assert!(
        !store.lock().unwrap().contains_key("kubewasm-member-gone"),
        "its member Lease is deleted"
    );
}
