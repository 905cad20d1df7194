//! Starting a controller: the operator's rules, the declared kinds resolved, the
//! ServiceAccount's read permissions reviewed, then the watches and the runner's setup.
//! Resolve, then authorize, then act.

use std::sync::Arc;

use futures::StreamExt;
use kubewasm_guest_sdk::query::{self, GroupVersion};

use crate::api::{Reason, Verb, WasmControllerSpec};
use crate::controller::{Kind, ResolveError, WriteGate};
use crate::host::{
    Acting, CacheSource, ChildKind, ControllerSetup, DeclaredKinds, Finalizer, GuestState,
    NeededRules, Permissions, SERVICE_ACCOUNT_OPT_IN, ServiceAccount, TENANT_LABEL,
    TENANT_LABEL_VALUE,
};

use super::{ControllerId, Manager, Problem};

/// Most kinds one controller may declare (parent, children and grants together).
pub const MAX_DECLARED_KINDS: usize = 32;

impl Manager {
    pub(super) async fn setup(
        &self,
        id: &ControllerId,
        spec: &WasmControllerSpec,
        state: Arc<GuestState>,
    ) -> Result<(ControllerSetup, ReadAccess), Problem> {
        let finalizer = Finalizer::for_controller(id.namespace.is_some(), &id.name);
        if spec.finalize
            && let Err(why) = &finalizer
        {
            return Err(Problem::new(Reason::InvalidSpec, why.clone()));
        }
        let asked = spec
            .limits
            .resolve()
            .map_err(|m| Problem::new(Reason::InvalidSpec, m))?;
        let (run, clamped) = self.config.caps.apply(asked);
        let (limits, concurrency) = (crate::host::call_limits(&run.limits), run.concurrency);
        let parent_selector = spec
            .parent
            .selector()
            .map_err(|e| Problem::new(Reason::InvalidSpec, e))?;
        // Every declared kind costs a discovery, a watch and three access reviews: bounded.
        let declared_kinds = 1 + spec.children.len() + spec.grants.len();
        if declared_kinds > MAX_DECLARED_KINDS {
            return Err(Problem::new(
                Reason::InvalidSpec,
                format!(
                    "the spec declares {declared_kinds} kinds (parent, children and grants); at most {MAX_DECLARED_KINDS} are allowed: split the controller"
                ),
            ));
        }
        // Parsed before anything else sees them: every apiVersion and kind the spec names
        // becomes part of a discovery URL, a cache key and an allowlist match.
        validate_declarations(spec)?;
        // The guest's saved states, read before its first reconcile (once per controller).
        state
            .load()
            .await
            .map_err(|e| Problem::new(Reason::StateUnavailable, e.to_string()))?;
        // The operator's rules come first: nothing is looked up for a kind it does not allow.
        for (field, api_version, kind) in readable_declarations(spec) {
            if !self.config.watchable.allows(api_version, kind) {
                return Err(Problem::new(
                    Reason::NotWatchable,
                    format!(
                        "{field} names {kind} ({api_version}), which this runtime does not let controllers watch or read (its operator's `kubewasm run --watchable-kinds {}`); remove it from the spec or ask the operator",
                        self.config.watchable
                    ),
                ));
            }
        }
        // Resolve every declared kind (and only those): scope is known before any check.
        let mut kinds = DeclaredKinds::default();
        let declared = std::iter::once((&spec.parent.api_version, &spec.parent.kind))
            .chain(spec.children.iter().map(|c| (&c.api_version, &c.kind)))
            .chain(spec.grants.iter().map(|g| (&g.api_version, &g.kind)));
        for (api_version, kind) in declared {
            let resolved = self.resolver.resolve(api_version, kind).await.map_err(|e| match e {
                ResolveError::Invalid(e) => Problem::new(Reason::InvalidSpec, e.to_string()),
                ResolveError::TimedOut => Problem::new(Reason::KindNotFound,
                    format!("looking up {kind} ({api_version}): {e}; retrying"),
                ),
                ResolveError::Api(e) => Problem::new(Reason::KindNotFound,
                    format!("the API server does not serve {kind} ({api_version}): {e}; apply its CustomResourceDefinition"),
                ),
            })?;
            if resolved.resource.api_version != *api_version || resolved.resource.kind != *kind {
                return Err(Problem::new(
                    Reason::KindNotFound,
                    format!(
                        "the API server answered {} ({}) for {kind} ({api_version}): name the kind as the API server serves it",
                        resolved.resource.kind, resolved.resource.api_version
                    ),
                ));
            }
            if id.namespace.is_some() && !resolved.namespaced {
                return Err(Problem::new(
                    Reason::InvalidSpec,
                    format!(
                        "{kind} ({api_version}) is cluster-scoped, and a WasmController acts only in its own namespace; remove it from the spec, or ask a cluster admin for a ClusterWasmController"
                    ),
                ));
            }
            kinds.insert(resolved);
        }
        // Every declared kind was resolved above, under the name the spec gives it.
        let kind_of = |api_version: &str, kind: &str| {
            kinds.get(api_version, kind).cloned().ok_or_else(|| {
                Problem::new(
                    Reason::InternalError,
                    format!("{kind} ({api_version}) was not resolved"),
                )
            })
        };
        // Authorize: the ServiceAccount must be allowed to read whatever it will be handed.
        let access = ReadAccess {
            clamped,
            account: service_account(id, spec)?,
            kinds: readable_declarations(spec)
                .map(|(_, api_version, kind)| kind_of(api_version, kind))
                .collect::<Result<_, _>>()?,
            needed: needed_rules(spec, &kind_of)?,
        };
        self.check_access(id, &access).await?;

        let parent_kind = kind_of(&spec.parent.api_version, &spec.parent.kind)?;
        let parent = self.watches.watch(&parent_kind);
        let mut children = Vec::new();
        let mut readable = vec![parent.clone()];
        for c in &spec.children {
            let watch = self.watches.watch(&kind_of(&c.api_version, &c.kind)?);
            readable.push(watch.clone());
            children.push((
                ChildKind {
                    kind: watch.kind().clone(),
                    strategy: c.update_strategy,
                },
                watch,
            ));
        }
        for g in spec.grants.iter().filter(|g| g.verbs.iter().any(is_read)) {
            readable.push(self.watches.watch(&kind_of(&g.api_version, &g.kind)?));
        }
        let client = self
            .impersonating(&access.account.namespace, &access.account.name)
            .map_err(|e| Problem::new(Reason::ClientError, e.to_string()))?;
        let setup = ControllerSetup {
            id: id.to_string(),
            namespace: id.namespace.clone(),
            parent,
            parent_selector,
            children,
            reads: CacheSource::new(readable),
            permissions: Arc::new(Permissions::from_spec(
                &id.to_string(),
                id.namespace.as_deref(),
                spec,
            )),
            limits,
            concurrency,
            resync: spec.resync_period(),
            requeue_floor: self.config.requeue_floor,
            writes: WriteGate::new(
                self.writes.lane(
                    id.namespace.as_deref().unwrap_or_default(),
                    &id.to_string(),
                    self.metrics.api_requests(&id.to_string()),
                ),
                self.fence_of(id),
            ),
            client,
            kinds,
            sandbox: self.sandbox.clone(),
            metrics: self.metrics.clone(),
            state,
            finalizer: finalizer.ok(),
            finalize: spec.finalize,
            capsules: self.capsules.open(
                &id.to_string(),
                id.namespace.as_deref(),
                spec.module.clone(),
                limits,
            ),
        };
        Ok((setup, access))
    }

