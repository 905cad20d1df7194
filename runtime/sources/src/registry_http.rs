//! How the runtime speaks HTTP to a registry a tenant names: the one way a pull reaches the
//! network, so every rule about it holds in one place.
//!
//! - **Where**: a registry is reached only at an address an operator would let a stranger
//!   make the runtime contact. Hosts that are (or resolve to) loopback, link-local (cloud
//!   metadata services), private or shared ranges (cluster Pods and Services), the API
//!   server's own addresses, or cluster names (`*.svc`, `*.cluster.local`, `localhost`) are
//!   refused unless the operator names the registry (`--insecure-registry HOST:PORT` or
//!   `--allow-registry HOST[:PORT]`). The rule is checked on the URL of every request and
//!   every redirect hop (an IP literal), and again on the addresses a name resolves to, by the
//!   client's own resolver, so a name that resolves to `127.0.0.1` (or rebinds to it between
//!   checks) is refused at the connect that would use it. Redirects to other hosts (registries
//!   hand blobs to storage services) follow the same rule, at most [`MAX_REDIRECTS`] of them,
//!   never from HTTPS down to plain HTTP. No proxy from the environment is used: the check is
//!   on the address actually connected to.
//! - **How much**: every body is read through one capped reader
//!   ([`capped`](super::capped)): a token response at most [`MAX_TOKEN_BYTES`], a manifest
//!   `oci::MAX_MANIFEST_BYTES`, a blob its declared size. An error response's body is never
//!   read, and nothing a registry sends is put into a status: errors say the method, the URL
//!   and the status code.
//! - **Who**: credentials are sent per request and a token is kept per session (one pull of
//!   one repository); the client holds none, so sessions never share them.
//!
//! `oci-client` reads a token response, a manifest and every error body whole and follows any
//! redirect and any token realm, so the pull path does not use it for HTTP (only its types);
//! `kubewasm push` (the user's own registry, the user's own process) still does.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use oci_client::secrets::RegistryAuth;
use reqwest::{Method, StatusCode, Url};

pub use super::capped::{read_at_most, read_body, read_capped};
use super::oci::{CONNECT_TIMEOUT, PullError, READ_TIMEOUT};
use kubewasm_sandbox::guest_text;

/// The most bytes a token response may have (a JWT is a few KiB).
pub const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// The most redirects one request follows.
pub const MAX_REDIRECTS: usize = 5;

/// What the operator allows of registries' addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryAccess {
    /// Registries (`HOST:PORT`) spoken to over plain HTTP (`--insecure-registry`); named by
    /// the operator, so reached wherever they are.
    pub insecure: Vec<String>,
    /// Registries (`HOST` or `HOST:PORT`) reached even at internal addresses
    /// (`--allow-registry`).
    pub allowed: Vec<String>,
    /// The API server's addresses: never a registry.
    pub api_server: Vec<IpAddr>,
}

impl RegistryAccess {
    /// Whether the operator named `host` (at `port`): an exact `HOST:PORT` entry, or a `HOST`
    /// entry (any port).
    fn named(&self, host: &str, port: Option<u16>) -> bool {
        let with_port = port.map(|p| format!("{host}:{p}"));
        self.insecure
            .iter()
            .chain(&self.allowed)
            .any(|entry| entry == host || Some(entry) == with_port.as_ref())
    }

