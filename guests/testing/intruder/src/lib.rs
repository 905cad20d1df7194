//! A tenant's hostile guest, for the isolation tests: it tries the reads and actions its
//! parent's spec lists, things its ServiceAccount's RBAC does not allow, and writes what came
//! back into the parent's status, so a test can assert that every attempt was refused and
//! nothing was revealed.
//!
//! The parent (any kind with a status) says what to try:
//!
//! ```yaml
//! spec:
//!   echo: "3"                       # copied to status.echo: shows the controller reconciles
//!   gets:                           # cluster.get of each
//!   - {apiVersion: v1, kind: Secret, namespace: team-b, name: token}
//!   lists:                          # cluster.list of each
//!   - {apiVersion: v1, kind: Secret, labelSelector: "a=b"}
//!   deletes:                        # delete actions, after the status (a bad one fails the call)
//!   - {apiVersion: example.com/v1, kind: Probe, name: "x?fieldManager=y"}
//!   failBytes: 1048576              # instead of all that: fail with an error this long
//! ```
//!
//! `status.results` holds one `{op, target, outcome}` per attempt, where `outcome` is
//! `refused: <message>`, `found: <the object as JSON>`, `not found`, or `listed: <objects>`.

use kubewasm_guest_sdk::{Cluster, Error, ObjectRef, Request, Response};
use serde_json::{Value, json};

/// Most bytes `failBytes` may ask for (16 MiB).
pub const MAX_FAIL_BYTES: u64 = 16 << 20;

fn str_of<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    v.get(field).and_then(Value::as_str)
}

fn target(v: &Value) -> String {
    format!(
        "{} {}/{} in {}",
        str_of(v, "kind").unwrap_or("?"),
        str_of(v, "apiVersion").unwrap_or("?"),
        str_of(v, "name")
            .or(str_of(v, "labelSelector"))
            .unwrap_or(""),
        str_of(v, "namespace").unwrap_or("(default)"),
    )
}

fn outcome<T>(result: Result<T, Error>, show: impl FnOnce(T) -> String) -> String {
    match result {
        Ok(value) => show(value),
        Err(e) => format!("refused: {}", e.message),
    }
}

/// Try everything the parent asks for and report it.
pub fn reconcile(req: &Request, cluster: &dyn Cluster) -> Result<Response, Error> {
    let Some(parent) = &req.parent else {
        return Ok(Response::new());
    };
    let spec = parent.get("spec").cloned().unwrap_or(Value::Null);
    if let Some(n) = spec.get("failBytes").and_then(Value::as_u64) {
        let n = n.min(MAX_FAIL_BYTES) as usize;
        return Err(Error::permanent("E".repeat(n)));
    }
    let list_of = |field: &str| {
        spec.get(field)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mut results = Vec::new();
    for get in list_of("gets") {
        let found = cluster.get(
            str_of(&get, "apiVersion").unwrap_or(""),
            str_of(&get, "kind").unwrap_or(""),
            str_of(&get, "namespace"),
            str_of(&get, "name").unwrap_or(""),
        );
        let outcome = outcome(found, |o| match o {
            Some(o) => format!("found: {o}"),
            None => "not found".to_owned(),
        });
        results.push(json!({"op": "get", "target": target(&get), "outcome": outcome}));
    }
    for list in list_of("lists") {
        let listed = cluster.list(
            str_of(&list, "apiVersion").unwrap_or(""),
            str_of(&list, "kind").unwrap_or(""),
            str_of(&list, "namespace"),
            str_of(&list, "labelSelector"),
        );
        let outcome = outcome(listed, |items| format!("listed: {}", Value::Array(items)));
        results.push(json!({"op": "list", "target": target(&list), "outcome": outcome}));
    }
    let mut response = Response::new().set_status(json!({
        "echo": spec.get("echo").cloned().unwrap_or(Value::Null),
        "results": results,
    }));
    for delete in list_of("deletes") {
        response = response.delete(ObjectRef::new(
            str_of(&delete, "apiVersion").unwrap_or(""),
            str_of(&delete, "kind").unwrap_or(""),
            str_of(&delete, "namespace"),
            str_of(&delete, "name").unwrap_or(""),
        ));
    }
    Ok(response)
}

kubewasm_guest_sdk::export_reconciler!(reconcile);

#[cfg(test)]
mod tests {
    use super::*;
    use kubewasm_guest_sdk::testing::{FakeCluster, request_from_yaml};

    const PROBE: &str = r#"
apiVersion: isolation.kubewasm.dev/v1
kind: Probe
metadata: {name: p, namespace: team-a}
spec:
  echo: "1"
  gets:
  - {apiVersion: v1, kind: Secret, name: token}
  - {apiVersion: v1, kind: Secret, name: "x?fieldManager=y"}
  lists:
  - {apiVersion: v1, kind: Secret, labelSelector: "a in ("}
"#;

    #[test]
    fn reports_every_attempt() {
        let cluster = FakeCluster::from_yaml(
            "apiVersion: v1\nkind: Secret\nmetadata: {name: token, namespace: team-a}\ndata: {k: dg==}",
        )
        .with_default_namespace("team-a");
        let response = reconcile(&request_from_yaml(PROBE), &cluster).unwrap();
        let status = response.status().unwrap();
        assert_eq!(status["echo"], "1");
        let outcomes: Vec<&str> = status["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["outcome"].as_str().unwrap())
            .collect();
        assert!(outcomes[0].starts_with("found: "), "{outcomes:?}");
        assert!(
            outcomes[1].starts_with("refused: invalid object name"),
            "{outcomes:?}"
        );
        assert!(
            outcomes[2].starts_with("refused: invalid label selector"),
            "{outcomes:?}"
        );
    }

    #[test]
    fn fails_with_a_long_error_when_asked() {
        let req = request_from_yaml(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: p, namespace: a}\nspec: {failBytes: 1000}",
        );
        let err = reconcile(&req, &FakeCluster::new()).unwrap_err();
        assert_eq!(err.message.len(), 1000);
    }
}
