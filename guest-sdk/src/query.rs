//! One read, resolved: which kind, where it looks, which labels — and the one filter and the
//! one order that every answer uses.
//!
//! The runtime's shared cache, the offline `kubewasm reconcile --state` set and the SDK's
//! `testing::FakeCluster` all answer reads through a [`Query`], so a guest's native tests
//! see exactly what the runtime would hand it, and are refused where the runtime refuses.
//!
//! Rules, whoever answers:
//! - a namespaced kind is read in the namespace asked for, else the default one (the target's),
//!   else in every namespace;
//! - a cluster-scoped kind is read without a namespace; naming one is an error;
//! - names and namespaces must be valid Kubernetes names (nothing that could change a URL);
//! - a label selector must parse (see [`crate::selector`]);
//! - results are sorted by namespace, then name.

use serde_json::Value;

use crate::object;
use crate::selector::{Labels, Selector};

/// Longest object name Kubernetes accepts (a DNS subdomain).
pub const MAX_NAME_BYTES: usize = 253;

/// Longest namespace name (a DNS label).
pub const MAX_NAMESPACE_BYTES: usize = 63;

/// Where a read looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// One namespace of a namespaced kind.
    Namespace(String),
    /// Every namespace of a namespaced kind.
    AllNamespaces,
    /// A cluster-scoped kind.
    Cluster,
}

/// A resolved read of objects of one kind.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    /// `apiVersion`, e.g. `v1`.
    pub api_version: String,
    /// `kind`, e.g. `Pod`.
    pub kind: String,
    /// Where it looks.
    pub scope: Scope,
    /// Which labels the objects must have.
    pub selector: Selector,
}

/// Why a read cannot even be asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryError(String);

impl std::fmt::Display for QueryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for QueryError {}

impl From<QueryError> for crate::Error {
    fn from(e: QueryError) -> Self {
        crate::Error::permanent(e.0)
    }
}

impl Query {
    /// Resolves a read of `kind` (whose scope the caller knows: `namespaced`) in `namespace`,
    /// falling back to `default_namespace` (the target's) for namespaced kinds.
    pub fn new(
        api_version: &str,
        kind: &str,
        namespaced: bool,
        namespace: Option<&str>,
        default_namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Query, QueryError> {
        let scope = match (namespaced, namespace) {
            (false, Some(ns)) => {
                return Err(QueryError(format!(
                    "{kind} ({api_version}) is cluster-scoped: read it without a namespace (asked for namespace `{}`)",
                    printable(ns)
                )));
            }
            (false, None) => Scope::Cluster,
            (true, asked) => match asked.or(default_namespace) {
                Some(ns) => {
                    validate_namespace(ns)?;
                    Scope::Namespace(ns.to_owned())
                }
                None => Scope::AllNamespaces,
            },
        };
        Ok(Query {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            scope,
            selector: parse_selector(label_selector)?,
        })
    }

    /// The one namespace this query looks in, if it is confined to one.
    pub fn namespace(&self) -> Option<&str> {
        match &self.scope {
            Scope::Namespace(ns) => Some(ns),
            Scope::AllNamespaces | Scope::Cluster => None,
        }
    }

    /// Whether an object's namespace and labels fit (its kind is known to be the right one,
    /// as in a cache of one kind).
    pub fn matches_meta<L: Labels + ?Sized>(&self, namespace: Option<&str>, labels: &L) -> bool {
        let placed = match &self.scope {
            Scope::Namespace(ns) => namespace == Some(ns.as_str()),
            Scope::AllNamespaces => namespace.is_some(),
            Scope::Cluster => namespace.is_none(),
        };
        placed && self.selector.matches(labels)
    }

    /// Whether an object (JSON, as the API serves it) is one this query returns.
    pub fn matches(&self, obj: &Value) -> bool {
        object::api_version(obj) == Some(self.api_version.as_str())
            && object::kind(obj) == Some(self.kind.as_str())
            && self.matches_meta(
                object::namespace(obj),
                &obj.pointer("/metadata/labels").and_then(Value::as_object),
            )
    }

    /// Whether `obj` is the object called `name` that this query can see.
    pub fn finds(&self, obj: &Value, name: &str) -> bool {
        object::name(obj) == Some(name) && self.matches(obj)
    }
}

/// Puts query results in their one order: by namespace, then name.
pub fn sort(objects: &mut [Value]) {
    objects.sort_by(|a, b| {
        (object::namespace(a), object::name(a)).cmp(&(object::namespace(b), object::name(b)))
    });
}

/// Parses an optional label selector with the message every reader uses.
pub fn parse_selector(label_selector: Option<&str>) -> Result<Selector, QueryError> {
    match label_selector {
        Some(s) => Selector::parse(s).map_err(|e| {
            QueryError(format!(
                "invalid label selector `{}`: {e}",
                printable(truncate(s, 128))
            ))
        }),
        None => Ok(Selector::default()),
    }
}

/// An object name: 1 to 253 characters of `a-z A-Z 0-9 . - _ :`, not `.` or `..`. Kubernetes
/// is stricter for most kinds (and says so itself); this refuses everything that could change
/// the meaning of an API path (`/`, `?`, `#`, `%`, whitespace, ...).
pub fn validate_name(name: &str) -> Result<(), QueryError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'));
    if ok {
        Ok(())
    } else {
        Err(QueryError(format!(
            "invalid object name `{}`: a name is 1 to {MAX_NAME_BYTES} characters of letters, digits, `.`, `-`, `_` and `:`",
            printable(truncate(name, 128))
        )))
    }
}