    /// Whether `host` is named with any port (the resolver does not see ports).
    fn named_host(&self, host: &str) -> bool {
        self.insecure.iter().chain(&self.allowed).any(|entry| {
            entry == host
                || entry
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| h == host && p.parse::<u16>().is_ok())
        })
    }

    /// Whether plain HTTP may be spoken to `host:port`.
    fn insecure(&self, host: &str, port: Option<u16>) -> bool {
        let with_port = port.map(|p| format!("{host}:{p}"));
        self.insecure.iter().any(|e| Some(e) == with_port.as_ref())
    }

    /// Why `url` may not be asked, if it may not: its scheme, or its host (a name is checked
    /// again on what it resolves to).
    pub fn check_url(&self, url: &Url) -> Result<(), String> {
        let Some(host) = url.host_str() else {
            return Err(format!("{} names no host", shown(url)));
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = url.port_or_known_default();
        match url.scheme() {
            "https" => {}
            "http" if self.insecure(host, port) => {}
            "http" => {
                return Err(format!(
                    "{} is plain HTTP, which this runtime speaks only to registries its operator names with `kubewasm run --insecure-registry HOST:PORT`",
                    shown(url)
                ));
            }
            other => {
                return Err(format!(
                    "{} has scheme `{}`",
                    shown(url),
                    guest_text(other, 20)
                ));
            }
        }
        if self.named(host, port) {
            return Ok(());
        }
        let refused = |what: &str| {
            Err(format!(
                "{} is {what}, which this runtime does not contact for a tenant; {}",
                shown(url),
                ASK_OPERATOR
            ))
        };
        match host.parse::<IpAddr>() {
            Ok(ip) => match self.internal(ip) {
                Some(what) => refused(&format!("at {what} address {ip}")),
                None => Ok(()),
            },
            Err(_) if cluster_name(host) => refused("a cluster-internal name"),
            Err(_) => Ok(()),
        }
    }

    /// What kind of address `ip` is, when it is one a tenant may not make the runtime reach.
    pub fn internal(&self, ip: IpAddr) -> Option<&'static str> {
        internal_range(ip).or_else(|| self.api_server.contains(&ip).then_some("the API server's"))
    }
}

/// What a refusal tells the tenant to do.
const ASK_OPERATOR: &str = "if the registry is meant to be reached there, the runtime's operator names it with `kubewasm run --allow-registry HOST[:PORT]` (or `--insecure-registry HOST:PORT` for plain HTTP)";

/// A URL as a message shows it: no query (a token realm's query may carry anything), bounded.
fn shown(url: &Url) -> String {
    let mut url = url.clone();
    url.set_query(None);
    url.set_fragment(None);
    let _ = url.set_password(None);
    guest_text(url.as_str(), 300).into_owned()
}

/// Names that only mean something inside a cluster or a host.
fn cluster_name(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host == "localhost"
        || [".localhost", ".svc", ".cluster.local", ".internal"]
            .iter()
            .any(|suffix| host.ends_with(suffix))
}

/// The ranges no registry of a stranger's is in: loopback, link-local, private, shared
/// (carrier-grade NAT, often Pods), unspecified, broadcast and multicast, and IPv6's unique
/// local; IPv4 mapped into IPv6 as IPv4.
pub fn internal_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => internal_v4(v4),
            None => internal_v6(v6),
        },
    }
}

fn internal_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("a loopback")
    } else if ip.is_link_local() {
        Some("a link-local (metadata service)")
    } else if ip.is_private() || (a == 100 && (64..128).contains(&b)) {
        Some("a private (cluster-internal)")
    } else if ip.is_unspecified() || a == 0 {
        Some("an unspecified")
    } else if ip.is_broadcast() || ip.is_multicast() {
        Some("a broadcast or multicast")
    } else {
        None
    }
}

fn internal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("a loopback")
    } else if first & 0xffc0 == 0xfe80 {
        Some("a link-local (metadata service)")
    } else if first & 0xfe00 == 0xfc00 {
        Some("a private (cluster-internal)")
    } else if ip.is_unspecified() {
        Some("an unspecified")
    } else if ip.is_multicast() {
        Some("a multicast")
    } else {
        None
    }
}

/// The client's resolver: a name a tenant gave resolves only to addresses it may reach.
struct Guard(Arc<RegistryAccess>);

impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let access = self.0.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if !access.named_host(&host)
                && let Some((ip, what)) = addrs
                    .iter()
                    .find_map(|a| access.internal(a.ip()).map(|what| (a.ip(), what)))
            {
                return Err(format!(
                    "{} resolves to {what} address {ip}, which this runtime does not contact for a tenant; {ASK_OPERATOR}",
                    guest_text(&host, 200)
                )
                .into());
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// An HTTP client that keeps to `access` (addresses, redirects) with the pulls' timeouts.
pub fn client(access: &Arc<RegistryAccess>) -> Result<reqwest::Client, PullError> {
    super::oci::check_roots()?;
    let redirects = access.clone();
    let policy = reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= MAX_REDIRECTS {
            return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
        }
        let downgrade = attempt.url().scheme() == "http"
            && attempt.previous().iter().any(|u| u.scheme() == "https");
        if downgrade {
            let why = format!(
                "a redirect from HTTPS to plain HTTP ({}), which this runtime never follows",
                shown(attempt.url())
            );
            return attempt.error(why);
        }
        match redirects.check_url(attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(why) => attempt.error(format!("a redirect to {why}")),
        }
    });
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .redirect(policy)
        .dns_resolver(Arc::new(Guard(access.clone())))
        .no_proxy()
        .referer(false)
        .build()
        .map_err(|e| PullError::Client(e.to_string()))
}

