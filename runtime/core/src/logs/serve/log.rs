//! The `log` subresource: a controller's lines as text, `kubectl logs`' parameters
//! (`follow`, `sinceSeconds`, `sinceTime`, `tailLines`), one line each with its time.
//!
//! A follower is a task that copies new lines from the ring into a channel of
//! [`CHUNKS_IN_FLIGHT`] chunks the response body drains: what a follower holds is bounded
//! whatever its reader does, and a reader that leaves a chunk untaken for `--log-follow-stall`
//! has its connection cut. Followers are counted per controller and in all, against caps.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::future::BoxFuture;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::sync::mpsc;

use super::routes::status;
use super::{Conn, Shared};
use crate::logs::{ControllerKey, Selection};
use crate::sync::Locks as _;

/// Chunks a follower may have sent and its reader not yet taken.
const CHUNKS_IN_FLIGHT: usize = 4;

/// A chunk's size, about (lines are not split).
const CHUNK_BYTES: usize = 16 << 10;

/// Followers at present, in all and per controller.
#[derive(Debug, Default)]
pub struct Followers {
    counts: Mutex<(usize, HashMap<ControllerKey, usize>)>,
}

/// One follower's place in the counts, given back when it ends.
struct Slot {
    shared: Arc<Shared>,
    key: ControllerKey,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.shared.followers.counts.locked();
        counts.0 = counts.0.saturating_sub(1);
        if let Some(n) = counts.1.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.1.remove(&self.key);
            }
        }
    }
}

/// A follower's place, or why there is none.
fn take_slot(shared: &Arc<Shared>, key: &ControllerKey) -> Result<Slot, String> {
    let config = &shared.config;
    let mut counts = shared.followers.counts.locked();
    let of_this = counts.1.get(key).copied().unwrap_or(0);
    if of_this >= config.max_followers_per_controller {
        return Err(format!(
            "{} readers already follow this controller's log (the most the runtime allows, --log-max-followers-per-controller): stop one, or read without --follow",
            config.max_followers_per_controller
        ));
    }
    if counts.0 >= config.max_followers {
        return Err(format!(
            "{} readers already follow logs on this runtime (the most it allows, --log-max-followers): try again later, or read without --follow",
            config.max_followers
        ));
    }
    counts.0 += 1;
    *counts.1.entry(key.clone()).or_default() += 1;
    Ok(Slot {
        shared: shared.clone(),
        key: key.clone(),
    })
}

/// What the query asks.
#[derive(Debug, Default, PartialEq)]
struct Params {
    follow: bool,
    selection: Selection,
}

fn params(query: Option<&str>, now: Timestamp) -> Result<Params, String> {
    let mut params = Params::default();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decoded(value);
        match name {
            "follow" => params.follow = flag(name, &value)?,
            "sinceSeconds" => {
                let seconds: i64 = value.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                    format!("sinceSeconds={value:?}: give a whole number of seconds above 0")
                })?;
                params.selection.since = Some(
                    now.saturating_sub(SignedDuration::from_secs(seconds))
                        .unwrap_or(Timestamp::MIN),
                );
            }
            "sinceTime" => {
                let time: Timestamp = value.parse().map_err(|_| {
                    format!("sinceTime={value:?}: give an RFC 3339 time, e.g. 2026-11-28T03:00:00Z")
                })?;
                params.selection.since = Some(time);
            }
            "tailLines" => {
                let lines = value.parse().map_err(|_| {
                    format!("tailLines={value:?}: give a whole number of lines, 0 or more")
                })?;
                params.selection.tail = Some(lines);
            }
            // Always shown: each line starts with its time.
            "timestamps" | "pretty" => {}
            other => {
                return Err(format!(
                    "unknown parameter {other:?}: the log takes follow, sinceSeconds, sinceTime and tailLines"
                ));
            }
        }
    }
    Ok(params)
}

fn flag(name: &str, value: &str) -> Result<bool, String> {
    match value {
        "true" | "1" | "" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err(format!("{name}={value:?}: give true or false")),
    }
}

fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The handler of [`super::SUBRESOURCES`]' `log`.
pub fn handle(
    shared: Arc<Shared>,
    conn: Conn,
    key: ControllerKey,
    query: Option<String>,
) -> BoxFuture<'static, Response> {
    Box::pin(async move {
        let params = match params(query.as_deref(), Timestamp::now()) {
            Ok(params) => params,
            Err(message) => return status(StatusCode::BAD_REQUEST, "BadRequest", &message),
        };
        tracing::debug!(follow = params.follow, query = ?query, "log server: a log read");
        let text = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
        if !params.follow {
            let read = shared
                .store
                .read(&key, params.selection)
                .unwrap_or_default();
            let body: String = read.lines.iter().map(|l| l.render()).collect();
            return (text, body).into_response();
        }
        let slot = match take_slot(&shared, &key) {
            Ok(slot) => slot,
            Err(message) => {
                return status(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", &message);
            }
        };
        let (tx, mut rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
        tokio::spawn(follow(slot, conn, key, params.selection, tx));
        let chunks = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        (text, Body::from_stream(chunks)).into_response()
    })
}

type Chunks = mpsc::Sender<Result<Bytes, Infallible>>;

/// Sends the lines selected, then each new one, until the ring goes (the controller was
/// deleted), the reader leaves, or it stalls.
async fn follow(slot: Slot, conn: Conn, key: ControllerKey, first: Selection, tx: Chunks) {
    let store = slot.shared.store.clone();
    let stall = slot.shared.config.stall;
    // Subscribed before the first read: no line falls between the two.
    let mut changes = store.watch(&key);
    let mut selection = first;
    loop {
        let read = store.read(&key, selection).unwrap_or_default();
        let mut chunk = String::new();
        if read.missed > 0 {
            chunk.push_str(&format!(
                "{:.3} kubewasm: {} lines were pushed out of the ring before this reader took them\n",
                Timestamp::now(),
                read.missed
            ));
        }
        for line in &read.lines {
            chunk.push_str(&line.render());
            if chunk.len() >= CHUNK_BYTES && !send(&tx, &mut chunk, stall, &conn, &key).await {
                return;
            }
        }
        if !chunk.is_empty() && !send(&tx, &mut chunk, stall, &conn, &key).await {
            return;
        }
        selection = Selection {
            from: Some(read.next),
            ..Selection::default()
        };
        // Lines come to the replica that runs the controller: once its shard moved away,
        // the follow ends, and `kubewasm logs -f` reconnects to the one that runs it now.
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            () = tx.closed() => return,
            () = moved(&slot.shared, &key) => return,
        }
    }
}

/// Returns once `key` no longer runs on this replica (checked every [`MOVED_CHECK`]).
async fn moved(shared: &Shared, key: &ControllerKey) {
    while shared.runs_here(key) {
        tokio::time::sleep(MOVED_CHECK).await;
    }
}

/// How often a follower checks that its controller still runs here.
const MOVED_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// Sends `chunk` (emptied); false when the follower must end: its reader left, or took
/// nothing for `stall` (its connection is then cut).
async fn send(
    tx: &Chunks,
    chunk: &mut String,
    stall: std::time::Duration,
    conn: &Conn,
    key: &ControllerKey,
) -> bool {
    let bytes = Bytes::from(std::mem::take(chunk));
    match tokio::time::timeout(stall, tx.send(Ok(bytes))).await {
        Ok(sent) => sent.is_ok(),
        Err(_) => {
            let controller = key.id();
            tracing::info!(
                controller,
                "a log follower read nothing for {stall:?}: its connection was cut"
            );
            conn.cut();
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_read_or_refused_saying_why() {
        let now: Timestamp = "2026-11-28T03:00:00Z".parse().unwrap();
        let p = params(Some("follow=true&sinceSeconds=60&tailLines=5"), now).unwrap();
        assert!(p.follow);
        assert_eq!(p.selection.tail, Some(5));
        assert_eq!(
            p.selection.since,
            Some("2026-11-28T02:59:00Z".parse().unwrap())
        );
        let p = params(Some("sinceTime=2026-11-28T02%3A00%3A00.5Z"), now).unwrap();
        assert_eq!(
            p.selection.since,
            Some("2026-11-28T02:00:00.5Z".parse().unwrap())
        );
        assert!(!p.follow);
        assert_eq!(params(None, now).unwrap(), Params::default());
        for (bad, says) in [
            ("sinceSeconds=-1", "above 0"),
            ("sinceSeconds=x", "above 0"),
            ("tailLines=-3", "0 or more"),
            ("sinceTime=yesterday", "RFC 3339"),
            ("follow=maybe", "true or false"),
            ("container=x", "unknown parameter"),
        ] {
            let error = params(Some(bad), now).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