    /// A client that acts as the ServiceAccount (impersonation), so RBAC judges every write.
    /// No groups are named: the API server gives an impersonated ServiceAccount its own, and
    /// the runtime needs `impersonate` on `serviceaccounts` only, not on `groups`.
    pub(super) fn impersonating(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<kube::Client, kube::Error> {
        let mut config = self.base_config.clone();
        config.auth_info.impersonate = Some(format!("system:serviceaccount:{namespace}:{name}"));
        kube::Client::try_from(config)
    }

    /// Whether the runtime may still act as the controller's ServiceAccount (its namespace
    /// opted in), and the ServiceAccount may still read what it is handed.
    async fn check_access(&self, id: &ControllerId, access: &ReadAccess) -> Result<(), Problem> {
        self.check_acting(&access.account).await?;
        let kinds: Vec<&Kind> = access.kinds.iter().collect();
        match self
            .access
            .check_reads(
                &id.name,
                &access.account,
                id.namespace.as_deref(),
                &kinds,
                &access.needed,
            )
            .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(missing)) => Err(Problem::new(Reason::Forbidden, missing.to_string())),
            Err(failed) => Err(Problem::new(Reason::AccessReviewFailed, failed.to_string())),
        }
    }

    /// Whether the runtime may act as `account` (its namespace and the account opted in):
    /// before anything is done as it (a controller's setup, reading its image pull secret).
    pub(super) async fn check_acting(&self, account: &ServiceAccount) -> Result<(), Problem> {
        match self.access.may_act_as(account).await {
            Ok(acting) => match refusal(acting, account) {
                None => Ok(()),
                Some(why) => Err(Problem::new(Reason::Forbidden, why)),
            },
            Err(failed) => Err(Problem::new(Reason::AccessReviewFailed, failed.to_string())),
        }
    }

    /// Stops running controllers whose ServiceAccount lost a read they need; they start
    /// again by themselves (on the retry timer) once RBAC allows it.
    pub(super) async fn recheck_access(&mut self) {
        let running: Vec<(ControllerId, ReadAccess)> = self
            .controllers
            .iter()
            .filter_map(|(id, m)| Some((id.clone(), m.life.access()?.clone())))
            .collect();
        let this = &*self;
        let lost: Vec<(ControllerId, Problem)> = futures::stream::iter(running)
            .map(|(id, access)| async move {
                let checked = this.check_access(&id, &access).await;
                (id, checked)
            })
            .buffer_unordered(super::PARALLEL_STARTS)
            .filter_map(|(id, checked)| async move { checked.err().map(|p| (id, p)) })
            .collect()
            .await;
        for (id, problem) in lost {
            tracing::warn!(controller = %id, reason = %problem.reason, "stopping the controller: {}", problem.message);
            self.stop(&id).await;
            if let Some(m) = self.controllers.get_mut(&id) {
                m.life.refuse(problem);
            }
        }
        self.watches.release_unused();
    }
}

