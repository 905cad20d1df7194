//! The runtime's extension API server: `logs.kubewasm.dev/v1alpha1`, reached through the
//! Kubernetes aggregation layer (an APIService), so that `GET
//! /apis/logs.kubewasm.dev/v1alpha1/namespaces/NS/wasmcontrollers/NAME/log` is authenticated
//! by the kube-apiserver and authorized by RBAC like `pods/log`.
//!
//! HTTPS only; each connection is served by hyper on its own task, so that a follower that
//! stops reading can have its connection cut ([`Conn::cut`]) rather than buffered for.

mod auth;
mod capsules;
mod diffs;
mod log;
mod routes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use tokio::net::TcpListener;
use tokio::sync::Notify;

pub use auth::{Ask, FrontProxy, GROUP, User};
pub use routes::{SUBRESOURCES, Subresource};

use super::{ControllerKey, LogStore};
use crate::controller::{ShardHolder, shard_of, tenant_of};
use crate::host::capsules::CapsuleStore;
use crate::host::shadow::ShadowStore;

/// How long a TLS handshake may take, and a request's head (an idle kept-alive connection is
/// closed after as long).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once: past it a new one is closed at once. Followers hold one each
/// (`--log-max-followers`), the rest are short requests.
const MAX_CONNECTIONS: usize = 1024;

/// Settings of the log server (flags of `kubewasm run`).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The serving certificate and key (PEM); `None`: a self-signed one made at start.
    pub cert: Option<(PathBuf, PathBuf)>,
    /// Followers (`follow=true`) at once, in all.
    pub max_followers: usize,
    /// Followers at once of one controller.
    pub max_followers_per_controller: usize,
    /// How long a follower may leave lines unread before its connection is cut.
    pub stall: Duration,
}

/// Setting the server up failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The front proxy's settings could not be read.
    #[error(transparent)]
    FrontProxy(#[from] auth::FrontProxyError),
    /// A certificate or key could not be read or made.
    #[error("serving certificate: {0}")]
    Certificate(String),
    /// The address could not be bound.
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, #[source] std::io::Error),
}

/// What the runtime keeps of each controller for its team besides its lines.
#[derive(Clone)]
pub struct Kept {
    /// The failed reconciles kept (`capsules`).
    pub capsules: Arc<CapsuleStore>,
    /// The candidates' differences kept (`diffs`).
    pub shadows: Arc<ShadowStore>,
}

/// What every request handler shares.
pub struct Shared {
    /// The lines.
    pub store: Arc<LogStore>,
    /// What a team fetches of its controllers besides their lines.
    pub kept: Kept,
    /// The front proxy's settings.
    pub proxy: FrontProxy,
    /// RBAC's answers.
    pub reviews: Arc<auth::Reviews>,
    /// The runtime's client (whether a controller exists).
    pub client: kube::Client,
    pub config: ServeConfig,
    /// Followers at present.
    pub followers: log::Followers,
    /// This replica's shards, when replicas share the work (`--leader-elect`).
    pub shards: Option<Arc<ShardHolder>>,
}

impl Shared {
    /// Whether the controller runs on this replica (its shard is held here): only then are
    /// its new lines logged here.
    pub fn runs_here(&self, key: &ControllerKey) -> bool {
        let Some(holder) = &self.shards else {
            return true;
        };
        let tenant = tenant_of(key.namespace.as_deref(), &key.name);
        holder
            .held()
            .contains_key(&shard_of(tenant, holder.settings().shards))
    }
}

/// One connection: whether its client presented the front proxy's certificate, and the way
/// to cut it.
#[derive(Debug, Clone)]
pub struct Conn {
    /// The front proxy's certificate was presented and allowed.
    pub front_proxy: bool,
    cut: Arc<Notify>,
}

impl Conn {
    /// Ends the connection (a follower that stopped reading).
    pub fn cut(&self) {
        self.cut.notify_one();
    }
}

/// Reads the front proxy's settings, binds `config.addr` and serves until the process ends;
/// returns the address bound.
pub async fn start(
    store: Arc<LogStore>,
    kept: Kept,
    client: kube::Client,
    config: ServeConfig,
    shards: Option<Arc<ShardHolder>>,
) -> Result<SocketAddr, ServeError> {
    let proxy = FrontProxy::read(&client).await?;
    let tls = tls_config(&proxy, config.cert.as_ref())?;
    let listener = TcpListener::bind(config.addr)
        .await
        .map_err(|e| ServeError::Bind(config.addr, e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| ServeError::Bind(config.addr, e))?;
    let shared = Arc::new(Shared {
        store,
        kept,
        proxy,
        reviews: auth::Reviews::new(client.clone()),
        client,
        followers: log::Followers::default(),
        config,
        shards,
    });
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    tokio::spawn(accept(listener, acceptor, shared));
    Ok(bound)
}

async fn accept(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor, shared: Arc<Shared>) {
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("log server: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            drop(tcp);
            continue;
        };
        let (acceptor, shared) = (acceptor.clone(), shared.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
            else {
                return;
            };
            let front_proxy = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first())
                .is_some_and(|cert| shared.proxy.allows(cert));
            let conn = Conn {
                front_proxy,
                cut: Arc::new(Notify::new()),
            };
            let router = routes::router(shared, conn.clone());
            let service = hyper_util::service::TowerToHyperService::new(router);
            let serving = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HANDSHAKE_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service);
            tokio::select! {
                _ = serving => {}
                () = conn.cut.notified() => {}
            }
        });
    }
}

/// TLS: the serving certificate, and client certificates checked against the front proxy's
/// CA when presented (a request without one is answered 401 by the routes, not refused at
/// the handshake, so that a person with curl learns why).
fn tls_config(
    proxy: &FrontProxy,
    cert: Option<&(PathBuf, PathBuf)>,
) -> Result<rustls::ServerConfig, ServeError> {
    let bad =
        |what: &str, e: &dyn std::fmt::Display| ServeError::Certificate(format!("{what}: {e}"));
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(proxy.ca_pem.as_bytes()) {
        let ca = ca.map_err(|e| bad("the front proxy's CA", &e))?;
        roots.add(ca).map_err(|e| bad("the front proxy's CA", &e))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| bad("the front proxy's CA", &e))?;
    let (chain, key) = match cert {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| bad(&cert.display().to_string(), &e))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| bad(&key.display().to_string(), &e))?;
            (chain, key)
        }
        None => self_signed().map_err(|e| bad("making a self-signed one", &e))?,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("TLS versions", &e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| bad("the serving certificate", &e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A self-signed certificate for the Service's names (the APIService skips verifying it:
/// `insecureSkipTLSVerify`, or give `--api-cert-file` and its CA as the APIService's
/// `caBundle`).
fn self_signed() -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), rcgen::Error> {
    let names = vec![
        "kubewasm-logs".to_owned(),
        "kubewasm-logs.kubewasm-system.svc".to_owned(),
        "localhost".to_owned(),
    ];
    let key = rcgen::KeyPair::generate()?;
    let cert = rcgen::CertificateParams::new(names)?.self_signed(&key)?;
    let key = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|_| rcgen::Error::CouldNotParseKeyPair)?;
    Ok((vec![cert.der().clone()], key))
}
