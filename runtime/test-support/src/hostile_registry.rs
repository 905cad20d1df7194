//! A registry written by an attacker, for tests: plain HTTP on a free port (of loopback, or of
//! an address given), each
//! repository one attack, and a count of the bytes it managed to send for each. Stopped when
//! dropped.
//!
//! | repository | what it answers |
//! | --- | --- |
//! | `endless-token` | every registry request: 401 with a Bearer challenge whose realm is this server's `/token`; `/token`: a body that never ends |
//! | `endless-manifest` | a `HEAD` without a digest, then a manifest body that never ends |
//! | `endless-error` | 500 with a body that never ends (text a status must never echo) |
//! | `redirect-loopback` | 307 to another loopback port nobody named |
//! | `redirect-to` | 307 to the URL given by [`HostileRegistry::redirect_to`] (e.g. the API server) |
//! | `metadata-realm` | 401 with a Bearer realm on the link-local metadata address |
//! | `drip` | 200, then one byte a second |
//!
//! Endless bodies stop when the reader goes away, or after [`SEND_LIMIT`] bytes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The most bytes one endless body sends (so a test that fails does not fill the machine).
pub const SEND_LIMIT: u64 = 2 << 30;

/// What the body of an attacker's text says, so tests can assert it never reaches a status.
pub const MARKER: &str = "HOSTILE-REGISTRY-BODY";

/// The attacker's registry; stopped when dropped.
pub struct HostileRegistry {
    addr: String,
    sent: Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>,
    redirect: Arc<Mutex<String>>,
    connections: Arc<AtomicU64>,
    server: tokio::task::JoinHandle<()>,
}

impl HostileRegistry {
    /// Starts it on a free loopback port, in the current tokio runtime.
    pub async fn start() -> std::io::Result<HostileRegistry> {
        Self::start_on("127.0.0.1").await
    }

    /// Starts it on a free port of `ip` (an address of this machine: the node's, where the
    /// Pods of the end-to-end test reach it), in the current tokio runtime.
    pub async fn start_on(ip: &str) -> std::io::Result<HostileRegistry> {
        let listener = TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?.to_string();
        let sent: Arc<Mutex<HashMap<String, Arc<AtomicU64>>>> = Arc::default();
        let redirect = Arc::new(Mutex::new(String::from("http://127.0.0.1:1/")));
        let state = (addr.clone(), sent.clone(), redirect.clone());
        let connections = Arc::new(AtomicU64::new(0));
        let accepted = connections.clone();
        let server = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::Relaxed);
                let (addr, sent, redirect) = state.clone();
                tokio::spawn(async move {
                    let _ = serve(socket, &addr, &sent, &redirect).await;
                });
            }
        });
        Ok(HostileRegistry {
            addr,
            sent,
            redirect,
            connections,
            server,
        })
    }

    /// `<ip>:<port>`, as image references name it.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// An image of `repository` on it.
    pub fn image(&self, repository: &str) -> String {
        format!("{}/{repository}:v1", self.addr)
    }

    /// Where `redirect-to` sends its clients.
    pub fn redirect_to(&self, url: &str) {
        if let Ok(mut target) = self.redirect.lock() {
            *target = url.to_owned();
        }
    }

    /// The connections it accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// The body bytes it sent for `repository` so far (the token's under `endless-token`).
    pub fn sent(&self, repository: &str) -> u64 {
        self.sent
            .lock()
            .ok()
            .and_then(|s| s.get(repository).map(|c| c.load(Ordering::Relaxed)))
            .unwrap_or(0)
    }
}

impl Drop for HostileRegistry {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(
    mut socket: TcpStream,
    addr: &str,
    sent: &Mutex<HashMap<String, Arc<AtomicU64>>>,
    redirect: &Mutex<String>,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = socket.read(&mut buf).await?;
        if n == 0 || head.len() > 64 << 10 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut words = head.split_whitespace();
    let method = words.next().unwrap_or_default().to_owned();
    let path = words.next().unwrap_or_default().to_owned();
    let repository = if path.starts_with("/token") {
        "endless-token".to_owned()
    } else {
        path.strip_prefix("/v2/")
            .and_then(|p| p.split('/').next())
            .unwrap_or_default()
            .to_owned()
    };
    let counter = match sent.lock() {
        Ok(mut sent) => sent.entry(repository.clone()).or_default().clone(),
        Err(_) => return Ok(()),
    };
    let respond = |status: &str, headers: &str| {
        format!("HTTP/1.1 {status}\r\n{headers}connection: close\r\n\r\n")
    };
    match repository.as_str() {
        "endless-token" if path.starts_with("/token") => {
            let head = respond("200 OK", "content-type: application/json\r\n");
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(b"{\"token\":\"").await?;
            endless(&mut socket, &counter).await
        }
        "endless-token" => {
            let challenge = format!(
                "www-authenticate: Bearer realm=\"http://{addr}/token\",service=\"hostile\",scope=\"repository:endless-token:pull\"\r\ncontent-length: 0\r\n"
            );
            let head = respond("401 Unauthorized", &challenge);
            socket.write_all(head.as_bytes()).await
        }
        "metadata-realm" => {
            let challenge = "www-authenticate: Bearer realm=\"http://169.254.169.254/latest/meta-data/token\",service=\"x\"\r\ncontent-length: 0\r\n";
            let head = respond("401 Unauthorized", challenge);
            socket.write_all(head.as_bytes()).await
        }
        "endless-manifest" if method == "HEAD" => {
            let head = respond(
                "200 OK",
                "content-type: application/vnd.oci.image.manifest.v1+json\r\ncontent-length: 0\r\n",
            );
            socket.write_all(head.as_bytes()).await
        }
        "endless-manifest" => {
            let head = respond(
                "200 OK",
                "content-type: application/vnd.oci.image.manifest.v1+json\r\n",
            );
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(b"{\"schemaVersion\":2,\"x\":\"").await?;
            endless(&mut socket, &counter).await
        }
        "endless-error" => {
            let head = respond("500 Internal Server Error", "content-type: text/plain\r\n");
            socket.write_all(head.as_bytes()).await?;
            endless(&mut socket, &counter).await
        }
        "redirect-loopback" | "redirect-to" => {
            let target = match repository.as_str() {
                "redirect-to" => redirect.lock().map(|r| r.clone()).unwrap_or_default(),
                // A port nobody named (the discard port; nothing needs to listen).
                _ => "https://127.0.0.1:9/v2/stolen/manifests/v1".to_owned(),
            };
            let head = respond(
                "307 Temporary Redirect",
                &format!("location: {target}\r\ncontent-length: 0\r\n"),
            );
            socket.write_all(head.as_bytes()).await
        }
        "drip" => {
            let head = respond(
                "200 OK",
                "content-type: application/vnd.oci.image.manifest.v1+json\r\n",
            );
            socket.write_all(head.as_bytes()).await?;
            loop {
                socket.write_all(b" ").await?;
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
        _ => {
            let head = respond("404 Not Found", "content-length: 0\r\n");
            socket.write_all(head.as_bytes()).await
        }
    }
}

/// Sends the marker over and over until the reader goes away or [`SEND_LIMIT`].
async fn endless(socket: &mut TcpStream, counter: &AtomicU64) -> std::io::Result<()> {
    let chunk = MARKER.repeat((64 << 10) / MARKER.len());
    while counter.load(Ordering::Relaxed) < SEND_LIMIT {
        socket.write_all(chunk.as_bytes()).await?;
        counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}
