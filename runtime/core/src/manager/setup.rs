//! Starting a controller: the operator's rules, the declared kinds resolved, the
//! ServiceAccount's read permissions reviewed, then the watches and the runner's setup.
//! Resolve, then authorize, then act.

use std::sync::Arc;

use futures::StreamExt;

use crate::api::{ControllerPlan, Plan, Reason, Verb, WasmControllerSpec};
use crate::controller::{Kind, ResolveError, WriteGate};
use crate::host::{
    Acting, CacheSource, ChildKind, ControllerSetup, DeclaredKinds, Finalizer, GuestState,
    NeededRules, Permissions, SERVICE_ACCOUNT_OPT_IN, ServiceAccount, Stored, TENANT_LABEL,
    TENANT_LABEL_VALUE,
};

use super::{ControllerId, Manager, Problem};

/// The WasmController (or ClusterWasmController) `id`, as an Event names it.
fn controller_ref(
    id: &ControllerId,
    uid: Option<&str>,
) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("kubewasm.dev/v1alpha1".into()),
        kind: Some(
            if id.namespace.is_some() {
                "WasmController"
            } else {
                "ClusterWasmController"
            }
            .into(),
        ),
        name: Some(id.name.clone()),
        namespace: id.namespace.clone(),
        uid: uid.map(str::to_owned),
        ..Default::default()
    }
}

impl Manager {
    /// Sets up the controller `id` declared with `spec`, as its `plan` says (the spec's
    /// names, selector and limits were parsed there, once: [`Plan`]).
    pub(super) async fn setup(
        &self,
        id: &ControllerId,
        (spec, plan, uid): (&WasmControllerSpec, &Plan, Option<&str>),
        (state, stored): (Arc<GuestState>, Option<&Stored>),
    ) -> Result<(ControllerSetup, ReadAccess), Problem> {
        // Parsed before anything else sees them: every apiVersion and kind the spec names
        // becomes part of a discovery URL, a cache key and an allowlist match.
        let c = plan
            .controller
            .as_ref()
            .map_err(|e| Problem::new(Reason::InvalidSpec, e.clone()))?;
        let finalizer = Finalizer::for_controller(id.namespace.is_some(), &id.name);
        if c.finalize
            && let Err(why) = &finalizer
        {
            return Err(Problem::new(Reason::InvalidSpec, why.clone()));
        }
        let (run, clamped) = self.config.caps.apply(c.limits);
        let (limits, concurrency) = (crate::host::call_limits(&run.limits), run.concurrency);
        // The guest's saved states, read before its first reconcile (once per controller).
        state
            .load(stored)
            .await
            .map_err(|e| Problem::new(Reason::StateUnavailable, e.to_string()))?;
        // The operator's rules come first: nothing is looked up for a kind it does not allow.
        for (field, k) in c.readable() {
            let (api_version, kind) = (&k.api_version, &k.kind);
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
        for (_, k) in c.declared() {
            let (api_version, kind) = (&k.api_version, &k.kind);
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
            account: service_account(plan)?,
            kinds: c
                .readable()
                .map(|(_, k)| kind_of(&k.api_version, &k.kind))
                .collect::<Result<_, _>>()?,
            needed: needed_rules(c, &kind_of)?,
        };
        self.check_access(id, &access).await?;

        let parent_kind = kind_of(&c.parent.api_version, &c.parent.kind)?;
        let parent = self.watches.watch(&parent_kind);
        let mut children = Vec::new();
        let mut readable = vec![parent.clone()];
        for (child, strategy) in &c.children {
            let watch = self
                .watches
                .watch(&kind_of(&child.api_version, &child.kind)?);
            readable.push(watch.clone());
            children.push((
                ChildKind {
                    kind: watch.kind().clone(),
                    strategy: *strategy,
                },
                watch,
            ));
        }
        for (grant, _) in c
            .grants
            .iter()
            .filter(|(_, verbs)| verbs.iter().any(Verb::reads))
        {
            readable.push(
                self.watches
                    .watch(&kind_of(&grant.api_version, &grant.kind)?),
            );
        }
        let client = self
            .impersonating(&access.account.namespace, &access.account.name)
            .map_err(|e| Problem::new(Reason::ClientError, e.to_string()))?;
        let setup = ControllerSetup {
            id: id.to_string(),
            namespace: id.namespace.clone(),
            parent,
            parent_selector: c.selector.clone(),
            children,
            reads: CacheSource::new(readable),
            permissions: Arc::new(Permissions::from_spec(
                &id.to_string(),
                id.namespace.as_deref(),
                spec,
            )),
            limits,
            concurrency,
            resync: c.resync,
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
            finalize: c.finalize,
            capsules: self.capsules.open(
                &id.to_string(),
                id.namespace.as_deref(),
                spec.module.clone(),
                limits,
            ),
            shadow: (self.shadows).open(
                &id.to_string(),
                id.namespace.as_deref(),
                plan.rollout.sample_every,
            ),
            controller_ref: Some(controller_ref(id, uid)),
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
    c: &ControllerPlan,
    kind_of: &dyn Fn(&str, &str) -> Result<Kind, Problem>,
) -> Result<NeededRules, Problem> {
    const READ: [&str; 3] = ["get", "list", "watch"];
    let mut needed = NeededRules::default();
    let parent = kind_of(&c.parent.api_version, &c.parent.kind)?;
    needed.add_kind(&parent, &["get", "list", "watch", "patch"]);
    if parent.has_status {
        let status = format!("{}/status", parent.resource.plural);
        needed.add(&parent.resource.group, &status, &["patch"]);
    }
    for (child, _) in &c.children {
        let child = kind_of(&child.api_version, &child.kind)?;
        needed.add_kind(
            &child,
            &["get", "list", "watch", "create", "patch", "delete"],
        );
    }
    for (grant, verbs) in &c.grants {
        let kind = kind_of(&grant.api_version, &grant.kind)?;
        for verb in verbs {
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

/// The ServiceAccount a controller acts as (the rule: [`WasmControllerSpec::service_account`]).
pub(super) fn service_account(plan: &Plan) -> Result<ServiceAccount, Problem> {
    let (namespace, name) = plan
        .account
        .clone()
        .map_err(|e| Problem::new(Reason::InvalidSpec, e))?;
    Ok(ServiceAccount { namespace, name })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
