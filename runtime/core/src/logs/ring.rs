//! The log lines of each controller, in memory: a ring per controller with a byte cap, and a
//! cap per namespace that all its controllers' rings share (the ClusterWasmControllers
//! together count as one namespace, `None`, as for the saved states' budget).
//!
//! A line costs its text and [`LINE_OVERHEAD`] (a million empty lines are not free). A line
//! past the ring's cap pushes the ring's oldest lines out; a line past the namespace's cap
//! pushes out the oldest lines of the namespace's largest ring — a controller logging at its
//! full rate takes its namespace's room from its own ring first, and never any other
//! namespace's. Nothing is written to etcd: a restart loses the lines, as a Pod's log is lost
//! with its container.
//!
//! Followers wait on a `watch` channel per ring, which holds the next line's number: a ring
//! taken away ([`LogStore::forget`], the controller deleted) ends its followers.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;

use crate::sync::Locks as _;

/// What a line costs beyond its text: its time, number, the ring's slot and the allocation.
pub const LINE_OVERHEAD: usize = 64;

/// The most bytes of one line's text; longer lines are cut, saying so.
pub const MAX_LINE_BYTES: usize = 8 << 10;

/// The cap per controller when the operator does not say (`--log-ring-bytes`).
pub const DEFAULT_RING_BYTES: usize = 256 << 10;

/// The cap per namespace when the operator does not say (`--log-ring-bytes-per-namespace`):
/// four controllers' rings at their cap.
pub const DEFAULT_NAMESPACE_BYTES: usize = 1 << 20;

/// A controller: its namespace (`None`: a ClusterWasmController) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ControllerKey {
    /// The namespace of a WasmController; `None` for a ClusterWasmController.
    pub namespace: Option<String>,
    pub name: String,
}

impl ControllerKey {
    /// The controller as the runtime names it (`namespace/name`, or `name`): the inverse of
    /// [`ControllerKey::parse`].
    pub fn id(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.clone(),
        }
    }

    /// The key of a controller as the runtime's log lines name it (`namespace/name`, or
    /// `name` for a ClusterWasmController: a namespace never holds a `/`).
    pub fn parse(controller: &str) -> ControllerKey {
        match controller.split_once('/') {
            Some((namespace, name)) => ControllerKey {
                namespace: Some(namespace.to_owned()),
                name: name.to_owned(),
            },
            None => ControllerKey {
                namespace: None,
                name: controller.to_owned(),
            },
        }
    }
}

/// One line: its number in its ring, its time and its text (without the time).
#[derive(Debug, Clone)]
pub struct Line {
    /// Numbered from 0 per ring, never reused while the ring lives.
    pub seq: u64,
    /// When it was logged.
    pub at: Timestamp,
    /// `LEVEL message fields`, escaped, on one line.
    pub text: Box<str>,
}

impl Line {
    fn cost(&self) -> usize {
        self.text.len() + LINE_OVERHEAD
    }

    /// The line as `kubectl logs --timestamps` shows one: `TIME LEVEL message`, ending in `\n`.
    pub fn render(&self) -> String {
        format!("{:.3} {}\n", self.at, self.text)
    }
}

/// Which lines a reader wants.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Selection {
    /// Only lines numbered this or later (a follower's place: the next line it wants).
    pub from: Option<u64>,
    /// Only lines logged at or after this time (`sinceSeconds`, `sinceTime`).
    pub since: Option<Timestamp>,
    /// Only the last this many of those (`tailLines`).
    pub tail: Option<usize>,
}

/// The lines a read found.
#[derive(Debug, Default)]
pub struct Read {
    /// The lines, oldest first.
    pub lines: Vec<Line>,
    /// Lines from the reader's place on that were pushed out before it read them.
    pub missed: u64,
    /// The number the next line will have.
    pub next: u64,
}

#[derive(Debug)]
struct Ring {
    lines: VecDeque<Line>,
    bytes: usize,
    next: u64,
    tx: watch::Sender<u64>,
}

impl Ring {
    fn new() -> Ring {
        Ring {
            lines: VecDeque::new(),
            bytes: 0,
            next: 0,
            tx: watch::channel(0).0,
        }
    }

    /// Takes out the oldest line; its cost.
    fn pop(&mut self) -> usize {
        let cost = self.lines.pop_front().map_or(0, |l| l.cost());
        self.bytes -= cost;
        cost
    }
}

#[derive(Debug, Default)]
struct Namespace {
    rings: HashMap<String, Ring>,
    bytes: usize,
}

/// Every controller's ring, against the two caps.
#[derive(Debug)]
pub struct LogStore {
    ring_cap: usize,
    namespace_cap: usize,
    namespaces: Mutex<HashMap<Option<String>, Namespace>>,
}

