//! Which of many controllers starting together have shard objects at all, from one list of
//! every shard's metadata across namespaces: a runtime starting (or a replica taking shards
//! over) reads the states of the controllers that saved some, one list each, and hands the
//! others an empty start without asking — instead of one list per controller, most of which
//! answer nothing.
//!
//! It is a hint that loses nothing: read after the controllers' shards are held and before
//! any of them runs, it says what each controller's own list would have found (a shard object
//! is written only by the runtime running its controller, and none runs them yet). A list
//! that fails, or finds more than [`MOST_LISTED`] shard objects, is no hint: every controller
//! then reads its own, as a single controller starting always does.

use std::collections::HashSet;

use kube::api::ListParams;
use kube::{Api, Client, ResourceExt as _};

use crate::api::{STATE_OF_LABEL, WasmControllerState};

/// Shard objects' metadata read a page: about 1 KiB each as the runtime writes them (a
/// cluster admin's annotations could make one up to 256 KiB; tenants may not write them).
const PAGE: u32 = 100;

/// The most shard objects one list reads before it gives up (and each controller reads its
/// own): 6,250 controllers with every shard written.
pub const MOST_LISTED: usize = 100_000;

/// The controllers (namespace, name prefix) that have shard objects, among those asked for.
#[derive(Debug, Default)]
pub struct Stored {
    found: HashSet<(String, String)>,
}

impl Stored {
    /// Lists every shard object's metadata (in `namespace`, or all when `None`), a page at a
    /// time, and keeps which of `wanted` (`(namespace, prefix)`: where a controller's shards
    /// live, and their label) have some. `None` when the API server did not answer every
    /// page, or there were more than [`MOST_LISTED`].
    pub async fn list(
        client: &Client,
        namespace: Option<&str>,
        wanted: &HashSet<(String, String)>,
    ) -> Option<Stored> {
        let api: Api<WasmControllerState> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let mut params = ListParams::default().labels(STATE_OF_LABEL).limit(PAGE);
        let (mut found, mut seen) = (HashSet::new(), 0);
        loop {
            let page = match api.list_metadata(&params).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::info!(
                        "listing the saved states' objects failed ({e}): each controller reads its own"
                    );
                    return None;
                }
            };
            seen += page.items.len();
            if seen > MOST_LISTED {
                tracing::info!(
                    "more than {MOST_LISTED} saved states' objects: each controller reads its own"
                );
                return None;
            }
            for object in page.items {
                let (Some(namespace), Some(prefix)) =
                    (object.namespace(), object.labels().get(STATE_OF_LABEL))
                else {
                    continue;
                };
                let key = (namespace, prefix.clone());
                if wanted.contains(&key) {
                    found.insert(key);
                }
            }
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => {
                    tracing::info!(
                        "{} of {} controllers starting have states objects ({seen} listed at once instead of one list each)",
                        found.len(),
                        wanted.len()
                    );
                    return Some(Stored { found });
                }
            }
        }
    }

    /// Whether the controller whose shards live in `namespace` under `prefix` has any.
    pub fn has(&self, namespace: &str, prefix: &str) -> bool {
        self.found
            .contains(&(namespace.to_owned(), prefix.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::{Value, json};

    use super::*;

    /// A mock API server answering each list of shard objects with `page(n)` for the n-th
    /// request (`None`: an error); how many it was sent.
    fn api_server(
        page: impl Fn(usize) -> Option<Value> + Send + 'static,
    ) -> (Client, Arc<AtomicUsize>) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let sent = Arc::new(AtomicUsize::new(0));
        let counted = sent.clone();
        tokio::spawn(async move {
            while let Some((request, respond)) = handle.next_request().await {
                assert!(
                    request
                        .uri()
                        .query()
                        .unwrap_or_default()
                        .contains("labelSelector")
                );
                let n = counted.fetch_add(1, Ordering::SeqCst);
                let (status, body) = match page(n) {
                    Some(body) => (200, body),
                    None => (
                        500,
                        json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "message": "etcd is unhappy", "code": 500}),
                    ),
                };
                respond.send_response(
                    Response::builder()
                        .status(status)
                        .body(Body::from(serde_json::to_vec(&body).unwrap()))
                        .unwrap(),
                );
            }
        });
        (Client::new(service, "default"), sent)
    }

    /// A page of shard objects' metadata: `(namespace, label)` each, then `next` to continue.
    fn page(objects: &[(&str, &str)], next: Option<&str>) -> Value {
        let items: Vec<Value> = objects
            .iter()
            .enumerate()
            .map(|(i, (ns, label))| {
                json!({"apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": {"name": format!("{label}-{i:02}"), "namespace": ns,
                    "labels": {STATE_OF_LABEL: label}}})
            })
            .collect();
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
            "metadata": {"continue": next.unwrap_or_default()}, "items": items})
    }

    fn wanted(places: &[(&str, &str)]) -> HashSet<(String, String)> {
        places
            .iter()
            .map(|(ns, p)| (ns.to_string(), p.to_string()))
            .collect()
    }

    #[tokio::test]
    async fn every_page_is_read_and_only_the_controllers_asked_for_are_kept() {
        let (client, sent) = api_server(|n| {
            Some(match n {
                0 => page(
                    &[("a", "state-1"), ("b", "state-1"), ("a", "state-9")],
                    Some("more"),
                ),
                _ => page(&[("c", "state-2")], None),
            })
        });
        let asked = wanted(&[("a", "state-1"), ("c", "state-2"), ("c", "state-3")]);
        let stored = Stored::list(&client, None, &asked).await.unwrap();
        assert_eq!(sent.load(Ordering::SeqCst), 2);
        assert!(stored.has("a", "state-1") && stored.has("c", "state-2"));
        // Another namespace's objects under the same label, and controllers not asked for,
        // are not kept; nor one without any.
        assert!(!stored.has("b", "state-1") && !stored.has("a", "state-9"));
        assert!(!stored.has("c", "state-3"));
        assert_eq!(stored.found.len(), 2);
    }

    #[tokio::test]
    async fn a_list_past_its_bound_or_failing_says_nothing() {
        // Pages without end, each full: given up once past the bound, having read no more
        // pages than the bound takes.
        let full: Vec<(&str, &str)> = vec![("a", "state-1"); PAGE as usize];
        let (client, sent) = api_server(move |_| Some(page(&full, Some("more"))));
        let asked = wanted(&[("a", "state-1")]);
        assert!(Stored::list(&client, None, &asked).await.is_none());
        let pages = sent.load(Ordering::SeqCst);
        assert_eq!(pages, MOST_LISTED / PAGE as usize + 1, "{pages} pages read");
        // A page that fails midway.
        let (client, _) = api_server(|n| (n == 0).then(|| page(&[("a", "state-1")], Some("more"))));
        assert!(Stored::list(&client, Some("a"), &asked).await.is_none());
    }
}
