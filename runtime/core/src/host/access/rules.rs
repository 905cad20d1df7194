//! The RBAC rules a controller's spec needs of its ServiceAccount, and the one command that
//! grants them — appliable by the namespace's admin (Events by a RoleBinding to
//! [`GUEST_EVENTS_ROLE`], never a Role granting `events create`, which RBAC would refuse it).

use std::collections::BTreeMap;

use super::ServiceAccount;
use crate::controller::Kind;

/// The RBAC rules a controller's declaration needs of its ServiceAccount, by API group and
/// resource (`pods`, `helloworlds/status`): the reads of every kind it is handed and the
/// writes its spec declares, so that the fix a refusal names is complete, not one 403 at a
/// time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NeededRules {
    rules: BTreeMap<(String, String), std::collections::BTreeSet<&'static str>>,
    /// Events on the objects it reconciles: in a namespace, a RoleBinding to
    /// [`GUEST_EVENTS_ROLE`] (a namespace admin may bind it, not grant `events create` itself).
    events: bool,
}

/// The ClusterRole the installation ships for controllers' Events (deploy/runtime/rbac.yaml),
/// which a namespace admin may bind (and only bind) in its namespace.
pub const GUEST_EVENTS_ROLE: &str = "kubewasm-guest-events";

/// The command with which a namespace's admin lets `account` post Events: a RoleBinding to
/// [`GUEST_EVENTS_ROLE`].
pub fn events_binding_command(account: &ServiceAccount) -> String {
    let (ns, name) = (&account.namespace, &account.name);
    format!(
        "kubectl -n {ns} create rolebinding {name}-events --clusterrole={GUEST_EVENTS_ROLE} --serviceaccount={ns}:{name}"
    )
}

impl NeededRules {
    /// `verbs` on `resource` (a plural, optionally `plural/subresource`) of `group`.
    pub fn add(&mut self, group: &str, resource: &str, verbs: &[&'static str]) {
        self.rules
            .entry((group.to_owned(), resource.to_owned()))
            .or_default()
            .extend(verbs.iter().copied());
    }

    /// Events (`create`, `patch`) on the objects it reconciles.
    pub fn add_events(&mut self) {
        self.events = true;
    }

    /// `verbs` on every object of `kind`.
    pub fn add_kind(&mut self, kind: &Kind, verbs: &[&'static str]) {
        self.add(&kind.resource.group, &kind.resource.plural, verbs);
    }

    /// The rules, one per resource, as RBAC writes them.
    fn rules(&self) -> Vec<serde_json::Value> {
        self.rules
            .iter()
            .map(|((group, resource), verbs)| {
                serde_json::json!({"apiGroups": [group], "resources": [resource], "verbs": verbs})
            })
            .collect()
    }

    /// One command that creates the rules as a Role named `name` in `namespace` (a
    /// ClusterRole when `None`) and binds it to `account`: a `kubectl apply` of a List, so it
    /// also updates a Role created before. In a namespace, Events come from a RoleBinding to
    /// [`GUEST_EVENTS_ROLE`], so that the namespace's admin can apply it all (RBAC refuses it a
    /// Role granting `events create`, which the built-in `admin` role does not hold).
    pub fn apply_command(
        &self,
        name: &str,
        namespace: Option<&str>,
        account: &ServiceAccount,
    ) -> String {
        const RBAC: &str = "rbac.authorization.k8s.io/v1";
        let subject = serde_json::json!({"kind": "ServiceAccount", "name": account.name, "namespace": account.namespace});
        let mut rules = self.rules();
        let items = match namespace {
            Some(ns) => {
                let mut items = vec![
                    serde_json::json!({"apiVersion": RBAC, "kind": "Role",
                        "metadata": {"name": name, "namespace": ns}, "rules": rules}),
                    serde_json::json!({"apiVersion": RBAC, "kind": "RoleBinding",
                        "metadata": {"name": name, "namespace": ns},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                        "subjects": [subject]}),
                ];
                if self.events {
                    items.push(serde_json::json!({"apiVersion": RBAC, "kind": "RoleBinding",
                        "metadata": {"name": format!("{name}-events"), "namespace": ns},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": GUEST_EVENTS_ROLE},
                        "subjects": [subject]}));
                }
                items
            }
            None => {
                if self.events {
                    rules.push(serde_json::json!({"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}));
                }
                vec![
                    serde_json::json!({"apiVersion": RBAC, "kind": "ClusterRole",
                        "metadata": {"name": name}, "rules": rules}),
                    serde_json::json!({"apiVersion": RBAC, "kind": "ClusterRoleBinding",
                        "metadata": {"name": name},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                        "subjects": [subject]}),
                ]
            }
        };
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        format!("echo '{list}' | kubectl apply -f -")
    }
}