/// Longest `apiVersion`: a group (a DNS subdomain, 253 bytes), `/` and a version (a DNS
/// label, 63 bytes).
pub const MAX_API_VERSION_BYTES: usize = 253 + 1 + 63;

/// Longest kind name Kubernetes serves (a CRD's kind must lower-case to a DNS label).
pub const MAX_KIND_BYTES: usize = 63;

/// An `apiVersion` split into its group (empty for the core group: `v1`) and version, both
/// checked: the group is a DNS subdomain and the version a DNS label, so nothing that could
/// change the meaning of an API path (`/`, `?`, `#`, `%`, `..`, whitespace) gets through.
/// The one parser of `apiVersion` strings: the runtime's allowlist, discovery and caches all
/// use it, so they cannot disagree about what a string names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupVersion<'a> {
    /// The API group, `""` for the core group.
    pub group: &'a str,
    /// The version, e.g. `v1`, `v1beta1`.
    pub version: &'a str,
}

impl<'a> GroupVersion<'a> {
    /// Parses `v1`, `apps/v1` or `example.com/v1alpha1`.
    pub fn parse(api_version: &'a str) -> Result<GroupVersion<'a>, QueryError> {
        let refuse = || {
            QueryError(format!(
                "invalid apiVersion `{}`: expected `VERSION` (the core group, e.g. `v1`) or `GROUP/VERSION` (e.g. `apps/v1`, `example.com/v1alpha1`), the group a DNS subdomain and the version a DNS label",
                printable(truncate(api_version, 128))
            ))
        };
        if api_version.len() > MAX_API_VERSION_BYTES {
            return Err(refuse());
        }
        let (group, version, group_ok) = match api_version.split_once('/') {
            Some((group, version)) => (group, version, is_dns_subdomain(group)),
            None => ("", api_version, true),
        };
        if group_ok && is_dns_label(version) {
            Ok(GroupVersion { group, version })
        } else {
            Err(refuse())
        }
    }
}

impl std::fmt::Display for GroupVersion<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.group {
            "" => f.write_str(self.version),
            group => write!(f, "{group}/{}", self.version),
        }
    }
}

/// A kind name: 1 to 63 ASCII letters and digits, starting with a letter (`ConfigMap`,
/// `HelloWorld`).
pub fn validate_kind(kind: &str) -> Result<(), QueryError> {
    let b = kind.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= MAX_KIND_BYTES
        && b[0].is_ascii_alphabetic()
        && b.iter().all(u8::is_ascii_alphanumeric);
    if ok {
        Ok(())
    } else {
        Err(QueryError(format!(
            "invalid kind `{}`: a kind is 1 to {MAX_KIND_BYTES} ASCII letters and digits, starting with a letter (e.g. `ConfigMap`)",
            printable(truncate(kind, 128))
        )))
    }
}

