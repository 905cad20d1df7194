//! What a controller's ServiceAccount may read, asked of the API server itself
//! (SubjectAccessReview) and remembered for a while.
//!
//! Guests read from the runtime's shared caches, which the runtime fills with its own
//! identity; so before a controller is handed any object of a kind — as its parent, its
//! children or through a read grant — the runtime asks whether the controller's
//! ServiceAccount may `get`, `list` and `watch` that kind where the controller acts. A
//! controller missing any of them does not run, and its status names the missing rules and
//! the `kubectl` commands that add them. Answers are cached for a TTL, so reconciles cost no
//! API call and a refused controller is asked about again at most once per TTL.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::controller::Kind;

/// The verbs a controller's ServiceAccount needs on every kind it is handed.
pub const READ_VERBS: [&str; 3] = ["get", "list", "watch"];

/// A controller's ServiceAccount.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceAccount {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl ServiceAccount {
    /// The user name the API server knows it by.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }

    /// The groups every ServiceAccount of its namespace is in.
    pub fn groups(&self) -> Vec<String> {
        vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{}", self.namespace),
            "system:authenticated".into(),
        ]
    }
}

/// Reads a ServiceAccount lacks, with the commands that would grant them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct MissingReads {
    account: ServiceAccount,
    /// `None`: cluster-wide (a ClusterWasmController).
    namespace: Option<String>,
    /// The controller's name, to name the Role in the fix.
    controller: String,
    /// resource (`pods`, `helloworlds.example.com`) -> missing verbs.
    missing: BTreeMap<String, Vec<&'static str>>,
}

impl MissingReads {
    /// The resources (`plural.group`) and verbs missing.
    pub fn missing(&self) -> &BTreeMap<String, Vec<&'static str>> {
        &self.missing
    }

    fn message(&self) -> String {
        let sa = &self.account;
        let what: Vec<String> = self
            .missing
            .iter()
            .map(|(r, verbs)| format!("{} {r}", verbs.join("/")))
            .collect();
        let resources: Vec<&str> = self.missing.keys().map(String::as_str).collect();
        let role = format!("kubewasm-reads-{}", self.controller);
        let verbs = READ_VERBS.join(",");
        let (scope, fix) = match &self.namespace {
            Some(ns) => (
                format!("in namespace {ns}"),
                format!(
                    "kubectl -n {ns} create role {role} --verb={verbs} --resource={res} && kubectl -n {ns} create rolebinding {role} --role={role} --serviceaccount={}:{}",
                    sa.namespace,
                    sa.name,
                    res = resources.join(",")
                ),
            ),
            None => (
                "cluster-wide".to_owned(),
                format!(
                    "kubectl create clusterrole {role} --verb={verbs} --resource={res} && kubectl create clusterrolebinding {role} --clusterrole={role} --serviceaccount={}:{}",
                    sa.namespace,
                    sa.name,
                    res = resources.join(",")
                ),
            ),
        };
        format!(
            "ServiceAccount {}/{} may not {} {scope}, and the controller is handed objects of those kinds; grant them with: {fix}",
            sa.namespace,
            sa.name,
            what.join(", ")
        )
    }
}

/// Why the API server could not be asked.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot ask the API server what ServiceAccount {account} may read (SubjectAccessReview): {source}; the runtime's own identity needs `create subjectaccessreviews` (deploy/runtime/rbac.yaml)"
)]
pub struct ReviewFailed {
    account: String,
    #[source]
    source: kube::Error,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Question {
    user: String,
    verb: &'static str,
    group: String,
    resource: String,
    namespace: Option<String>,
}

/// Asks SubjectAccessReviews and caches the answers for a TTL.
pub struct AccessReviews {
    client: Client,
    ttl: Duration,
    answers: Mutex<Answers>,
}

/// Answers and when they were given. Expired ones are dropped at most once per TTL, not at
/// every answer: a thousand controllers starting ask thousands of questions, and scanning
/// every answer at each one made starting them quadratic.
struct Answers {
    given: HashMap<Question, (bool, Instant)>,
    pruned: Instant,
}

/// `plural.group` as `kubectl create role --resource` takes it.
fn resource_name(kind: &Kind) -> String {
    let r = &kind.resource;
    if r.group.is_empty() {
        r.plural.clone()
    } else {
        format!("{}.{}", r.plural, r.group)
    }
}

impl AccessReviews {
    /// Reviews asked with `client` (the runtime's identity), answers kept for `ttl`.
    pub fn new(client: Client, ttl: Duration) -> Self {
        AccessReviews {
            client,
            ttl,
            answers: Mutex::new(Answers {
                given: HashMap::new(),
                pruned: Instant::now(),
            }),
        }
    }