/// Why the runtime may not act as `account`, naming who acts and the exact command; `None`
/// when it may.
fn refusal(acting: Acting, account: &ServiceAccount) -> Option<String> {
    let (ns, name) = (&account.namespace, &account.name);
    Some(match acting {
        Acting::Allowed => return None,
        Acting::NamespaceNotEnabled => format!(
            "namespace {ns} may not use this kubewasm runtime: which namespaces may is a cluster admin's decision (a namespace's own admin cannot make it); a cluster admin enables it with `kubectl label namespace {ns} {TENANT_LABEL}={TENANT_LABEL_VALUE}`, and the controller starts by itself (if the namespace's admin has not yet let the runtime act as its ServiceAccounts, it does so too: `{}`)",
            tenant_binding_command(ns)
        ),
        Acting::NamespaceNotOptedIn => format!(
            "this runtime may not act as ServiceAccount {ns}/{name}: namespace {ns} has no RoleBinding of the runtime to ClusterRole kubewasm-runtime-tenant; the namespace's admin applies it with `{}` (the same as kubewasm's deploy/runtime/tenant.yaml)",
            tenant_binding_command(ns)
        ),
        Acting::NoServiceAccount => format!(
            "ServiceAccount {ns}/{name} (spec.serviceAccountName) does not exist: the namespace's admin creates it (`kubectl -n {ns} create serviceaccount {name}`), gives it the Role the controller needs, and annotates it `{SERVICE_ACCOUNT_OPT_IN}=allowed`"
        ),
        Acting::AccountNotOptedIn => format!(
            "ServiceAccount {ns}/{name} has not opted in to being used by WasmControllers: its owner (the namespace's admin) allows it with `kubectl -n {ns} annotate serviceaccount {name} {SERVICE_ACCOUNT_OPT_IN}=allowed`"
        ),
    })
}

/// The namespace's consent that the installed runtime acts as its ServiceAccounts
/// (deploy/runtime/tenant.yaml), as one command.
fn tenant_binding_command(ns: &str) -> String {
    format!(
        "kubectl -n {ns} create rolebinding kubewasm-runtime-tenant --clusterrole=kubewasm-runtime-tenant --serviceaccount=kubewasm-system:kubewasm"
    )
}

/// What a running controller's ServiceAccount must keep being allowed to read.
#[derive(Debug, Clone)]
pub(super) struct ReadAccess {
    /// What the operator's caps changed in the spec's limits, for the status.
    pub(super) clamped: Vec<String>,
    /// The ServiceAccount it acts as.
    pub(super) account: ServiceAccount,
    kinds: Vec<Kind>,
    /// The RBAC rules the spec needs, for the fix a refusal names.
    needed: NeededRules,
}

