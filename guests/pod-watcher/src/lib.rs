//! The Chronos pod watcher of the classic controller tutorial: one log line per change of a
//! Pod — added, updated (saying what changed: phase, node, labels, container statuses), or
//! deleted — through the host's `log`, and no action at all.
//!
//! What changed comes from the request's `previous` (the Pod as this controller last
//! reconciled it). The rule, as the runtime keeps it: a Pod first seen since the runtime
//! started is *added* (so after a restart every existing Pod is reported once, as a watch
//! reports every existing object as added); a relist that finds a Pod unchanged reports
//! nothing; changes that happen between two reconciles are reported together.

use std::collections::BTreeMap;

use kubewasm_guest_sdk::{Cluster, Error, Request, Response, object};
use serde_json::Value;

/// What is reported of a Pod.
#[derive(Debug, PartialEq)]
struct Seen {
    phase: String,
    node: String,
    labels: BTreeMap<String, String>,
    containers: Vec<String>,
}

fn seen(pod: &Value) -> Seen {
    let text = |ptr: &str| {
        pod.pointer(ptr)
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_owned()
    };
    let containers = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let state = c
                .get("state")
                .and_then(Value::as_object)
                .and_then(|s| s.keys().next().cloned())
                .unwrap_or_else(|| "unknown".into());
            format!(
                "{}={}{}{}",
                c.get("name").and_then(Value::as_str).unwrap_or("?"),
                state,
                if c.get("ready") == Some(&Value::Bool(true)) {
                    ",ready"
                } else {
                    ""
                },
                match c.get("restartCount").and_then(Value::as_u64) {
                    Some(n) if n > 0 => format!(",restarts {n}"),
                    _ => String::new(),
                }
            )
        })
        .collect();
    Seen {
        phase: text("/status/phase"),
        node: text("/spec/nodeName"),
        labels: object::labels(pod),
        containers,
    }
}

fn labels(labels: &BTreeMap<String, String>) -> String {
    let all: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{{{}}}", all.join(","))
}

/// The line to log for this change, if anything reported changed.
pub fn change(req: &Request) -> Option<String> {
    let pod = format!(
        "pod {}/{}",
        req.target.namespace.as_deref().unwrap_or("-"),
        req.target.name
    );
    match (&req.previous, &req.parent) {
        (None, None) => None,
        (Some(_), None) => Some(format!("{pod} deleted")),
        (None, Some(now)) => {
            let now = seen(now);
            Some(format!(
                "{pod} added: phase {}, node {}, labels {}",
                now.phase,
                now.node,
                labels(&now.labels)
            ))
        }
        (Some(before), Some(now)) => {
            let (before, now) = (seen(before), seen(now));
            let mut what = Vec::new();
            if before.phase != now.phase {
                what.push(format!("phase {} → {}", before.phase, now.phase));
            }
            if before.node != now.node {
                what.push(format!("node {} → {}", before.node, now.node));
            }
            if before.labels != now.labels {
                what.push(format!(
                    "labels {} → {}",
                    labels(&before.labels),
                    labels(&now.labels)
                ));
            }
            if before.containers != now.containers {
                what.push(format!(
                    "containers [{}] → [{}]",
                    before.containers.join(" "),
                    now.containers.join(" ")
                ));
            }
            (!what.is_empty()).then(|| format!("{pod} updated: {}", what.join("; ")))
        }
    }
}

/// Logs what changed; asks for nothing.
pub fn reconcile(req: &Request, cluster: &dyn Cluster) -> Result<Response, Error> {
    if let Some(line) = change(req) {
        cluster.info(&line);
    }
    Ok(Response::new())
}

kubewasm_guest_sdk::export_reconciler!(reconcile);
