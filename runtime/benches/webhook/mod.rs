//! The reconcile bench's native and webhook columns (P1): HelloWorld's reconcile as a plain
//! function call, and behind HTTP/1.1 on loopback the way Metacontroller calls its sync hooks —
//! an axum server in this process and Metacontroller's Python hook (`hello_sync.py`) in a child
//! process — each reached over one kept-alive client connection.
//!
//! Every column does the guest's work: the request's documents serialized as the host
//! serializes them ([`request_to_wire`]), parsed by the SDK's own entry point
//! ([`WireRequest::parse`]), the response serialized as the guest glue does and decoded with
//! the runtime's [`decode_response`]. On the wire the body carries those very documents, one
//! per line, so the Rust hook hands the SDK the strings a guest gets.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::serve::ListenerExt as _;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use kubewasm::sandbox::{
    Error, Limits, ObjectRef, Request, Response, WireRequest, decode_response, request_to_wire,
};
use kubewasm_guest_sdk::testing::FakeCluster;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What the guest does between receiving the request and answering: the SDK's parsing,
/// `hello_world::reconcile`, the response as the JSON document the guest hands to `respond`.
pub fn guest_work(wire: WireRequest) -> Result<String, Error> {
    let request = wire.parse()?;
    // The SDK's empty cluster: HelloWorld reads nothing and logs nothing.
    let response = hello_world::reconcile(&request, &FakeCluster::new())?;
    serde_json::to_string(&response).map_err(Error::from)
}

/// The native floor: the same Rust function and the same JSON work as the sandbox, no sandbox.
pub fn native(request: &Request, limits: &Limits) -> Response {
    let json = guest_work(request_to_wire(request)).expect("hello_world reconciles");
    decode_response(&json, limits).expect("a valid response")
}

/// The webhook's request body, JSON Lines: this header, then the parent, the previous
/// parent (each `null` when there is none) and the children, one document per line as
/// [`request_to_wire`] serialized it. Nothing is encoded twice (JSON in a JSON string would be
/// escaped by the client and unescaped by the hook, twice the JSON work of the other ways at
/// 1 MiB), and the hook finds the documents by their newlines without parsing anything.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    controller: String,
    target: ObjectRef,
    state: Option<String>,
    finalizing: bool,
}

/// The request as the webhook's body.
fn body(request: &Request) -> Vec<u8> {
    let wire = request_to_wire(request);
    let header = Header {
        controller: wire.controller,
        target: wire.target,
        state: wire.state,
        finalizing: wire.finalizing,
    };
    let mut body = serde_json::to_vec(&header).expect("the header serializes");
    for document in [&wire.parent, &wire.previous] {
        body.push(b'\n');
        body.extend_from_slice(document.as_deref().unwrap_or("null").as_bytes());
    }
    for child in &wire.children {
        body.push(b'\n');
        body.extend_from_slice(child.as_bytes());
    }
    body
}

/// The request the webhook received, as the guest would get it.
fn wire_from_body(body: &[u8]) -> Result<WireRequest, String> {
    let body = std::str::from_utf8(body).map_err(|e| e.to_string())?;
    let mut lines = body.split('\n');
    let header: Header = serde_json::from_str(lines.next().unwrap_or_default())
        .map_err(|e| format!("header: {e}"))?;
    let mut document = || match lines.next() {
        Some("null") => Ok(None),
        Some(line) => Ok(Some(line.to_owned())),
        None => Err("the body ends before the parent and the previous parent".to_owned()),
    };
    let (parent, previous) = (document()?, document()?);
    Ok(WireRequest {
        controller: header.controller,
        target: header.target,
        parent,
        children: lines.map(str::to_owned).collect(),
        previous,
        state: header.state,
        finalizing: header.finalizing,
    })
}

/// The Rust hook's handler: from the body to the answer, what [`native`] does in between.
async fn rust_sync(
    body: Bytes,
) -> Result<([(header::HeaderName, &'static str); 1], String), (StatusCode, String)> {
    let wire = wire_from_body(&body)
        .map_err(|e| (StatusCode::BAD_REQUEST, format!("not a request: {e}")))?;
    let json = guest_work(wire).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.message))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], json))
}