/// A DNS subdomain (an API group; the names of ServiceAccounts, ConfigMaps and most kinds):
/// at most 253 bytes of DNS labels joined by `.`.
pub fn validate_dns_subdomain(name: &str) -> Result<(), QueryError> {
    if is_dns_subdomain(name) {
        Ok(())
    } else {
        Err(QueryError(format!(
            "invalid name `{}`: a name is at most {MAX_NAME_BYTES} characters of `a-z`, `0-9`, `-` and `.`, each part between dots starting and ending with a letter or digit",
            printable(truncate(name, 128))
        )))
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= MAX_NAME_BYTES && s.split('.').all(is_dns_label)
}

/// A DNS label: 1 to 63 of `a-z 0-9 -`, starting and ending alphanumeric.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NAMESPACE_BYTES
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A namespace name: a DNS label (1 to 63 of `a-z 0-9 -`, starting and ending alphanumeric).
pub fn validate_namespace(namespace: &str) -> Result<(), QueryError> {
    if is_dns_label(namespace) {
        Ok(())
    } else {
        Err(QueryError(format!(
            "invalid namespace `{}`: a namespace is 1 to {MAX_NAMESPACE_BYTES} characters of `a-z`, `0-9` and `-`",
            printable(truncate(namespace, 128))
        )))
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Control characters escaped, so that a hostile name cannot forge log lines.
fn printable(s: &str) -> String {
    s.chars().flat_map(char::escape_debug).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, app: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": {"app": app}}})
    }

    #[test]
    fn namespaced_kinds_default_to_the_given_namespace() {
        let q = Query::new("v1", "Pod", true, None, Some("web"), Some("app=a")).unwrap();
        assert_eq!(q.scope, Scope::Namespace("web".into()));
        assert!(q.matches(&pod("web", "x", "a")));
        assert!(!q.matches(&pod("other", "x", "a")));
        assert!(!q.matches(&pod("web", "x", "b")));
        let all = Query::new("v1", "Pod", true, None, None, None).unwrap();
        assert!(all.matches(&pod("other", "x", "b")));
        let cluster_scoped_object =
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}});
        assert!(!all.matches(&cluster_scoped_object));
    }

    #[test]
    fn cluster_scoped_kinds_take_no_namespace() {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}});
        let q = Query::new("v1", "Node", false, None, Some("web"), None).unwrap();
        assert_eq!(q.scope, Scope::Cluster);
        assert!(q.finds(&node, "n1"));
        let err = Query::new("v1", "Node", false, Some("web"), None, None).unwrap_err();
        assert!(
            err.to_string().contains("Node (v1) is cluster-scoped"),
            "{err}"
        );
    }

    #[test]
    fn names_that_could_change_a_url_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "x?fieldManager=y",
            "a/b",
            "../x",
            "a b",
            "a%2F",
            "x#y",
            "a\nb",
        ] {
            let err = validate_name(bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid object name"), "{bad:?}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
        validate_name(&"a".repeat(254)).unwrap_err();
        for good in [
            "your-name",
            "system:controller:x",
            "a.b_c",
            &"a".repeat(253),
        ] {
            validate_name(good).unwrap();
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a/b", &"a".repeat(64)] {
            validate_namespace(bad).unwrap_err();
        }
        validate_namespace("team-a").unwrap();
        assert!(Query::new("v1", "Pod", true, Some("../x"), None, None).is_err());
    }

    #[test]
    fn api_versions_are_parsed_once_and_strictly() {
        let gv = GroupVersion::parse("v1").unwrap();
        assert_eq!((gv.group, gv.version), ("", "v1"));
        assert_eq!(gv.to_string(), "v1");
        let gv = GroupVersion::parse("example.com/v1alpha1").unwrap();
        assert_eq!((gv.group, gv.version), ("example.com", "v1alpha1"));
        assert_eq!(gv.to_string(), "example.com/v1alpha1");
        // The longest group: 253 bytes of labels of at most 63.
        let long_group = [63, 63, 63, 61].map(|n| "a".repeat(n)).join(".");
        assert_eq!(long_group.len(), 253);
        GroupVersion::parse(&format!("{long_group}/v1")).unwrap();
        GroupVersion::parse(&format!("{long_group}a/v1")).unwrap_err();
        for bad in [
            "",
            "/v1",
            "apps/",
            "apps/v1?a=b",
            "apps/v1/namespaces/team-a/deployments?watch=1&timeoutSeconds=86400",
            "apps/v1#x",
            "Apps/v1",
            "apps/V1",
            "a..b/v1",
            ".apps/v1",
            "apps/v1 ",
            "apps/v1\n",
            "apps/%2e%2e",
            "../v1",
            "apps/-v1",
            &format!("{}/v1", "a".repeat(254)),
            &format!("apps/{}", "v".repeat(64)),
        ] {
            let err = GroupVersion::parse(bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid apiVersion"), "{bad:?}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn kinds_are_letters_and_digits() {
        for good in ["Pod", "ConfigMap", "HelloWorld", "V1Thing", &"K".repeat(63)] {
            validate_kind(good).unwrap();
        }
        for bad in [
            "",
            "1Pod",
            "Pod?x=y",
            "Pod/status",
            "Po d",
            "Pod\n",
            &"K".repeat(64),
        ] {
            let err = validate_kind(bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid kind"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn bad_selectors_are_refused_with_one_message() {
        let err = Query::new("v1", "Pod", true, None, None, Some("app in (")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid label selector `app in (`"),
            "{err}"
        );
    }

    #[test]
    fn sorted_by_namespace_then_name() {
        let mut found = vec![pod("b", "a", "x"), pod("a", "z", "x"), pod("a", "b", "x")];
        sort(&mut found);
        let keys: Vec<_> = found
            .iter()
            .map(|o| (object::namespace(o).unwrap(), object::name(o).unwrap()))
            .collect();
        assert_eq!(keys, [("a", "b"), ("a", "z"), ("b", "a")]);
    }
}
