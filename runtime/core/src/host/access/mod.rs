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
//!
//! In a namespace, the runtime first asks for the ServiceAccount's rules there, once
//! (a SelfSubjectRulesReview made as the ServiceAccount, by impersonation) instead of one
//! SubjectAccessReview per kind and verb: a thousand controllers starting asked six thousand
//! reviews. The rules only ever *allow*, and only when the API server says they are complete:
//! an authorizer that cannot list its rules (a webhook, the only kind that can deny) makes
//! them incomplete, and then every question goes to a SubjectAccessReview as before. So does
//! every question the rules do not allow: a refusal always comes from a SubjectAccessReview,
//! and its message is the same as before.
//!
//! That rules review is made by impersonation, which the API server authorizes before it
//! answers; so, answered, it also proves that the runtime may act as the ServiceAccount
//! ([`AccessReviews::may_act_as`]): a controller's start asks one review of the API server,
//! not a SelfSubjectAccessReview and then a rules review.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, ResourceRule, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::controller::Kind;
use crate::sync::Locks as _;

mod opt_ins;
mod rules;
pub use opt_ins::OptIns;
pub use rules::{GUEST_EVENTS_ROLE, NeededRules, events_binding_command};

/// The verbs a controller's ServiceAccount needs on every kind it is handed.
pub const READ_VERBS: [&str; 3] = ["get", "list", "watch"];

/// A controller's ServiceAccount.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceAccount {
    pub namespace: String,
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
    /// Everything the controller's spec needs, reads and writes: what the fix grants.
    needed: NeededRules,
    /// How often the runtime asks again (`--access-review-seconds`).
    every: Duration,
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
        let scope = match &self.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "cluster-wide".to_owned(),
        };
        let role = format!("kubewasm-{}", self.controller);
        let fix = self
            .needed
            .apply_command(&role, self.namespace.as_deref(), sa);
        format!(
            "ServiceAccount {}/{} may not {} {scope}, and the controller is handed objects of those kinds; grant everything its spec needs (reads, and the writes it declares) with: {fix} — the runtime asks again every {} s (--access-review-seconds) and starts the controller by itself once allowed",
            sa.namespace,
            sa.name,
            what.join(", "),
            self.every.as_secs().max(1)
        )
    }
}

/// Why the API server could not be asked.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot ask the API server what ServiceAccount {account} may read (SubjectAccessReview), or whether its namespace and itself opted in: {source}; the runtime's own identity needs `create subjectaccessreviews`, `get namespaces` and `get serviceaccounts` (deploy/runtime/rbac.yaml): a cluster admin applies it"
)]
pub struct ReviewFailed {
    account: String,
    #[source]
    source: kube::Error,
}

impl ReviewFailed {
    /// A failed review (or read) about `account`.
    fn about(account: &ServiceAccount) -> impl FnOnce(kube::Error) -> ReviewFailed + '_ {
        move |source| ReviewFailed {
            account: format!("{}/{}", account.namespace, account.name),
            source,
        }
    }
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
    asked: Mutex<Asked>,
    /// The watch of ServiceAccounts' opt-ins, once the manager has started it.
    opt_ins: std::sync::OnceLock<OptIns>,
    /// The watch of Namespaces' label, once the manager has started it.
    namespaces: std::sync::OnceLock<OptIns>,
}

/// How many reviews were sent to the API server so far, of each kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Asked {
    /// SelfSubjectRulesReviews (one per ServiceAccount and namespace per TTL).
    pub rules: u64,
    /// SubjectAccessReviews (one per question the rules did not allow).
    pub access: u64,
    /// SelfSubjectAccessReviews of whether the runtime may impersonate a ServiceAccount: only
    /// when the rules review made as it (which proves it may) was refused or failed.
    pub impersonation: u64,
    /// ServiceAccounts read for their opt-in: only when the watch of opt-ins
    /// ([`AccessReviews::watch_opt_ins`]) did not say yes.
    pub accounts: u64,
    /// Namespaces read for their label: only when the watch of Namespaces
    /// ([`AccessReviews::watch_namespaces`]) did not say yes.
    pub namespaces: u64,
}

