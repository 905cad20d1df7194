//! The Chronos pod watcher of the classic controller tutorial: one log line per change of a
//! Pod — added, updated (saying what changed: phase, node, labels, container statuses), or
//! deleted — through the host's `log`, and no write at all.
//!
//! What changed is told by comparing the Pod with what this controller last *reported* of it,
//! which it saves as its per-object state (`setState`, kept by the runtime in
//! WasmControllerState objects, so it outlives the runtime, for as many Pods as the operator's
//! quota holds: over 10,000 by default). The rule:
//! - no saved state: the Pod is new to this controller, *added*;
//! - saved state and the Pod: *updated* when a reported field differs, nothing otherwise (a
//!   relist, a resync, a restart of the runtime that finds the Pod as it was: no line);
//! - saved state and no Pod: *deleted* — also for a Pod deleted while the runtime was down
//!   (the runtime calls the guest once for every object it keeps state for that is gone).
//!
//! Changes between two reconciles are reported together. So a restart neither repeats nor
//! loses a change; the exception is a runtime killed (SIGKILL) between logging a line and
//! saving the state, whose line comes again after the restart (at least once, never lost).
//! When the state is missing but the request has `previous` (a state that could not be
//! saved), `previous` tells what changed instead.

use std::collections::BTreeMap;

pub use kubewasm_guest_sdk::MAX_STATE_BYTES;
use kubewasm_guest_sdk::{Cluster, Error, Request, Response, object};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// What is reported of a Pod, and saved as the state (short keys: it has to fit
/// [`MAX_STATE_BYTES`]). Labels or containers that do not fit are kept as a digest.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Seen {
    #[serde(rename = "p")]
    phase: String,
    #[serde(rename = "n")]
    node: String,
    #[serde(rename = "l")]
    labels: Part<BTreeMap<String, String>>,
    #[serde(rename = "c")]
    containers: Part<Vec<String>>,
}

/// A part of [`Seen`]: whole, or a digest of it when the whole would not fit the state.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum Part<T> {
    #[serde(rename = "v")]
    Whole(T),
    #[serde(rename = "d")]
    Digest(String),
}

impl<T: Serialize> Part<T> {
    fn digest(&self) -> String {
        match self {
            Part::Whole(v) => {
                let hash = Sha256::digest(serde_json::to_vec(v).unwrap_or_default());
                hash[..8].iter().map(|b| format!("{b:02x}")).collect()
            }
            Part::Digest(d) => d.clone(),
        }
    }

    fn shortened(&self) -> Part<T> {
        Part::Digest(self.digest())
    }

    fn same(&self, other: &Part<T>) -> bool {
        self.digest() == other.digest()
    }
}

/// What is reported of `pod`.
pub fn seen(pod: &Value) -> Seen {
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
        labels: Part::Whole(object::labels(pod)),
        containers: Part::Whole(containers),
    }
}

impl Seen {
    /// The state to save: as it is, or with labels, then containers, as digests until it fits.
    pub fn to_state(&self) -> String {
        let whole = serde_json::to_string(self).unwrap_or_default();
        if whole.len() <= MAX_STATE_BYTES {
            return whole;
        }
        let short_labels = Seen {
            phase: self.phase.clone(),
            node: self.node.clone(),
            labels: self.labels.shortened(),
            containers: match &self.containers {
                Part::Whole(c) => Part::Whole(c.clone()),
                Part::Digest(d) => Part::Digest(d.clone()),
            },
        };
        let text = serde_json::to_string(&short_labels).unwrap_or_default();
        if text.len() <= MAX_STATE_BYTES {
            return text;
        }
        let shortest = Seen {
            containers: self.containers.shortened(),
            ..short_labels
        };
        // Phase and node are short in any real Pod (a node name is at most 253 bytes); a state
        // still too long is refused by the runtime with a message saying so.
        serde_json::to_string(&shortest).unwrap_or_default()
    }

    /// A saved state; `None` when it is not one (e.g. a status edited by hand).
    pub fn from_state(state: &str) -> Option<Seen> {
        serde_json::from_str(state).ok()
    }
}

fn labels(labels: &Part<BTreeMap<String, String>>) -> String {
    match labels {
        Part::Whole(labels) => {
            let all: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{{{}}}", all.join(","))
        }
        Part::Digest(_) => "{…}".to_owned(),
    }
}

fn containers(containers: &Part<Vec<String>>) -> String {
    match containers {
        Part::Whole(c) => format!("[{}]", c.join(" ")),
        Part::Digest(_) => "[…]".to_owned(),
    }
}

/// What to do for this request: the line to log (if anything reported changed) and the state
/// to save (if it differs from the saved one).
#[derive(Debug, Default, PartialEq)]
pub struct Report {
    /// The line to log.
    pub line: Option<String>,
    /// The state to save.
    pub state: Option<String>,
}

/// The report for this request (see the module's rule).
pub fn report(req: &Request) -> Report {
    let pod = format!(
        "pod {}/{}",
        req.target.namespace.as_deref().unwrap_or("-"),
        req.target.name
    );
    let before = match (&req.state, &req.previous) {
        (Some(state), _) => Seen::from_state(state),
        (None, Some(previous)) => Some(seen(previous)),
        (None, None) => None,
    };
    let Some(now) = req.parent.as_ref().map(seen) else {
        return Report {
            line: before.map(|_| format!("{pod} deleted")),
            state: None,
        };
    };
    let state = now.to_state();
    let state = (req.state.as_deref() != Some(state.as_str())).then_some(state);
    let Some(before) = before else {
        return Report {
            line: Some(format!(
                "{pod} added: phase {}, node {}, labels {}",
                now.phase,
                now.node,
                labels(&now.labels)
            )),
            state,
        };
    };
    let mut what = Vec::new();
    if before.phase != now.phase {
        what.push(format!("phase {} → {}", before.phase, now.phase));
    }
    if before.node != now.node {
        what.push(format!("node {} → {}", before.node, now.node));
    }
    if !before.labels.same(&now.labels) {
        what.push(format!(
            "labels {} → {}",
            labels(&before.labels),
            labels(&now.labels)
        ));
    }
    if !before.containers.same(&now.containers) {
        what.push(format!(
            "containers {} → {}",
            containers(&before.containers),
            containers(&now.containers)
        ));
    }
    Report {
        line: (!what.is_empty()).then(|| format!("{pod} updated: {}", what.join("; "))),
        state,
    }
}

/// The line to log for this request, if anything reported changed.
pub fn change(req: &Request) -> Option<String> {
    report(req).line
}

/// Logs what changed and saves what it reported; asks for nothing else.
pub fn reconcile(req: &Request, cluster: &dyn Cluster) -> Result<Response, Error> {
    let report = report(req);
    if let Some(line) = &report.line {
        cluster.info(line);
    }
    Ok(match report.state {
        Some(state) => Response::new().set_state(state),
        None => Response::new(),
    })
}

kubewasm_guest_sdk::export_reconciler!(reconcile);
