//! Which kinds the operator lets controllers make the runtime watch (`--watchable-kinds`).
//!
//! A watch caches every object of a kind in the runtime's memory, so the operator decides
//! which kinds tenants may ask for, before any discovery or watch happens. Rules are
//! `group/Kind` patterns (`core` names the core group; `*` matches any group or kind, and
//! `*.example.com` any group ending so), optionally negated with `!`; the first rule that
//! matches decides, and a kind no rule matches is not watchable.

use std::fmt;
use std::str::FromStr;

use kubewasm_guest_sdk::query::GroupVersion;

/// The default rules: everything but Secrets and the Kubernetes system groups (RBAC,
/// Leases, CRDs, admission, storage, ...). Name `core/Secret` before `!core/Secret` to allow
/// Secrets.
pub const DEFAULT_WATCHABLE_KINDS: &str = "!core/Secret,!*.k8s.io/*,*/*";

/// One `[!]group/Kind` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    allow: bool,
    group: String,
    kind: String,
}

impl Rule {
    fn matches(&self, group: &str, kind: &str) -> bool {
        let group = if group.is_empty() { "core" } else { group };
        let group_ok = match self.group.strip_prefix('*') {
            None => self.group == group,
            Some("") => true,
            Some(suffix) => group.ends_with(suffix),
        };
        group_ok && (self.kind == "*" || self.kind == kind)
    }
}

/// The operator's rules for what may be watched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchableKinds {
    rules: Vec<Rule>,
}

impl Default for WatchableKinds {
    // A constant of this file; `default_excludes_secrets_and_system_groups_only` parses it.
    #[allow(clippy::expect_used)]
    fn default() -> Self {
        DEFAULT_WATCHABLE_KINDS
            .parse()
            .expect("the default watchable kinds parse")
    }
}

/// A `--watchable-kinds` value that is not a list of `[!]group/Kind` rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid watchable-kinds rule `{0}`: expected `[!]group/Kind` such as `core/ConfigMap`, `apps/*`, `*.example.com/*` or `!core/Secret`"
)]
pub struct InvalidRule(String);

impl FromStr for WatchableKinds {
    type Err = InvalidRule;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut rules = Vec::new();
        for raw in s.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let (allow, rest) = match raw.strip_prefix('!') {
                Some(rest) => (false, rest),
                None => (true, raw),
            };
            let Some((group, kind)) = rest.split_once('/') else {
                return Err(InvalidRule(raw.to_owned()));
            };
            let group_ok = !group.is_empty()
                && !group[1..].contains('*')
                && group
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '*'));
            let kind_ok = kind == "*"
                || (!kind.is_empty() && kind.chars().all(|c| c.is_ascii_alphanumeric()));
            if !group_ok || !kind_ok {
                return Err(InvalidRule(raw.to_owned()));
            }
            rules.push(Rule {
                allow,
                group: group.to_owned(),
                kind: kind.to_owned(),
            });
        }
        Ok(WatchableKinds { rules })
    }
}

impl fmt::Display for WatchableKinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules: Vec<String> = self
            .rules
            .iter()
            .map(|r| format!("{}{}/{}", if r.allow { "" } else { "!" }, r.group, r.kind))
            .collect();
        f.write_str(&rules.join(","))
    }
}

impl WatchableKinds {
    /// Whether a kind of `api_version` (`v1`, `apps/v1`) may be watched. An apiVersion that
    /// does not parse ([`GroupVersion::parse`]) names nothing that may be.
    pub fn allows(&self, api_version: &str, kind: &str) -> bool {
        let Ok(GroupVersion { group, .. }) = GroupVersion::parse(api_version) else {
            return false;
        };
        self.rules
            .iter()
            .find(|r| r.matches(group, kind))
            .is_some_and(|r| r.allow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_excludes_secrets_and_system_groups_only() {
        let w = WatchableKinds::default();
        assert!(w.allows("v1", "ConfigMap"));
        assert!(w.allows("v1", "Pod"));
        assert!(w.allows("apps/v1", "Deployment"));
        assert!(w.allows("example.com/v1", "HelloWorld"));
        assert!(!w.allows("v1", "Secret"));
        // Only what parses as a group/version is matched: a path cannot pass as another group.
        assert!(!w.allows("rbac.authorization.k8s.io/v1/x", "ClusterRoleBinding"));
        assert!(!w.allows("apps/v1?a=b", "Deployment"));
        assert!(!w.allows("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"));
        assert!(!w.allows("coordination.k8s.io/v1", "Lease"));
        assert_eq!(w.to_string(), DEFAULT_WATCHABLE_KINDS);
    }

    #[test]
    fn first_matching_rule_decides() {
        let w: WatchableKinds = "core/Secret,!core/*,apps/*".parse().unwrap();
        assert!(w.allows("v1", "Secret"));
        assert!(!w.allows("v1", "ConfigMap"));
        assert!(w.allows("apps/v1", "ReplicaSet"));
        assert!(
            !w.allows("batch/v1", "Job"),
            "no rule matches: not watchable"
        );
        let w: WatchableKinds = "*.example.com/*".parse().unwrap();
        assert!(w.allows("kool.example.com/v1", "Guitar"));
        assert!(!w.allows("example.org/v1", "Guitar"));
    }

    #[test]
    fn malformed_rules_are_refused() {
        for bad in ["Secret", "core/", "/Pod", "co*re/Pod", "core/Po-d", "!"] {
            let err = bad.parse::<WatchableKinds>().unwrap_err().to_string();
            assert!(err.contains("expected `[!]group/Kind`"), "{bad}: {err}");
        }
    }
}