/// One pull's conversation with one repository of one registry: its credentials, and the
/// token the registry handed out for them.
pub struct Session {
    access: Arc<RegistryAccess>,
    client: reqwest::Client,
    registry: String,
    repository: String,
    base: String,
    auth: RegistryAuth,
    /// Send the basic credentials (the registry asked for them).
    basic: bool,
    token: Option<String>,
}

impl Session {
    /// A session with `registry`'s `repository`, as `auth`.
    pub fn new(
        access: &Arc<RegistryAccess>,
        registry: &str,
        repository: &str,
        auth: &RegistryAuth,
    ) -> Result<Session, PullError> {
        let (host, port) = split_authority(registry);
        let scheme = match access.insecure(host, port) {
            true => "http",
            false => "https",
        };
        Ok(Session {
            access: access.clone(),
            client: client(access)?,
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            base: format!("{scheme}://{registry}/v2/{repository}"),
            auth: auth.clone(),
            basic: false,
            token: None,
        })
    }

    /// The registry (`host:port`).
    pub fn registry(&self) -> &str {
        &self.registry
    }

    fn failed(&self, message: String) -> PullError {
        PullError::Registry {
            registry: self.registry.clone(),
            message: guest_text(&message, 1024).into_owned(),
        }
    }

    /// `method` on `<repository>/<tail>` (`manifests/TAG`, `blobs/DIGEST`), answering a
    /// registry's challenge once. `None`: the registry says there is no such thing (404). Any
    /// other answer than success is an error naming the status; its body is not read.
    pub async fn send(
        &mut self,
        method: Method,
        tail: &str,
        accept: &[&str],
    ) -> Result<Option<reqwest::Response>, PullError> {
        let url = format!("{}/{tail}", self.base);
        let parsed = Url::parse(&url).map_err(|e| self.failed(format!("{url}: {e}")))?;
        self.access
            .check_url(&parsed)
            .map_err(|why| self.failed(why))?;
        for attempt in 0..2 {
            let mut request = self.client.request(method.clone(), parsed.clone());
            if !accept.is_empty() {
                request = request.header(reqwest::header::ACCEPT, accept.join(", "));
            }
            request = match (&self.token, &self.auth) {
                (Some(token), _) | (None, RegistryAuth::Bearer(token)) => {
                    request.bearer_auth(token)
                }
                (None, RegistryAuth::Basic(user, password)) if self.basic => {
                    request.basic_auth(user, Some(password))
                }
                _ => request,
            };
            let response = request.send().await.map_err(|e| {
                self.failed(format!(
                    "{method} {}: {}{}",
                    shown(&parsed),
                    chain(&e),
                    plain_http_hint(&parsed, e.is_connect(), &self.registry)
                ))
            })?;
            let status = response.status();
            if status.is_success() {
                return Ok(Some(response));
            }
            if status == StatusCode::NOT_FOUND {
                return Ok(None);
            }
            if status == StatusCode::UNAUTHORIZED && attempt == 0 {
                let challenge = response
                    .headers()
                    .get(reqwest::header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                drop(response);
                self.answer(challenge.as_deref()).await?;
                continue;
            }
            return Err(self.failed(format!("{method} {}: {status}", shown(&parsed))));
        }
        Err(self.failed(format!(
            "{method} {}: 401 Unauthorized with the credentials it asked for; check spec.module.imagePullSecret",
            shown(&parsed)
        )))
    }

    /// Answers a `WWW-Authenticate` challenge: a Bearer one with a token from its realm, a
    /// Basic one with the credentials.
    async fn answer(&mut self, challenge: Option<&str>) -> Result<(), PullError> {
        let needs_secret = || {
            "the registry asks for credentials; give the controller a pull secret in spec.module.imagePullSecret".to_owned()
        };
        let challenges = challenge
            .and_then(|c| http_auth::parse_challenges(c).ok())
            .unwrap_or_default();
        let param = |c: &http_auth::ChallengeRef<'_>, name: &str| {
            c.params
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.to_unescaped())
        };
        if let Some(bearer) = challenges
            .iter()
            .find(|c| c.scheme.eq_ignore_ascii_case("bearer"))
        {
            let Some(realm) = param(bearer, "realm") else {
                return Err(self.failed("its Bearer challenge names no realm".into()));
            };
            let service = param(bearer, "service");
            let scope = param(bearer, "scope")
                .unwrap_or_else(|| format!("repository:{}:pull", self.repository));
            self.token = Some(self.fetch_token(&realm, service.as_deref(), &scope).await?);
            return Ok(());
        }
        if challenges
            .iter()
            .any(|c| c.scheme.eq_ignore_ascii_case("basic"))
            && matches!(self.auth, RegistryAuth::Basic(..))
            && !self.basic
        {
            self.basic = true;
            return Ok(());
        }
        Err(self.failed(needs_secret()))
    }

    /// A token from `realm` (the Docker token protocol), read through the capped reader.
    async fn fetch_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> Result<String, PullError> {
        let mut url = Url::parse(realm).map_err(|e| {
            self.failed(format!(
                "its token realm `{}` is no URL: {e}",
                guest_text(realm, 200)
            ))
        })?;
        self.access
            .check_url(&url)
            .map_err(|why| self.failed(format!("its token realm: {why}")))?;
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = service {
                query.append_pair("service", service);
            }
            query.append_pair("scope", scope);
        }
        let mut request = self.client.get(url.clone());
        if let RegistryAuth::Basic(user, password) = &self.auth {
            request = request.basic_auth(user, Some(password));
        }
        let response = request
            .send()
            .await
            .map_err(|e| self.failed(format!("GET token {}: {}", shown(&url), chain(&e))))?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.failed(format!("GET token {}: {status}", shown(&url))));
        }
        let body = read_body(response, MAX_TOKEN_BYTES, "token").await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token: Token = serde_json::from_slice(&body)
            .map_err(|_| self.failed(format!("GET token {}: not a token response", shown(&url))))?;
        token
            .token
            .or(token.access_token)
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| {
                self.failed(format!(
                    "GET token {}: the response holds no usable token",
                    shown(&url)
                ))
            })
    }
}

