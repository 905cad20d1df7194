//! Who is asking, as an extension API server learns it: the connection's client certificate
//! must be the aggregation layer's front proxy (signed by the CA and carrying a name that the
//! ConfigMap `kube-system/extension-apiserver-authentication` names), and only then are its
//! `X-Remote-User`/`X-Remote-Group`/`X-Remote-Extra-*` headers believed. Every request is then
//! authorized by a SubjectAccessReview, so that the cluster's RBAC decides exactly as it does
//! for `pods/log`; answers are reused for [`REVIEW_TTL`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::HeaderMap;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use rustls::pki_types::CertificateDer;

use crate::sync::Locks as _;

/// How long an answer of RBAC about one user and one controller is reused.
pub const REVIEW_TTL: Duration = Duration::from_secs(10);

/// Answers kept at most; past it, all are forgotten at once (cheap, and rare).
const MAX_REVIEWS: usize = 10_000;

/// What `kube-system/extension-apiserver-authentication` says about the front proxy.
#[derive(Debug, Clone)]
pub struct FrontProxy {
    /// The CA bundle (PEM) that signs the front proxy's client certificate.
    pub ca_pem: String,
    /// Names (CN) the certificate may carry; empty: any the CA signed.
    pub allowed_names: Vec<String>,
    /// Headers that carry the user's name, groups, and the prefix of its extra attributes.
    pub user_headers: Vec<String>,
    /// See `user_headers`.
    pub group_headers: Vec<String>,
    /// See `user_headers`.
    pub extra_prefixes: Vec<String>,
}

/// Reading the front proxy's settings failed.
#[derive(Debug, thiserror::Error)]
pub enum FrontProxyError {
    /// The ConfigMap could not be read.
    #[error(
        "cannot read ConfigMap kube-system/extension-apiserver-authentication (the runtime needs a RoleBinding to Role extension-apiserver-authentication-reader there: deploy/runtime/logs.yaml): {0}"
    )]
    Read(#[source] kube::Error),
    /// The cluster has no aggregation layer.
    #[error(
        "the API server has no aggregation layer (no requestheader-client-ca-file in kube-system/extension-apiserver-authentication): the cluster admin starts kube-apiserver with --requestheader-client-ca-file and --proxy-client-cert-file"
    )]
    NoAggregation,
}

impl FrontProxy {
    /// Reads the settings as the kube-apiserver published them.
    pub async fn read(client: &kube::Client) -> Result<FrontProxy, FrontProxyError> {
        let api = kube::Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
        let map = api
            .get("extension-apiserver-authentication")
            .await
            .map_err(FrontProxyError::Read)?;
        let data = map.data.unwrap_or_default();
        let ca_pem = data
            .get("requestheader-client-ca-file")
            .filter(|ca| !ca.trim().is_empty())
            .ok_or(FrontProxyError::NoAggregation)?
            .clone();
        let list = |key: &str, default: &[&str]| -> Vec<String> {
            data.get(key)
                .and_then(|v| serde_json::from_str::<Vec<String>>(v).ok())
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.iter().map(|s| (*s).to_owned()).collect())
        };
        Ok(FrontProxy {
            ca_pem,
            allowed_names: list("requestheader-allowed-names", &[]),
            user_headers: list("requestheader-username-headers", &["X-Remote-User"]),
            group_headers: list("requestheader-group-headers", &["X-Remote-Group"]),
            extra_prefixes: list("requestheader-extra-headers-prefix", &["X-Remote-Extra-"]),
        })
    }

    /// Whether a verified client certificate is the front proxy's (its CN allowed).
    pub fn allows(&self, cert: &CertificateDer<'_>) -> bool {
        if self.allowed_names.is_empty() {
            return true;
        }
        common_name(cert).is_some_and(|cn| self.allowed_names.contains(&cn))
    }

    /// The user the front proxy names in `headers`; `None` when it names none.
    pub fn user(&self, headers: &HeaderMap) -> Option<User> {
        let name = self
            .user_headers
            .iter()
            .find_map(|h| headers.get(h.as_str())?.to_str().ok())
            .filter(|n| !n.is_empty())?
            .to_owned();
        let mut groups: Vec<String> = self
            .group_headers
            .iter()
            .flat_map(|h| headers.get_all(h.as_str()))
            .filter_map(|v| v.to_str().ok())
            .map(str::to_owned)
            .collect();
        groups.sort();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (header, value) in headers {
            let lower = header.as_str();
            let Some(prefix) = self
                .extra_prefixes
                .iter()
                .find(|p| lower.starts_with(&p.to_ascii_lowercase()))
            else {
                continue;
            };
            if let Ok(value) = value.to_str() {
                let key = lower[prefix.len()..].to_owned();
                extra.entry(key).or_default().push(value.to_owned());
            }
        }
        Some(User {
            name,
            groups,
            extra,
        })
    }
}