impl Default for LogStore {
    fn default() -> Self {
        LogStore::new(DEFAULT_RING_BYTES, DEFAULT_NAMESPACE_BYTES)
    }
}

impl LogStore {
    /// A store keeping at most `ring_cap` bytes per controller and `namespace_cap` per
    /// namespace (each at least one line of the longest).
    pub fn new(ring_cap: usize, namespace_cap: usize) -> LogStore {
        let least = MAX_LINE_BYTES + LINE_OVERHEAD;
        LogStore {
            ring_cap: ring_cap.max(least),
            namespace_cap: namespace_cap.max(least),
            namespaces: Mutex::default(),
        }
    }

    /// Keeps a line of `controller` logged at `at`; `text` is cut at [`MAX_LINE_BYTES`].
    pub fn push(&self, controller: &ControllerKey, at: Timestamp, text: &str) {
        let text = cut(text);
        let mut namespaces = self.namespaces.locked();
        let namespace = namespaces.entry(controller.namespace.clone()).or_default();
        let ring = match namespace.rings.get_mut(&controller.name) {
            Some(ring) => ring,
            None => namespace
                .rings
                .entry(controller.name.clone())
                .or_insert_with(Ring::new),
        };
        let line = Line {
            seq: ring.next,
            at,
            text: text.into(),
        };
        let cost = line.cost();
        ring.next += 1;
        ring.bytes += cost;
        ring.lines.push_back(line);
        namespace.bytes += cost;
        while ring.bytes > self.ring_cap {
            namespace.bytes -= ring.pop();
        }
        let next = ring.next;
        ring.tx.send_replace(next);
        while namespace.bytes > self.namespace_cap {
            let Some(largest) = namespace.rings.values_mut().max_by_key(|r| r.bytes) else {
                break;
            };
            match largest.pop() {
                0 => break,
                freed => namespace.bytes -= freed,
            }
        }
    }

    /// The lines of `controller` that `selection` picks; `None` when it has logged nothing
    /// here (or was forgotten).
    pub fn read(&self, controller: &ControllerKey, selection: Selection) -> Option<Read> {
        let namespaces = self.namespaces.locked();
        let ring = namespaces
            .get(&controller.namespace)?
            .rings
            .get(&controller.name)?;
        let oldest = ring.lines.front().map_or(ring.next, |l| l.seq);
        let missed = selection.from.map_or(0, |from| oldest.saturating_sub(from));
        let picked = ring.lines.iter().filter(|l| {
            selection.from.is_none_or(|from| l.seq >= from)
                && selection.since.is_none_or(|since| l.at >= since)
        });
        let mut lines: Vec<Line> = picked.cloned().collect();
        if let Some(tail) = selection.tail {
            lines.drain(..lines.len().saturating_sub(tail));
        }
        Some(Read {
            lines,
            missed,
            next: ring.next,
        })
    }

    /// A receiver told the next line's number each time `controller` logs. Made for a
    /// follower of a controller that exists: one that has logged nothing yet gets an empty
    /// ring (charged nothing; [`Self::forget`] takes it away with the controller).
    pub fn watch(&self, controller: &ControllerKey) -> watch::Receiver<u64> {
        let mut namespaces = self.namespaces.locked();
        let namespace = namespaces.entry(controller.namespace.clone()).or_default();
        namespace
            .rings
            .entry(controller.name.clone())
            .or_insert_with(Ring::new)
            .tx
            .subscribe()
    }

    /// Drops `controller`'s lines (it was deleted): its followers end.
    pub fn forget(&self, controller: &ControllerKey) {
        let mut namespaces = self.namespaces.locked();
        let Some(namespace) = namespaces.get_mut(&controller.namespace) else {
            return;
        };
        if let Some(ring) = namespace.rings.remove(&controller.name) {
            namespace.bytes -= ring.bytes;
        }
        if namespace.rings.is_empty() {
            namespaces.remove(&controller.namespace);
        }
    }

    /// Bytes charged to `namespace` (`None`: the ClusterWasmControllers).
    pub fn used(&self, namespace: Option<&str>) -> usize {
        self.namespaces
            .locked()
            .get(&namespace.map(str::to_owned))
            .map_or(0, |n| n.bytes)
    }

    /// Bytes charged to `controller`.
    pub fn ring_bytes(&self, controller: &ControllerKey) -> usize {
        self.namespaces
            .locked()
            .get(&controller.namespace)
            .and_then(|n| n.rings.get(&controller.name))
            .map_or(0, |r| r.bytes)
    }
}

/// `text`, cut at [`MAX_LINE_BYTES`] on a character boundary, saying how much was cut.
fn cut(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= MAX_LINE_BYTES {
        return text.into();
    }
    let keep = text.floor_char_boundary(MAX_LINE_BYTES - 40);
    format!("{} … ({} more bytes)", &text[..keep], text.len() - keep).into()
}

#[cfg(test)]
mod tests;