#[cfg(test)]
impl ReadAccess {
    /// A controller allowed to read nothing, clamped in nothing (a test of its life).
    pub(super) fn nothing(account: ServiceAccount) -> ReadAccess {
        ReadAccess {
            clamped: Vec::new(),
            account,
            kinds: Vec::new(),
            needed: NeededRules::default(),
        }
    }
}

/// The RBAC rules a spec needs of its ServiceAccount: the parent read and patched (applying
/// itself, finalizers) with its status; children read, created, patched and deleted; each
/// grant's verbs (a read: get, list, watch — the controller is handed a watch's objects; apply:
/// create and patch, server-side apply; delete: delete, and list for delete-all-of); Events.
fn needed_rules(
    spec: &WasmControllerSpec,
    kind_of: &dyn Fn(&str, &str) -> Result<Kind, Problem>,
) -> Result<NeededRules, Problem> {
    const READ: [&str; 3] = ["get", "list", "watch"];
    let mut needed = NeededRules::default();
    let parent = kind_of(&spec.parent.api_version, &spec.parent.kind)?;
    needed.add_kind(&parent, &["get", "list", "watch", "patch"]);
    if parent.has_status {
        let status = format!("{}/status", parent.resource.plural);
        needed.add(&parent.resource.group, &status, &["patch"]);
    }
    for c in &spec.children {
        let child = kind_of(&c.api_version, &c.kind)?;
        needed.add_kind(
            &child,
            &["get", "list", "watch", "create", "patch", "delete"],
        );
    }
    for g in &spec.grants {
        let kind = kind_of(&g.api_version, &g.kind)?;
        for verb in &g.verbs {
            let rbac: &[&'static str] = match verb {
                Verb::Get | Verb::List => &READ,
                Verb::Apply => &["create", "patch"],
                Verb::Delete => &["delete", "list"],
            };
            needed.add_kind(&kind, rbac);
        }
    }
    needed.add_events();
    Ok(needed)
}

fn is_read(verb: &Verb) -> bool {
    matches!(verb, Verb::Get | Verb::List)
}

/// The kinds a controller is handed objects of: parent, children, read grants (with the
/// field that declares each, for messages).
fn readable_declarations(
    spec: &WasmControllerSpec,
) -> impl Iterator<Item = (&'static str, &str, &str)> {
    std::iter::once((
        "spec.parent",
        spec.parent.api_version.as_str(),
        spec.parent.kind.as_str(),
    ))
    .chain(
        spec.children
            .iter()
            .map(|c| ("spec.children", c.api_version.as_str(), c.kind.as_str())),
    )
    .chain(
        spec.grants
            .iter()
            .filter(|g| g.verbs.iter().any(is_read))
            .map(|g| ("spec.grants", g.api_version.as_str(), g.kind.as_str())),
    )
}

/// Every apiVersion, kind and name a spec declares, checked by the one parser of each (the
/// CRD's schema checks the same patterns; a runtime never trusts that it did).
pub(super) fn validate_declarations(spec: &WasmControllerSpec) -> Result<(), Problem> {
    let invalid = |field: &str, e: &dyn std::fmt::Display| {
        Problem::new(Reason::InvalidSpec, format!("{field}: {e}"))
    };
    let kinds = std::iter::once(("spec.parent", &spec.parent.api_version, &spec.parent.kind))
        .chain(
            spec.children
                .iter()
                .map(|c| ("spec.children", &c.api_version, &c.kind)),
        )
        .chain(
            spec.grants
                .iter()
                .map(|g| ("spec.grants", &g.api_version, &g.kind)),
        );
    for (field, api_version, kind) in kinds {
        GroupVersion::parse(api_version).map_err(|e| invalid(field, &e))?;
        query::validate_kind(kind).map_err(|e| invalid(field, &e))?;
    }
    if let Some(name) = &spec.service_account_name {
        query::validate_dns_subdomain(name).map_err(|e| invalid("spec.serviceAccountName", &e))?;
    }
    if let Some(ns) = &spec.service_account_namespace {
        query::validate_namespace(ns).map_err(|e| invalid("spec.serviceAccountNamespace", &e))?;
    }
    if let Some(cm) = &spec.module.config_map {
        query::validate_dns_subdomain(&cm.name)
            .map_err(|e| invalid("spec.module.configMap.name", &e))?;
        if let Some(ns) = &cm.namespace {
            query::validate_namespace(ns)
                .map_err(|e| invalid("spec.module.configMap.namespace", &e))?;
        }
    }
    Ok(())
}