/// Answers and when they were given. Expired ones are dropped at most once per TTL, not at
/// every answer: a thousand controllers starting ask thousands of questions, and scanning
/// every answer at each one made starting them quadratic.
struct Answers {
    given: HashMap<Question, (bool, Instant)>,
    /// (user, namespace) -> the rules there, `None` when they could not be had complete.
    rules: HashMap<(String, String), (Option<Rules>, Instant)>,
    /// ServiceAccount user -> whether the runtime may act as it.
    acting: HashMap<String, (Acting, Instant)>,
    pruned: Instant,
}

impl Answers {
    fn prune(&mut self, ttl: Duration) {
        let now = Instant::now();
        if now.duration_since(self.pruned) >= ttl {
            self.given
                .retain(|_, (_, at)| now.duration_since(*at) < ttl);
            self.rules
                .retain(|_, (_, at)| now.duration_since(*at) < ttl);
            self.acting
                .retain(|_, (_, at)| now.duration_since(*at) < ttl);
            self.pruned = now;
        }
    }
}

/// The annotation with which a ServiceAccount's owner lets WasmControllers act as it.
pub const SERVICE_ACCOUNT_OPT_IN: &str = "kubewasm.dev/wasm-controllers";

/// The Namespace label with which a cluster admin lets a namespace use the runtime (with
/// [`TENANT_LABEL_VALUE`]): a namespace's own admin cannot set it (the built-in `admin` role
/// may not patch Namespaces), so no team enables itself.
pub const TENANT_LABEL: &str = "kubewasm.dev/tenant";

/// The value of [`TENANT_LABEL`] that enables a namespace.
pub const TENANT_LABEL_VALUE: &str = "enabled";

/// Whether the runtime may act as a ServiceAccount: its namespace must be enabled (a label, by
/// a cluster admin) and opted in (a RoleBinding of the runtime, by the namespace's admin or a
/// cluster admin), and the ServiceAccount itself (an annotation, by its owner) too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acting {
    /// All three said yes.
    Allowed,
    /// A cluster admin has not labelled the namespace [`TENANT_LABEL`]`=enabled`.
    NamespaceNotEnabled,
    /// The namespace has not opted in: the runtime may not impersonate its ServiceAccounts.
    NamespaceNotOptedIn,
    /// The ServiceAccount does not exist.
    NoServiceAccount,
    /// The ServiceAccount lacks [`SERVICE_ACCOUNT_OPT_IN`]`: allowed`.
    AccountNotOptedIn,
}

/// A ServiceAccount's rules in one namespace, as a SelfSubjectRulesReview states them.
type Rules = Arc<Vec<ResourceRule>>;

/// Whether one of `rules` (as RBAC and a SelfSubjectRulesReview state them) allows `verb` on
/// every object of `resource` in `group` — a rule that names objects (`resourceNames`) does
/// not.
pub(crate) fn rules_allow(rules: &[ResourceRule], verb: &str, group: &str, resource: &str) -> bool {
    let has = |list: &Option<Vec<String>>, wanted: &str| {
        list.as_deref()
            .unwrap_or_default()
            .iter()
            .any(|item| item == "*" || item == wanted)
    };
    rules.iter().any(|rule| {
        rule.resource_names
            .as_deref()
            .unwrap_or_default()
            .is_empty()
            && rule.verbs.iter().any(|v| v == "*" || v == verb)
            && has(&rule.api_groups, group)
            && has(&rule.resources, resource)
    })
}

