//! Watches whose list comes whole from the API server's watch cache, but never more than a cap
//! of bytes: for the watches of metadata only, where what the cache sends is small and what
//! etcd sends is not (the metadata of a ConfigMap is a few hundred bytes; etcd reads and the
//! API server decodes the whole ConfigMap, a module's megabyte included, for each).
//!
//! [`capped_lists`] is a client whose lists (every request but a watch) read at most the cap
//! of bytes before they fail; [`cached_then_paged`] lists through it from the cache
//! (`resourceVersion=0`, as client-go's informers list) and, once one of its lists is over the
//! cap, in pages of [`LIST_PAGE_SIZE`](super::LIST_PAGE_SIZE) from etcd from then on (a slower start, never more held).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use http::{Request, Response};
use http_body_util::{LengthLimitError, Limited};
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

/// A client whose responses to anything but a watch end in an error past `cap` bytes (read
/// up to it, then dropped): `config` as for watches (no read timeout).
pub fn capped_lists(config: kube::Config, cap: usize) -> Result<kube::Client, kube::Error> {
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&CapLists(cap))
        .build())
}

/// The events of a watch whose (re)lists come whole from the API server's watch cache
/// through `capped` (an [`Api`] of a [`capped_lists`] client), and, once one is over its cap,
/// in pages from etcd through `paged` (said once, naming `what`).
pub fn cached_then_paged<K>(
    capped: Api<K>,
    paged: Api<K>,
    config: watcher::Config,
    what: &'static str,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let over = Arc::new(AtomicBool::new(false));
    let from_cache = watcher(capped, from_cache(config.clone()))
        .default_backoff()
        .take_while(move |event| {
            let past = matches!(event, Err(e) if over_cap(e));
            if past && !over.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "one list of the {what} is over --metadata-list-bytes: listing them in pages from etcd instead (each page reads the whole objects: a slower start; raise the flag to list from the API server's cache again)"
                );
            }
            std::future::ready(!past)
        });
    from_cache.chain(watcher(paged, config).default_backoff())
}

/// `config` for a list from the API server's cache: `resourceVersion=0`, and no limit — kube
/// leaves `resourceVersion=0` out of a list with a limit (its pages would come from etcd, and
/// did: 201 pages of 20,000 ServiceAccounts at a runtime's start), and the cache sends its
/// list whole anyway.
fn from_cache(config: watcher::Config) -> watcher::Config {
    let mut config = config.any_semantic();
    config.page_size = None;
    config
}

/// Whether `error` (or what caused it) is a response cut off by [`capped_lists`].
pub fn over_cap(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<LengthLimitError>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// The layer of [`capped_lists`].
#[derive(Debug, Clone, Copy)]
struct CapLists(usize);

impl<S> tower::Layer<S> for CapLists {
    type Service = Capped<S>;

    fn layer(&self, inner: S) -> Capped<S> {
        Capped { inner, cap: self.0 }
    }
}

/// A service whose responses to anything but a watch are cut off past `cap` bytes.
#[derive(Debug, Clone)]
struct Capped<S> {
    inner: S,
    cap: usize,
}

impl<S, In, Out> tower::Service<Request<In>> for Capped<S>
where
    S: tower::Service<Request<In>, Response = Response<Out>>,
    S::Future: Send + 'static,
{
    type Response = Response<Limited<Out>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<In>) -> Self::Future {
        // A watch streams for as long as it is open: only its events are bounded (by kube).
        let cap = if is_watch(request.uri()) {
            usize::MAX
        } else {
            self.cap
        };
        let response = self.inner.call(request);
        Box::pin(async move { Ok(response.await?.map(|body| Limited::new(body, cap))) })
    }
}

fn is_watch(uri: &http::Uri) -> bool {
    uri.query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::{Layer, Service, ServiceExt};

    /// Answers every request with `len` bytes.
    #[derive(Clone)]
    struct Sends(usize);

    impl Service<Request<()>> for Sends {
        type Response = Response<http_body_util::Full<bytes::Bytes>>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            std::future::ready(Ok(Response::new(http_body_util::Full::new(
                bytes::Bytes::from(vec![b'x'; self.0]),
            ))))
        }
    }

    async fn read(uri: &str, len: usize, cap: usize) -> Result<usize, String> {
        let service = CapLists(cap).layer(Sends(len));
        let response = service
            .oneshot(Request::get(uri).body(()).unwrap())
            .await
            .unwrap();
        match response.into_body().collect().await {
            Ok(body) => Ok(body.to_bytes().len()),
            Err(e) => {
                assert!(over_cap(&*e), "another error: {e}");
                Err(e.to_string())
            }
        }
    }

    #[tokio::test]
    async fn a_list_past_the_cap_fails_as_over_it_and_a_watch_is_not_cut() {
        let list = "/api/v1/configmaps?limit=100&resourceVersion=0";
        assert_eq!(read(list, 1000, 1000).await, Ok(1000));
        assert!(read(list, 1001, 1000).await.is_err());
        let watch = "/api/v1/configmaps?watch=true&resourceVersion=5&timeoutSeconds=290";
        assert_eq!(read(watch, 5000, 1000).await, Ok(5000));
        // `watch` spelled inside another parameter is no watch.
        assert!(
            read("/api/v1/configmaps?labelSelector=watch=true", 1001, 1000)
                .await
                .is_err()
        );
    }

    /// The requests a watch of ConfigMaps' metadata through [`cached_then_paged`] makes up to
    /// its first list's end, each answered with an empty list.
    async fn asked_until_listed() -> Vec<String> {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::core::PartialObjectMeta;
        let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = asked.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            seen.lock().unwrap().push(request.uri().to_string());
            let list = r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadataList","metadata":{"resourceVersion":"5"},"items":[]}"#;
            let body = kube::client::Body::from(list.as_bytes().to_vec());
            std::future::ready(Ok::<_, std::convert::Infallible>(Response::new(body)))
        });
        let api: Api<PartialObjectMeta<ConfigMap>> = Api::all(kube::Client::new(service, "ns"));
        let config = crate::controller::watch_config();
        let events = cached_then_paged(api.clone(), api, config, "ConfigMaps");
        let mut events = std::pin::pin!(events);
        loop {
            match events.next().await {
                Some(Ok(watcher::Event::InitDone)) => break,
                Some(Ok(_)) => continue,
                other => panic!("the first list did not end: {other:?}"),
            }
        }
        asked.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn the_first_list_asks_the_cache_for_all_at_once() {
        let asked = asked_until_listed().await;
        let [list] = asked.as_slice() else {
            panic!("one list, not {asked:?}");
        };
        // From the cache: `resourceVersion=0`; whole: no `limit` (with one, kube leaves the
        // `resourceVersion` out and the API server pages from etcd).
        assert!(list.contains("resourceVersion=0"), "{list}");
        assert!(!list.contains("limit="), "{list}");
    }

    #[tokio::test]
    async fn only_the_cap_is_over_the_cap() {
        let io = std::io::Error::other("connection reset");
        assert!(!over_cap(&io));
        let cut = Limited::new(
            http_body_util::Full::new(bytes::Bytes::from("0123456789a")),
            10,
        )
        .collect()
        .await
        .expect_err("11 bytes past a cap of 10");
        let kube = kube::Error::Service(cut);
        assert!(over_cap(&kube));
        let listed = watcher::Error::InitialListFailed(kube);
        assert!(over_cap(&listed));
    }
}
