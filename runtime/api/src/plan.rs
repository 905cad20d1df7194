//! A spec parsed once ([`Plan`]): every name, selector and limit a WasmController's spec
//! declares, checked by the one parser of each, in three parts that fail apart — the module's
//! source, the ServiceAccount, and the rest (what is reconciled, owned, granted, with which
//! limits). A spec wrong in its parent still has its module loaded (its status says both); a
//! spec wrong in its module reads nothing. The runtime's setup and `kubewasm reconcile` both
//! act on a plan, never on the spec's text, so they cannot read it two ways.

use std::time::Duration;

use kubewasm_guest_sdk::query::{self, GroupVersion};
use kubewasm_guest_sdk::selector::Selector;

use crate::{ModuleSource, Resolved, Source, UpdateStrategy, Verb, WasmControllerSpec};

/// Most kinds one controller may declare (parent, children and grants together): each costs
/// a discovery, a watch and three access reviews.
pub const MAX_DECLARED_KINDS: usize = 32;

/// See the module doc.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Where the module comes from; wrong here, no module is read.
    pub source: Result<Source, String>,
    /// The ServiceAccount it acts as, `(namespace, name)`; wrong here, nothing is read for it.
    pub account: Result<(String, String), String>,
    /// What it reconciles, owns and may use, and with which limits; wrong here, it is not set
    /// up (its module still loads).
    pub controller: Result<ControllerPlan, String>,
    /// Where its candidate module comes from (`spec.candidate`), if it names one; wrong here,
    /// no candidate is read (the live module runs as always, the status says why).
    pub candidate: Option<Result<Source, String>>,
    /// How the candidate is compared and promoted.
    pub rollout: Rollout,
}

/// `spec.rollout`, with its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rollout {
    /// Compare one reconcile in this many (at least 1).
    pub sample_every: u32,
    /// Promote once this many were compared with no difference.
    pub promote_after: Option<u32>,
}

/// What a controller reconciles, owns and may use, and with which limits, all checked.
#[derive(Debug, Clone)]
pub struct ControllerPlan {
    /// The kind it reconciles.
    pub parent: KindName,
    /// `spec.parent.labelSelector`, parsed: only the parents it matches are reconciled.
    pub selector: Option<Selector>,
    /// The kinds it owns, each with its update strategy.
    pub children: Vec<(KindName, UpdateStrategy)>,
    /// The other kinds it may use, and how.
    pub grants: Vec<(KindName, Vec<Verb>)>,
    /// The limits the spec asks for (where it runs, the operator's caps apply:
    /// [`crate::LimitCaps::apply`]).
    pub limits: Resolved,
    /// Whether it puts its finalizer on its parents.
    pub finalize: bool,
    /// How often every parent is reconciled without a change.
    pub resync: Duration,
}

/// An apiVersion and kind as a spec names them, checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KindName {
    /// e.g. `apps/v1`.
    pub api_version: String,
    /// e.g. `Deployment`.
    pub kind: String,
}

impl Plan {
    /// The plan of `spec` for a controller of `namespace` (`None`: a ClusterWasmController).
    pub fn of(spec: &WasmControllerSpec, namespace: Option<&str>) -> Plan {
        let account = account(spec).and_then(|()| spec.service_account(namespace));
        let policy = spec.rollout.clone().unwrap_or_default();
        Plan {
            source: module_source(&spec.module, namespace),
            account,
            controller: ControllerPlan::of(spec),
            // The same parse as `module`; its errors name the candidate's fields.
            candidate: spec.candidate.as_ref().map(|candidate| {
                module_source(candidate, namespace)
                    .map_err(|e| e.replace("spec.module", "spec.candidate"))
            }),
            rollout: Rollout {
                sample_every: policy.sample_every.unwrap_or(1).max(1),
                promote_after: policy.promote_after.filter(|n| *n > 0),
            },
        }
    }
}