/// What a hook answered, decoded by the client.
pub enum Answer {
    /// kubewasm's response document (the Rust hook), checked by [`decode_response`].
    Response(Response),
    /// Metacontroller's `{"status": ..., "children": [...]}` (the Python hook).
    Metacontroller(Value),
}

/// Where a hook runs: its server, kept for as long as the hook is used.
enum Server {
    /// The axum server's runtime (one worker thread).
    Axum(#[allow(dead_code)] tokio::runtime::Runtime),
    /// The Python process, killed when the hook is dropped.
    Python(Child),
}

/// One webhook and the client's kept-alive HTTP/1.1 connection to it.
pub struct Hook {
    sender: SendRequest<Full<Bytes>>,
    authority: String,
    server: Server,
}

impl Drop for Hook {
    fn drop(&mut self) {
        if let Server::Python(child) = &mut self.server {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Hook {
    /// The axum server on 127.0.0.1 (a free port) in this process, and a connection to it made
    /// on `client` (the current-thread runtime the calls will run on).
    pub fn rust(client: &tokio::runtime::Runtime) -> Hook {
        let server = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rust-hook")
            .enable_all()
            .build()
            .expect("the hook's runtime");
        let listener = server
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("binding the Rust hook");
        let addr = listener.local_addr().expect("the Rust hook's address");
        let app = axum::Router::new()
            .route("/sync", axum::routing::post(rust_sync))
            .layer(DefaultBodyLimit::max(16 << 20));
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        server.spawn(async move { axum::serve(listener, app).await });
        Hook::connect(client, addr, Server::Axum(server))
    }

    /// `hello_sync.py` under `python3` on 127.0.0.1 (a free port, which it prints), or `None`
    /// when there is no `python3`.
    pub fn python(client: &tokio::runtime::Runtime) -> Option<Hook> {
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/webhook/hello_sync.py");
        let mut child = match Command::new("python3")
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
        {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => panic!("starting python3 {}: {e}", script.display()),
        };
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("reading the Python hook's port");
        let port: u16 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{} printed {line:?}, not its port", script.display()));
        Some(Hook::connect(
            client,
            SocketAddr::from(([127, 0, 0, 1], port)),
            Server::Python(child),
        ))
    }

    fn connect(client: &tokio::runtime::Runtime, addr: SocketAddr, server: Server) -> Hook {
        let sender = client.block_on(async {
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .unwrap_or_else(|e| panic!("connecting to the hook on {addr}: {e}"));
            stream.set_nodelay(true).expect("TCP_NODELAY");
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("HTTP/1.1 handshake");
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    eprintln!("the connection to the hook on {addr} failed: {e}");
                }
            });
            sender
        });
        Hook {
            sender,
            authority: addr.to_string(),
            server,
        }
    }

    /// One call: the request serialized, posted, the answer read and decoded.
    async fn call(&mut self, request: &Request, limits: &Limits) -> Answer {
        let post = axum::http::Request::post("/sync")
            .header(header::HOST, &self.authority)
            .header(header::CONTENT_TYPE, "application/jsonl")
            .body(Full::new(Bytes::from(body(request))))
            .expect("a valid HTTP request");
        self.sender.ready().await.expect("the connection is open");
        let response = self
            .sender
            .send_request(post)
            .await
            .expect("the hook answers");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("the hook's answer")
            .to_bytes();
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        match self.server {
            Server::Axum(_) => {
                let json = std::str::from_utf8(&body).expect("UTF-8");
                Answer::Response(decode_response(json, limits).expect("a valid response"))
            }
            Server::Python(_) => {
                Answer::Metacontroller(serde_json::from_slice(&body).expect("a JSON answer"))
            }
        }
    }

    /// One call, on `client`.
    pub fn answer(
        &mut self,
        client: &tokio::runtime::Runtime,
        request: &Request,
        limits: &Limits,
    ) -> Answer {
        client.block_on(self.call(request, limits))
    }

    /// `calls` timed calls, one after the other on `client`.
    pub fn time(
        &mut self,
        client: &tokio::runtime::Runtime,
        request: &Request,
        limits: &Limits,
        calls: usize,
    ) -> Vec<Duration> {
        client.block_on(async {
            let mut times = Vec::with_capacity(calls);
            for _ in 0..calls {
                let started = Instant::now();
                let answer = self.call(request, limits).await;
                times.push(started.elapsed());
                std::hint::black_box(answer);
            }
            times
        })
    }
}
