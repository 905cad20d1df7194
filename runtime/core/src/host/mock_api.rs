//! A mock API server for unit tests (tower-test, as kube-rs's own controller examples do):
//! every request is answered by a function of its method, path and body, and recorded, so a
//! test asserts what was sent request by request. Never the proof that a feature works on
//! Kubernetes (the cluster tier is).

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use serde_json::Value;

/// One request sent: method, path with query, JSON body.
pub(crate) type Sent = (String, String, Value);

/// How the mock answers a request (method, path, body): status and body.
pub(crate) type Answer = fn(&str, &str, &Value) -> (u16, Value);

/// A client of a mock API server answering with `answer`, and what it was sent.
pub(crate) fn api_server(answer: Answer) -> (Client, Arc<Mutex<Vec<Sent>>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let sent = Arc::new(Mutex::new(Vec::new()));
    tokio::spawn({
        let sent = sent.clone();
        async move {
            while let Some((request, respond)) = handle.next_request().await {
                let method = request.method().to_string();
                let path = request.uri().to_string();
                let bytes = request
                    .into_body()
                    .collect_bytes()
                    .await
                    .unwrap_or_default();
                let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let (status, reply) = answer(&method, &path, &body);
                sent.lock().unwrap().push((method, path, body));
                let response = Response::builder()
                    .status(status)
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap();
                respond.send_response(response);
            }
        }
    });
    (Client::new(service, "ns"), sent)
}