/// `plural.group`, as `kubectl` names a resource.
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
                rules: HashMap::new(),
                acting: HashMap::new(),
                pruned: Instant::now(),
            }),
            asked: Mutex::default(),
            opt_ins: std::sync::OnceLock::new(),
            namespaces: std::sync::OnceLock::new(),
        }
    }

    /// From now on, an opt-in the watch `opt_ins` has seen is not read again
    /// ([`opt_ins`](self::opt_ins) says when it is trusted). Set once; later calls are ignored.
    pub fn watch_opt_ins(&self, opt_ins: OptIns) {
        let _ = self.opt_ins.set(opt_ins);
    }

    /// From now on, a namespace the watch `namespaces` ([`OptIns::watch_namespaces`]) has
    /// seen enabled is not read again. Set once; later calls are ignored.
    pub fn watch_namespaces(&self, namespaces: OptIns) {
        let _ = self.namespaces.set(namespaces);
    }

    /// Whether a cluster admin enabled `namespace` ([`TENANT_LABEL`]): from the watch when it
    /// says yes, else read.
    async fn namespace_enabled(&self, account: &ServiceAccount) -> Result<bool, ReviewFailed> {
        let ns = &account.namespace;
        if self.namespaces.get().is_some_and(|w| w.enabled(ns)) {
            return Ok(true);
        }
        self.count(|a| a.namespaces += 1);
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let found = namespaces
            .get_metadata_opt(ns)
            .await
            .map_err(ReviewFailed::about(account))?;
        Ok(found.is_some_and(|n| opt_ins::enabled(&n.metadata)))
    }

    /// The reviews sent so far.
    pub fn asked(&self) -> Asked {
        *self.asked.locked()
    }

    fn count(&self, add: impl FnOnce(&mut Asked)) {
        add(&mut self.asked.locked());
    }

    /// Whether the runtime may act as `account`: a cluster admin enabled its namespace
    /// ([`TENANT_LABEL`]), the runtime may impersonate it, which the namespace grants
    /// (`deploy/runtime/tenant.yaml`; asked of the API server about the runtime itself), and
    /// the account's owner allowed it ([`SERVICE_ACCOUNT_OPT_IN`]: a
    /// WasmController may name any ServiceAccount of its namespace, and one that never opted in
    /// — a deployer with broad rights — must not lend them). Answers are kept for the TTL.
    pub async fn may_act_as(&self, account: &ServiceAccount) -> Result<Acting, ReviewFailed> {
        let user = account.user();
        {
            let answers = self.answers.locked();
            if let Some((allowed, at)) = answers.acting.get(&user)
                && at.elapsed() < self.ttl
            {
                return Ok(*allowed);
            }
        }
        // The cluster admin's decision first: nothing is asked about an account of a namespace
        // that may not use the runtime.
        if !self.namespace_enabled(account).await? {
            let mut answers = self.answers.locked();
            answers.prune(self.ttl);
            answers
                .acting
                .insert(user, (Acting::NamespaceNotEnabled, Instant::now()));
            return Ok(Acting::NamespaceNotEnabled);
        }
        // The rules review made as the account is itself an impersonation, which the API
        // server authorizes before it answers: answered, the runtime may act as the account
        // (and its rules in the account's namespace are kept for `check_reads`: one review
        // instead of two). Refused or failed, a SelfSubjectAccessReview says whether the
        // runtime may impersonate it (a refusal's wording is no contract to parse).
        let impersonates = match self.ask_rules(&user, &account.namespace).await {
            Ok(review) => {
                self.keep_rules((user.clone(), account.namespace.clone()), review);
                true
            }
            Err(_) => self.may_impersonate(account).await?,
        };
        let acting = if !impersonates {
            Acting::NamespaceNotOptedIn
        } else if self.opt_ins.get().is_some_and(|w| w.opted_in(account)) {
            Acting::Allowed
        } else {
            self.count(|a| a.accounts += 1);
            let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                Api::namespaced(self.client.clone(), &account.namespace);
            let found = accounts
                .get_opt(&account.name)
                .await
                .map_err(ReviewFailed::about(account))?;
            match found {
                None => Acting::NoServiceAccount,
                Some(sa) => {
                    if opt_ins::opted_in(&sa.metadata) {
                        Acting::Allowed
                    } else {
                        Acting::AccountNotOptedIn
                    }
                }
            }
        };
        let mut answers = self.answers.locked();
        answers.prune(self.ttl);
        answers.acting.insert(user, (acting, Instant::now()));
        Ok(acting)
    }

    /// Whether the runtime may impersonate `account` (a SelfSubjectAccessReview).
    async fn may_impersonate(&self, account: &ServiceAccount) -> Result<bool, ReviewFailed> {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(account.namespace.clone()),
                    verb: Some("impersonate".to_owned()),
                    group: Some(String::new()),
                    resource: Some("serviceaccounts".to_owned()),
                    name: Some(account.name.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        self.count(|a| a.impersonation += 1);
        let answer = Api::<SelfSubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(ReviewFailed::about(account))?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }

    /// Checks that `account` may get, list and watch every kind in `kinds` in `namespace`
    /// (`None`: in every namespace). `Ok(Err(_))` names what is missing.
    pub async fn check_reads(
        &self,
        controller: &str,
        account: &ServiceAccount,
        namespace: Option<&str>,
        kinds: &[&Kind],
        needed: &NeededRules,
    ) -> Result<Result<(), MissingReads>, ReviewFailed> {
        let rules = match namespace {
            Some(ns) => self.rules(account, ns).await,
            None => None,
        };
        let mut missing: BTreeMap<String, Vec<&'static str>> = BTreeMap::new();
        for kind in kinds {
            for verb in READ_VERBS {
                let group = &kind.resource.group;
                if kind.namespaced
                    && rules
                        .as_deref()
                        .is_some_and(|r| rules_allow(r, verb, group, &kind.resource.plural))
                {
                    continue;
                }
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
            needed: needed.clone(),
            every: self.ttl,
        }))
    }

    async fn allowed(
        &self,
        question: &Question,
        account: &ServiceAccount,
    ) -> Result<bool, ReviewFailed> {
        {
            let answers = self.answers.locked();
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
        self.count(|a| a.access += 1);
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(ReviewFailed::about(account))?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let mut answers = self.answers.locked();
        answers.prune(self.ttl);
        answers
            .given
            .insert(question.clone(), (allowed, Instant::now()));
        Ok(allowed)
    }

    /// `account`'s rules in `namespace` when the API server can state them completely
    /// (cached for the TTL); `None` otherwise — then every question is a
    /// SubjectAccessReview. Never an error: a failed rules review only costs the fast path.
    async fn rules(&self, account: &ServiceAccount, namespace: &str) -> Option<Rules> {
        let key = (account.user(), namespace.to_owned());
        {
            let answers = self.answers.locked();
            if let Some((rules, at)) = answers.rules.get(&key)
                && at.elapsed() < self.ttl
            {
                return rules.clone();
            }
        }
        match self.ask_rules(&key.0, namespace).await {
            Ok(review) => self.keep_rules(key, review),
            Err(e) => {
                tracing::debug!(
                    user = key.0,
                    namespace,
                    "no SelfSubjectRulesReview ({e}): asking SubjectAccessReviews"
                );
                let mut answers = self.answers.locked();
                answers.prune(self.ttl);
                answers.rules.insert(key, (None, Instant::now()));
                None
            }
        }
    }

    /// Keeps the rules `review` states for `(user, namespace)` for the TTL, when they are
    /// complete (`None` otherwise: then every question is a SubjectAccessReview), and gives
    /// them.
    fn keep_rules(&self, key: (String, String), review: SelfSubjectRulesReview) -> Option<Rules> {
        let rules = match review.status {
            Some(status) if !status.incomplete => Some(Arc::new(status.resource_rules)),
            Some(status) => {
                tracing::debug!(
                    user = key.0,
                    namespace = key.1,
                    "the API server's rules are incomplete ({}): asking SubjectAccessReviews",
                    status.evaluation_error.unwrap_or_default()
                );
                None
            }
            None => None,
        };
        let mut answers = self.answers.locked();
        answers.prune(self.ttl);
        answers.rules.insert(key, (rules.clone(), Instant::now()));
        rules
    }

    /// A SelfSubjectRulesReview made as `user` (the runtime may impersonate ServiceAccounts:
    /// it writes as them), on the runtime's own connection.
    async fn ask_rules(
        &self,
        user: &str,
        namespace: &str,
    ) -> Result<SelfSubjectRulesReview, kube::Error> {
        let review = SelfSubjectRulesReview {
            spec: SelfSubjectRulesReviewSpec {
                namespace: Some(namespace.to_owned()),
            },
            ..SelfSubjectRulesReview::default()
        };
        let body = serde_json::to_vec(&review).map_err(kube::Error::SerdeError)?;
        self.count(|a| a.rules += 1);
        let request = http::Request::post("/apis/authorization.k8s.io/v1/selfsubjectrulesreviews")
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("Impersonate-User", user)
            .body(body)
            .map_err(kube::Error::HttpError)?;
        self.client.request(request).await
    }
}

#[cfg(test)]
mod tests;