/// A module's source (`spec.module`, or `spec.candidate` with its errors renamed), checked.
fn module_source(module: &ModuleSource, namespace: Option<&str>) -> Result<Source, String> {
    let source = module.source(namespace)?;
    if let Source::ConfigMap { name, .. } = &source {
        query::validate_dns_subdomain(name)
            .map_err(|e| format!("spec.module.configMap.name: {e}"))?;
    }
    if let Some(ns) = module
        .config_map
        .as_ref()
        .and_then(|c| c.namespace.as_ref())
    {
        query::validate_namespace(ns)
            .map_err(|e| format!("spec.module.configMap.namespace: {e}"))?;
    }
    Ok(source)
}

/// `spec.serviceAccountName` and `spec.serviceAccountNamespace`, checked.
fn account(spec: &WasmControllerSpec) -> Result<(), String> {
    if let Some(name) = &spec.service_account_name {
        query::validate_dns_subdomain(name).map_err(|e| format!("spec.serviceAccountName: {e}"))?;
    }
    if let Some(ns) = &spec.service_account_namespace {
        query::validate_namespace(ns).map_err(|e| format!("spec.serviceAccountNamespace: {e}"))?;
    }
    Ok(())
}

impl ControllerPlan {
    /// The parts of `spec` beside its module and account, checked in the order a person
    /// reads them; the error names the field.
    pub fn of(spec: &WasmControllerSpec) -> Result<ControllerPlan, String> {
        let limits = spec.limits.resolve()?;
        let selector = spec.parent.selector()?;
        let declared = 1 + spec.children.len() + spec.grants.len();
        if declared > MAX_DECLARED_KINDS {
            return Err(format!(
                "the spec declares {declared} kinds (parent, children and grants); at most {MAX_DECLARED_KINDS} are allowed: split the controller"
            ));
        }
        let parent = KindName::of("spec.parent", &spec.parent.api_version, &spec.parent.kind)?;
        let children = spec
            .children
            .iter()
            .map(|c| {
                Ok((
                    KindName::of("spec.children", &c.api_version, &c.kind)?,
                    c.update_strategy,
                ))
            })
            .collect::<Result<_, String>>()?;
        let grants = spec
            .grants
            .iter()
            .map(|g| {
                Ok((
                    KindName::of("spec.grants", &g.api_version, &g.kind)?,
                    g.verbs.clone(),
                ))
            })
            .collect::<Result<_, String>>()?;
        Ok(ControllerPlan {
            parent,
            selector,
            children,
            grants,
            limits,
            finalize: spec.finalize,
            resync: spec.resync_period(),
        })
    }

    /// Every kind it declares, with the field that declares it: parent, children, grants.
    pub fn declared(&self) -> impl Iterator<Item = (&'static str, &KindName)> {
        std::iter::once(("spec.parent", &self.parent))
            .chain(self.children.iter().map(|(k, _)| ("spec.children", k)))
            .chain(self.grants.iter().map(|(k, _)| ("spec.grants", k)))
    }

    /// The kinds it is handed objects of: parent, children, and grants that read.
    pub fn readable(&self) -> impl Iterator<Item = (&'static str, &KindName)> {
        std::iter::once(("spec.parent", &self.parent))
            .chain(self.children.iter().map(|(k, _)| ("spec.children", k)))
            .chain(
                self.grants
                    .iter()
                    .filter(|(_, verbs)| verbs.iter().any(Verb::reads))
                    .map(|(k, _)| ("spec.grants", k)),
            )
    }
}

impl KindName {
    /// `api_version` and `kind` as `field` declares them, each checked by its parser.
    fn of(field: &str, api_version: &str, kind: &str) -> Result<KindName, String> {
        GroupVersion::parse(api_version).map_err(|e| format!("{field}: {e}"))?;
        query::validate_kind(kind).map_err(|e| format!("{field}: {e}"))?;
        Ok(KindName {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
        })
    }
}

impl Verb {
    /// Whether it reads (the controller is then handed a watch's objects of the kind).
    pub fn reads(&self) -> bool {
        matches!(self, Verb::Get | Verb::List)
    }
}

#[cfg(test)]
mod tests;
