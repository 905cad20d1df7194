//! What a controller's status says where someone else must act: who (the team or the cluster
//! admin) and the exact command.

use crate::host::{GUEST_EVENTS_ROLE, ServiceAccount, events_binding_command};

/// What `Ready` says while the caches of `kinds` have not listed (`unlisted`: their
/// resources, `plural.group`): if it lasts, the runtime may not list and watch them, which only
/// a cluster admin can change — the exact commands, a ClusterRole aggregated into the runtime's
/// `kubewasm-runtime-watch` (deploy/runtime/rbac.yaml).
pub(super) fn waiting_for_caches(kinds: &[String], unlisted: &[String]) -> String {
    let waiting = format!(
        "waiting for the runtime's first list of {}",
        kinds.join(", ")
    );
    let Some(first) = unlisted.first() else {
        return waiting;
    };
    let role = format!(
        "kubewasm-runtime-watch-{}",
        first.split('.').next().unwrap_or(first)
    );
    format!(
        "{waiting}; if this lasts, the runtime may not list and watch {} — which only a cluster admin can allow, with a ClusterRole labelled kubewasm.dev/aggregate-to-runtime=true (aggregated into the runtime's kubewasm-runtime-watch; see deploy/runtime/README.md): `kubectl create clusterrole {role} --verb=list,watch --resource={} && kubectl label clusterrole {role} kubewasm.dev/aggregate-to-runtime=true`",
        unlisted.join(", "),
        unlisted.join(",")
    )
}

/// What `Ready` says while the Events of a controller acting as `account` are refused (`why`:
/// the API server's words): who allows them, and how. `namespaced`: a WasmController.
pub(super) fn events_refused(
    account: Option<&ServiceAccount>,
    why: &str,
    namespaced: bool,
) -> String {
    let fix = match account {
        Some(account) if namespaced => format!(
            "the namespace's admin binds ClusterRole {GUEST_EVENTS_ROLE} to its ServiceAccount: `{}`",
            events_binding_command(account)
        ),
        Some(account) => format!(
            "a cluster admin grants `create` and `patch` on `events` to ServiceAccount {}/{} (or binds ClusterRole {GUEST_EVENTS_ROLE} to it)",
            account.namespace, account.name
        ),
        None => format!("bind ClusterRole {GUEST_EVENTS_ROLE} to its ServiceAccount"),
    };
    format!("its Events are not recorded (the API server refused them: {why}); {fix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_for_caches_names_the_cluster_admin_and_the_commands() {
        let m = waiting_for_caches(
            &["HelloWorld".into(), "Pod".into()],
            &["helloworlds.example.com".into()],
        );
        assert!(m.starts_with("waiting for the runtime's first list of HelloWorld, Pod; if this lasts, the runtime may not list and watch helloworlds.example.com — which only a cluster admin can allow"), "{m}");
        assert!(m.contains("`kubectl create clusterrole kubewasm-runtime-watch-helloworlds --verb=list,watch --resource=helloworlds.example.com && kubectl label clusterrole kubewasm-runtime-watch-helloworlds kubewasm.dev/aggregate-to-runtime=true`"), "{m}");
        // Listed already: nothing to fix, only waiting.
        assert_eq!(
            waiting_for_caches(&["Pod".into()], &[]),
            "waiting for the runtime's first list of Pod"
        );
    }

    #[test]
    fn refused_events_name_the_binding_a_namespace_admin_makes() {
        let account = ServiceAccount {
            namespace: "team-a".into(),
            name: "ctl".into(),
        };
        let m = events_refused(Some(&account), "events is forbidden", true);
        assert!(
            m.starts_with(
                "its Events are not recorded (the API server refused them: events is forbidden)"
            ),
            "{m}"
        );
        assert!(m.contains("the namespace's admin binds ClusterRole kubewasm-guest-events to its ServiceAccount: `kubectl -n team-a create rolebinding ctl-events --clusterrole=kubewasm-guest-events --serviceaccount=team-a:ctl`"), "{m}");
        let m = events_refused(Some(&account), "no", false);
        assert!(m.contains("a cluster admin grants"), "{m}");
    }
}
