//! Starting a controller: the operator's rules, the declared kinds resolved, the
//! ServiceAccount's read permissions reviewed, then the watches and the runner's setup.
//! Resolve, then authorize, then act.

use std::sync::Arc;

use futures::StreamExt;
use kubewasm_guest_sdk::selector::Selector;

use crate::api::{Reason, Verb, WasmControllerSpec};
use crate::controller::{Kind, TokenBucket};
use crate::host::{
    CacheSource, ChildKind, ControllerSetup, DeclaredKinds, Finalizer, GuestState, Permissions,
    ServiceAccount,
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
        let asked_concurrency = spec.limits.concurrency.unwrap_or(1).max(1) as usize;
        let (limits, concurrency, clamped) = self.config.caps.apply(asked, asked_concurrency);
        let parent_selector = match &spec.parent.label_selector {
            Some(s) => Some(Selector::parse(s).map_err(|e| {
                Problem::new(
                    Reason::InvalidSpec,
                    format!("spec.parent.labelSelector `{s}`: {e}"),
                )
            })?),
            None => None,
        };
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
            let resolved = self.resolver.resolve(api_version, kind).await.map_err(|e| {
                Problem::new(Reason::KindNotFound,
                    format!("the API server does not serve {kind} ({api_version}): {e}; apply its CustomResourceDefinition"),
                )
            })?;
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
        let kind_of = |api_version: &str, kind: &str| {
            kinds
                .get(api_version, kind)
                .cloned()
                .expect("every declared kind was resolved above")
        };
        // Authorize: the ServiceAccount must be allowed to read whatever it will be handed.
        let access = ReadAccess {
            clamped,
            account: service_account(id, spec),
            kinds: readable_declarations(spec)
                .map(|(_, api_version, kind)| kind_of(api_version, kind))
                .collect(),
        };
        self.check_access(id, &access).await?;

        let parent_kind = kind_of(&spec.parent.api_version, &spec.parent.kind);
        let parent = self.watches.watch(&parent_kind);
        let mut children = Vec::new();
        let mut readable = vec![parent.clone()];
        for c in &spec.children {
            let watch = self.watches.watch(&kind_of(&c.api_version, &c.kind));
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
            readable.push(self.watches.watch(&kind_of(&g.api_version, &g.kind)));
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
            budget: TokenBucket::new(self.config.writes_per_second, self.config.write_burst)
                .counting(self.metrics.api_requests(&id.to_string())),
            fence: self.fence.clone(),
            client,
            kinds,
            sandbox: self.sandbox.clone(),
            metrics: self.metrics.clone(),
            state,
            finalizer: finalizer.ok(),
            finalize: spec.finalize,
        };
        Ok((setup, access))
    }

    /// A client that acts as the ServiceAccount (impersonation), so RBAC judges every write.
    /// No groups are named: the API server gives an impersonated ServiceAccount its own, and
    /// the runtime needs `impersonate` on `serviceaccounts` only, not on `groups`.
    fn impersonating(&self, namespace: &str, name: &str) -> Result<kube::Client, kube::Error> {
        let mut config = self.base_config.clone();
        config.auth_info.impersonate = Some(format!("system:serviceaccount:{namespace}:{name}"));
        kube::Client::try_from(config)
    }

    /// Whether the controller's ServiceAccount may still read what it is handed.
    async fn check_access(&self, id: &ControllerId, access: &ReadAccess) -> Result<(), Problem> {
        let kinds: Vec<&Kind> = access.kinds.iter().collect();
        match self
            .access
            .check_reads(&id.name, &access.account, id.namespace.as_deref(), &kinds)
            .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(missing)) => Err(Problem::new(Reason::Forbidden, missing.to_string())),
            Err(failed) => Err(Problem::new(Reason::AccessReviewFailed, failed.to_string())),
        }
    }

    /// Stops running controllers whose ServiceAccount lost a read they need; they start
    /// again by themselves (on the retry timer) once RBAC allows it.
    pub(super) async fn recheck_access(&mut self) {
        let running: Vec<(ControllerId, ReadAccess)> = self
            .controllers
            .iter()
            .filter(|(_, m)| m.runner.is_some())
            .filter_map(|(id, m)| Some((id.clone(), m.access.clone()?)))
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
                m.setup_problem = Some(problem);
            }
        }
        self.watches.release_unused();
    }
}

/// What a running controller's ServiceAccount must keep being allowed to read.
#[derive(Debug, Clone)]
pub(super) struct ReadAccess {
    /// What the operator's caps changed in the spec's limits, for the status.
    pub(super) clamped: Vec<String>,
    account: ServiceAccount,
    kinds: Vec<Kind>,
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

/// The ServiceAccount a controller acts as: in its own namespace (a ClusterWasmController:
/// its module's namespace, else `default`), named by the spec or `default`.
fn service_account(id: &ControllerId, spec: &WasmControllerSpec) -> ServiceAccount {
    let namespace = id
        .namespace
        .clone()
        .or_else(|| {
            spec.module
                .config_map
                .as_ref()
                .and_then(|c| c.namespace.clone())
        })
        .unwrap_or_else(|| "default".into());
    ServiceAccount {
        namespace,
        name: spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into()),
    }
}