/// `host` and `port` of `host[:port]` (`[v6]:port` too).
fn split_authority(authority: &str) -> (&str, Option<u16>) {
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') => match port.parse() {
            Ok(port) => (
                host.trim_start_matches('[').trim_end_matches(']'),
                Some(port),
            ),
            Err(_) => (authority, None),
        },
        _ => (authority, None),
    }
}

/// An error and its causes, one line (what reqwest says of a refused resolve is in a cause).
/// What a failed HTTPS connection to `registry` says of plain HTTP: a registry that speaks it
/// (no TLS) fails the handshake, and only the runtime's operator may allow that.
fn plain_http_hint(url: &Url, connect: bool, registry: &str) -> String {
    if url.scheme() != "https" || !connect {
        return String::new();
    }
    format!(
        "; if {registry} speaks plain HTTP (no TLS), only the runtime's operator (a cluster admin) can allow it: `kubewasm run --insecure-registry {registry}` (an argument of the runtime's Deployment, deploy/runtime/deployment.yaml)"
    )
}

fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_failed_https_connection_names_insecure_registry_and_who_sets_it() {
        let https = super::Url::parse("https://registry.team:5000/v2/a/manifests/v1").unwrap();
        let hint = super::plain_http_hint(&https, true, "registry.team:5000");
        assert!(
            hint.contains("only the runtime's operator (a cluster admin) can allow it: `kubewasm run --insecure-registry registry.team:5000`"),
            "{hint}"
        );
        assert_eq!(
            super::plain_http_hint(&https, false, "registry.team:5000"),
            ""
        );
        let http = super::Url::parse("http://registry.team:5000/v2/").unwrap();
        assert_eq!(
            super::plain_http_hint(&http, true, "registry.team:5000"),
            ""
        );
    }

    use std::time::Duration;

    use kubewasm_test_support::hostile_registry::{HostileRegistry, MARKER};
    use reqwest::dns::Resolve as _;

    use super::*;
    use crate::oci::{RegistryConfig, pull};
    use kubewasm_api::{ImageRef, Reason};

    /// What the attacker got the runtime to read at most: the cap, plus what the kernel's
    /// socket buffers on loopback take before the reader stops (a few MiB).
    const AT_MOST: u64 = 32 << 20;

    fn named(addr: &str) -> RegistryConfig {
        RegistryConfig {
            insecure: vec![addr.to_owned()],
            ..RegistryConfig::new(1 << 20)
        }
    }

    async fn refusal(config: &RegistryConfig, image: &str) -> PullError {
        let image = ImageRef::parse(image).unwrap();
        let result = tokio::time::timeout(
            Duration::from_secs(60),
            pull(config, &image, &RegistryAuth::Anonymous, None),
        )
        .await
        .expect("the pull ended within a minute");
        let err = result.unwrap_err();
        assert!(
            !err.to_string().contains(MARKER),
            "the status echoes the registry: {err}"
        );
        err
    }

    #[tokio::test]
    async fn an_endless_token_response_is_cut_off_at_its_cap() {
        let registry = HostileRegistry::start().await.unwrap();
        let err = refusal(&named(registry.addr()), &registry.image("endless-token")).await;
        assert!(
            matches!(err, PullError::TooBig { what: "token", .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("token is larger than 64Ki"),
            "{err}"
        );
        let sent = registry.sent("endless-token");
        println!("endless token: the registry got {sent} bytes out before the runtime hung up");
        assert!(sent < AT_MOST, "the registry sent {sent} bytes");
    }

    #[tokio::test]
    async fn an_endless_manifest_behind_a_head_without_digest_is_cut_off() {
        let registry = HostileRegistry::start().await.unwrap();
        let err = refusal(&named(registry.addr()), &registry.image("endless-manifest")).await;
        assert!(
            matches!(
                err,
                PullError::TooBig {
                    what: "manifest",
                    ..
                }
            ),
            "{err}"
        );
        let sent = registry.sent("endless-manifest");
        println!("endless manifest: {sent} bytes sent");
        assert!(sent < AT_MOST, "the registry sent {sent} bytes");
    }

    #[tokio::test]
    async fn an_error_body_is_never_read_nor_shown() {
        let registry = HostileRegistry::start().await.unwrap();
        let err = refusal(&named(registry.addr()), &registry.image("endless-error")).await;
        assert!(
            err.to_string().contains("500 Internal Server Error"),
            "{err}"
        );
        assert_eq!(err.reason(), Reason::ModuleNotFound);
        let sent = registry.sent("endless-error");
        println!("endless error body: {sent} bytes sent");
        assert!(sent < AT_MOST, "the registry sent {sent} bytes");
    }

    #[tokio::test]
    async fn redirects_to_loopback_or_the_api_server_are_refused() {
        let registry = HostileRegistry::start().await.unwrap();
        let err = refusal(
            &named(registry.addr()),
            &registry.image("redirect-loopback"),
        )
        .await;
        let text = err.to_string();
        assert!(text.contains("loopback address 127.0.0.1"), "{text}");
        assert!(text.contains("--allow-registry"), "{text}");
        // An API server on an address no range rule refuses (TEST-NET-3).
        registry.redirect_to("https://203.0.113.7:6443/api/v1/secrets");
        let config = RegistryConfig {
            api_server: vec!["203.0.113.7".parse().unwrap()],
            ..named(registry.addr())
        };
        let err = refusal(&config, &registry.image("redirect-to")).await;
        assert!(
            err.to_string()
                .contains("the API server's address 203.0.113.7"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_token_realm_on_the_metadata_address_is_not_asked() {
        let registry = HostileRegistry::start().await.unwrap();
        let err = refusal(&named(registry.addr()), &registry.image("metadata-realm")).await;
        let text = err.to_string();
        assert!(text.contains("its token realm"), "{text}");
        assert!(text.contains("169.254.169.254"), "{text}");
    }

    #[tokio::test]
    async fn a_registry_nobody_named_on_loopback_is_never_contacted() {
        let registry = HostileRegistry::start().await.unwrap();
        let config = RegistryConfig::new(1 << 20);
        let err = refusal(&config, &registry.image("endless-manifest")).await;
        assert!(
            err.to_string().contains("loopback address 127.0.0.1"),
            "{err}"
        );
        assert_eq!(registry.connections(), 0);
        // Named by the operator, the same registry is asked.
        let allowed = RegistryConfig {
            allowed: vec!["127.0.0.1".into()],
            ..config
        };
        let err = refusal(&allowed, &registry.image("endless-manifest")).await;
        // `--allow-registry` does not make it plain HTTP: the HTTPS handshake fails.
        assert!(!err.to_string().contains("loopback address"), "{err}");
        assert!(registry.connections() > 0);
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_at_the_connect() {
        let guard = Guard(Arc::new(RegistryAccess::default()));
        let err = match guard.resolve("localhost".parse().unwrap()).await {
            Ok(_) => panic!("localhost resolved for a tenant"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("resolves to a loopback address"), "{err}");
        let named = Guard(Arc::new(RegistryAccess {
            allowed: vec!["localhost:5000".into()],
            ..RegistryAccess::default()
        }));
        assert!(named.resolve("localhost".parse().unwrap()).await.is_ok());
    }

    #[tokio::test]
    async fn a_registry_that_drips_ends_at_the_deadline() {
        let registry = HostileRegistry::start().await.unwrap();
        let config = RegistryConfig {
            pull_timeout: Duration::from_secs(3),
            ..named(registry.addr())
        };
        let image = format!("{}/drip@sha256:{}", registry.addr(), "0".repeat(64));
        let err = refusal(&config, &image).await;
        assert!(matches!(err, PullError::TimedOut { .. }), "{err}");
    }

    #[test]
    fn internal_addresses_are_known() {
        for (ip, what) in [
            ("127.0.0.1", "loopback"),
            ("169.254.169.254", "link-local"),
            ("10.96.0.1", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "private"),
            ("0.0.0.0", "unspecified"),
            ("::1", "loopback"),
            ("fe80::1", "link-local"),
            ("fd00::1", "private"),
            ("::ffff:127.0.0.1", "loopback"),
        ] {
            let found = internal_range(ip.parse().unwrap());
            assert!(found.is_some_and(|f| f.contains(what)), "{ip}: {found:?}");
        }
        for ip in [
            "8.8.8.8",
            "203.0.113.7",
            "2001:4860:4860::8888",
            "100.128.0.1",
        ] {
            assert_eq!(internal_range(ip.parse().unwrap()), None, "{ip}");
        }
    }

    #[test]
    fn urls_are_checked_by_scheme_host_and_operator() {
        let access = RegistryAccess {
            insecure: vec!["127.0.0.1:5000".into()],
            allowed: vec!["registry.kube-system.svc".into()],
            api_server: Vec::new(),
        };
        let check = |url: &str| access.check_url(&Url::parse(url).unwrap());
        assert!(check("http://127.0.0.1:5000/v2/").is_ok());
        assert!(
            check("http://127.0.0.1:5001/v2/")
                .unwrap_err()
                .contains("plain HTTP")
        );
        assert!(
            check("https://127.0.0.1:5001/v2/")
                .unwrap_err()
                .contains("loopback")
        );
        assert!(check("https://registry.kube-system.svc/v2/").is_ok());
        assert!(
            check("https://other.kube-system.svc/v2/")
                .unwrap_err()
                .contains("cluster-internal name")
        );
        assert!(
            check("https://[::1]:443/v2/")
                .unwrap_err()
                .contains("loopback")
        );
        assert!(check("https://ghcr.io/v2/").is_ok());
        assert!(check("ftp://ghcr.io/").unwrap_err().contains("scheme"));
        // Whatever a realm's query holds is not shown.
        let err = check("https://10.0.0.1/token?secret=x").unwrap_err();
        assert!(!err.contains("secret=x"), "{err}");
    }
}