/// The ServiceAccount a controller acts as (the rule: [`WasmControllerSpec::service_account`]).
pub(super) fn service_account(
    id: &ControllerId,
    spec: &WasmControllerSpec,
) -> Result<ServiceAccount, Problem> {
    let (namespace, name) = spec
        .service_account(id.namespace.as_deref())
        .map_err(|e| Problem::new(Reason::InvalidSpec, e))?;
    Ok(ServiceAccount { namespace, name })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> WasmControllerSpec {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn refused(yaml: &str) -> String {
        let problem = validate_declarations(&spec(yaml)).unwrap_err();
        assert_eq!(problem.reason, Reason::InvalidSpec, "{}", problem.message);
        assert!(!problem.message.contains('\n'), "{}", problem.message);
        problem.message
    }

    #[test]
    fn refusals_to_act_name_who_acts_and_the_command() {
        let account = ServiceAccount {
            namespace: "team-a".into(),
            name: "ctl".into(),
        };
        assert_eq!(refusal(Acting::Allowed, &account), None);
        let m = refusal(Acting::NamespaceNotEnabled, &account).unwrap();
        assert!(m.contains("a cluster admin enables it with `kubectl label namespace team-a kubewasm.dev/tenant=enabled`"), "{m}");
        assert!(m.contains("the namespace's admin has not yet let the runtime act as its ServiceAccounts, it does so too: `kubectl -n team-a create rolebinding kubewasm-runtime-tenant"), "{m}");
        let m = refusal(Acting::NamespaceNotOptedIn, &account).unwrap();
        assert!(m.contains("the namespace's admin applies it with `kubectl -n team-a create rolebinding kubewasm-runtime-tenant --clusterrole=kubewasm-runtime-tenant --serviceaccount=kubewasm-system:kubewasm`"), "{m}");
        let m = refusal(Acting::AccountNotOptedIn, &account).unwrap();
        assert!(m.contains("`kubectl -n team-a annotate serviceaccount ctl kubewasm.dev/wasm-controllers=allowed`"), "{m}");
        let m = refusal(Acting::NoServiceAccount, &account).unwrap();
        assert!(
            m.contains("`kubectl -n team-a create serviceaccount ctl`"),
            "{m}"
        );
    }

    #[test]
    fn specs_that_would_reach_a_url_or_a_key_unparsed_are_refused() {
        validate_declarations(&spec(
            "module: {configMap: {name: hello-controller, key: hello_world.wasm}}\nparent: {apiVersion: example.com/v1, kind: HelloWorld}\nchildren: [{apiVersion: v1, kind: Pod}]\ngrants: [{apiVersion: apps/v1, kind: Deployment, verbs: [get]}]\nserviceAccountName: hello-controller",
        ))
        .unwrap();
        // The two strings a hostile tenant tried: a watch URL of another namespace and a query.
        let m = refused(
            "module: {configMap: {name: m, key: k}}\nparent: {apiVersion: 'apps/v1/namespaces/team-a/deployments?watch=1&timeoutSeconds=86400', kind: Deployment}",
        );
        assert!(m.starts_with("spec.parent: invalid apiVersion"), "{m}");
        let m = refused(
            "module: {configMap: {name: m, key: k}}\nparent: {apiVersion: v1, kind: ConfigMap}\nchildren: [{apiVersion: 'apps/v1?a=b', kind: Deployment}]",
        );
        assert!(m.starts_with("spec.children: invalid apiVersion"), "{m}");
        let m = refused(
            "module: {configMap: {name: m, key: k}}\nparent: {apiVersion: v1, kind: ConfigMap}\ngrants: [{apiVersion: v1, kind: 'Pod/status', verbs: [get]}]",
        );
        assert!(m.starts_with("spec.grants: invalid kind"), "{m}");
        let m = refused(
            "module: {configMap: {name: m, key: k}}\nparent: {apiVersion: v1, kind: ConfigMap}\nserviceAccountName: 'x:y'",
        );
        assert!(
            m.starts_with("spec.serviceAccountName: invalid name"),
            "{m}"
        );
        let m = refused(
            "module: {configMap: {name: 'm,metadata.name=x', key: k}}\nparent: {apiVersion: v1, kind: ConfigMap}",
        );
        assert!(m.starts_with("spec.module.configMap.name"), "{m}");
        let m = refused(
            "module: {configMap: {name: m, key: k, namespace: 'A\\nB'}}\nparent: {apiVersion: v1, kind: ConfigMap}",
        );
        assert!(m.contains("\\n"), "escaped: {m}");
    }
}