/// A user as the front proxy names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct User {
    /// `X-Remote-User`.
    pub name: String,
    /// `X-Remote-Group`, sorted.
    pub groups: Vec<String>,
    /// `X-Remote-Extra-*`.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a user asks to do: `get` of a subresource of one controller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ask {
    /// `wasmcontrollers` or `clusterwasmcontrollers`.
    pub resource: &'static str,
    /// `log`, or another subresource of the table.
    pub subresource: String,
    /// The controller's namespace (`None`: a ClusterWasmController).
    pub namespace: Option<String>,
    /// The controller's name.
    pub name: String,
}

/// The API group of the served subresources.
pub const GROUP: &str = "logs.kubewasm.dev";

/// SubjectAccessReviews, with their answers kept briefly.
pub struct Reviews {
    client: kube::Client,
    answers: Mutex<HashMap<(User, Ask), (bool, Instant)>>,
}

impl Reviews {
    /// Reviews made with `client` (the runtime's, bound to `system:auth-delegator`).
    pub fn new(client: kube::Client) -> Arc<Reviews> {
        Arc::new(Reviews {
            client,
            answers: Mutex::default(),
        })
    }

    /// Whether RBAC lets `user` do `ask`; an error when the review could not be made.
    pub async fn allowed(&self, user: &User, ask: &Ask) -> Result<bool, kube::Error> {
        let key = (user.clone(), ask.clone());
        if let Some((allowed, at)) = self.answers.locked().get(&key)
            && at.elapsed() < REVIEW_TTL
        {
            return Ok(*allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(GROUP.into()),
                    resource: Some(ask.resource.into()),
                    subresource: Some(ask.subresource.clone()),
                    verb: Some("get".into()),
                    namespace: ask.namespace.clone(),
                    name: Some(ask.name.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api = kube::Api::<SubjectAccessReview>::all(self.client.clone());
        let answer = api.create(&PostParams::default(), &review).await?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let mut answers = self.answers.locked();
        if answers.len() >= MAX_REVIEWS {
            answers.clear();
        }
        answers.insert(key, (allowed, Instant::now()));
        Ok(allowed)
    }
}

/// The subject's common name of a DER certificate (already verified by rustls): the first
/// `2.5.4.3` attribute of the TBS certificate's subject.
fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, certificate, _) = tlv(cert.as_ref())?;
    let (_, mut tbs, _) = tlv(certificate)?;
    // [0] version (optional), serial, signature algorithm, issuer, validity, subject.
    let (tag, _, rest) = tlv(tbs)?;
    let mut skip = if tag == 0xa0 { 4 } else { 3 };
    tbs = rest;
    while skip > 0 {
        tbs = tlv(tbs)?.2;
        skip -= 1;
    }
    let (_, mut subject, _) = tlv(tbs)?;
    while !subject.is_empty() {
        let (_, set, rest) = tlv(subject)?;
        subject = rest;
        let (_, attribute, _) = tlv(set)?;
        let (_, oid, value) = tlv(attribute)?;
        if oid == [0x55, 0x04, 0x03] {
            let (_, text, _) = tlv(value)?;
            return std::str::from_utf8(text).ok().map(str::to_owned);
        }
    }
    None
}

/// One DER tag-length-value: its tag, its contents and what follows it.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b))
    };
    if rest.len() < len {
        return None;
    }
    let (contents, after) = rest.split_at(len);
    Some((tag, contents, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_common_name_is_read_from_a_certificate() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "kubewasm");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "front-proxy-client");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(
            common_name(cert.der()).as_deref(),
            Some("front-proxy-client")
        );
        assert_eq!(common_name(&CertificateDer::from(vec![0x30, 0x85])), None);
        assert_eq!(common_name(&CertificateDer::from(vec![])), None);
    }

    #[test]
    fn the_user_is_read_from_the_front_proxy_headers() {
        let proxy = FrontProxy {
            ca_pem: String::new(),
            allowed_names: vec!["front-proxy-client".into()],
            user_headers: vec!["X-Remote-User".into()],
            group_headers: vec!["X-Remote-Group".into()],
            extra_prefixes: vec!["X-Remote-Extra-".into()],
        };
        let mut headers = HeaderMap::new();
        assert_eq!(proxy.user(&headers), None);
        headers.insert("x-remote-user", "alice".parse().unwrap());
        headers.append("x-remote-group", "team-x".parse().unwrap());
        headers.append("x-remote-group", "system:authenticated".parse().unwrap());
        headers.append("x-remote-extra-scopes", "a".parse().unwrap());
        let user = proxy.user(&headers).unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["system:authenticated", "team-x"]);
        assert_eq!(user.extra["scopes"], ["a"]);
    }
}