    /// Checks that `account` may get, list and watch every kind in `kinds` in `namespace`
    /// (`None`: in every namespace). `Ok(Err(_))` names what is missing.
    pub async fn check_reads(
        &self,
        controller: &str,
        account: &ServiceAccount,
        namespace: Option<&str>,
        kinds: &[&Kind],
    ) -> Result<Result<(), MissingReads>, ReviewFailed> {
        let mut missing: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
        for kind in kinds {
            for verb in READ_VERBS {
                let question = Question {
                    user: account.user(),
                    verb,
                    group: kind.resource.group.clone(),
                    resource: kind.resource.plural.clone(),
                    namespace: namespace.filter(|_| kind.namespaced).map(str::to_owned),
                };
                if !self.allowed(&question, account).await? {
                    let verbs = missing.entry(resource_name(kind)).or_default();
                    if !verbs.contains(&verb) {
                        verbs.push(verb);
                    }
                }
            }
        }
        if missing.is_empty() {
            return Ok(Ok(()));
        }
        Ok(Err(MissingReads {
            account: account.clone(),
            namespace: namespace.map(str::to_owned),
            controller: controller
                .rsplit('/')
                .next()
                .unwrap_or(controller)
                .to_owned(),
            missing,
        }))
    }

    async fn allowed(
        &self,
        question: &Question,
        account: &ServiceAccount,
    ) -> Result<bool, ReviewFailed> {
        {
            let answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((allowed, at)) = answers.given.get(question)
                && at.elapsed() < self.ttl
            {
                return Ok(*allowed);
            }
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(question.user.clone()),
                groups: Some(account.groups()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: question.namespace.clone(),
                    verb: Some(question.verb.to_owned()),
                    group: Some(question.group.clone()),
                    resource: Some(question.resource.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|source| ReviewFailed {
                account: format!("{}/{}", account.namespace, account.name),
                source,
            })?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if now.duration_since(answers.pruned) >= self.ttl {
            let ttl = self.ttl;
            answers
                .given
                .retain(|_, (_, at)| now.duration_since(*at) < ttl);
            answers.pruned = now;
        }
        answers.given.insert(question.clone(), (allowed, now));
        Ok(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_reads_say_what_and_how_to_grant_it() {
        let missing = MissingReads {
            account: ServiceAccount {
                namespace: "team-a".into(),
                name: "prober".into(),
            },
            namespace: Some("team-a".into()),
            controller: "probes".into(),
            missing: BTreeMap::from([
                ("configmaps".to_owned(), vec!["get", "list", "watch"]),
                ("helloworlds.example.com".to_owned(), vec!["watch"]),
            ]),
        };
        let text = missing.to_string();
        assert!(
            text.contains("ServiceAccount team-a/prober may not get/list/watch configmaps, watch helloworlds.example.com in namespace team-a"),
            "{text}"
        );
        assert!(
            text.contains("kubectl -n team-a create role kubewasm-reads-probes --verb=get,list,watch --resource=configmaps,helloworlds.example.com && kubectl -n team-a create rolebinding kubewasm-reads-probes --role=kubewasm-reads-probes --serviceaccount=team-a:prober"),
            "{text}"
        );
        let cluster = MissingReads {
            namespace: None,
            ..missing
        };
        assert!(
            cluster
                .to_string()
                .contains("watch helloworlds.example.com cluster-wide, and the controller is handed objects of those kinds; grant them with: kubectl create clusterrole kubewasm-reads-probes"),
            "{cluster}"
        );
    }
}
