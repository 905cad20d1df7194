//! Kubernetes label selectors: parse the string form (`app=web,tier!=db,env in (a,b)`) and
//! match it against an object's labels.
//!
//! The grammar and matching rules follow the API server's `labels.Parse`, so that a guest's
//! fake cluster, the runtime's shared cache and the API server agree on which objects a
//! selector picks. The module is plain Rust so the runtime can reuse it natively.
//!
//! | form | matches when |
//! | --- | --- |
//! | `a=b`, `a==b` | label `a` is present with value `b` |
//! | `a!=b` | label `a` is absent or has another value |
//! | `a` | label `a` is present |
//! | `!a` | label `a` is absent |
//! | `a in (x,y)` | label `a` is present with value `x` or `y` |
//! | `a notin (x,y)` | label `a` is absent or has neither value |
//! | `a>1`, `a<1` | label `a` is present, an integer, and greater/less than the bound |
//!
//! Requirements are joined with `,` and must all hold; the empty selector matches everything.
//! A selector is at most [`MAX_SELECTOR_BYTES`] long with at most [`MAX_SELECTOR_TERMS`] requirements, and parses in linear time.
//!
//! ```
//! use kubewasm_guest_sdk::selector::Selector;
//! use std::collections::BTreeMap;
//!
//! let selector: Selector = "app=web, env in (prod,staging), !legacy".parse().unwrap();
//! let labels = BTreeMap::from([("app".to_string(), "web".to_string()),
//!                              ("env".to_string(), "prod".to_string())]);
//! assert!(selector.matches(&labels));
//! assert!("app in ()".parse::<Selector>().is_err());
//! ```

mod parse;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use parse::Parser;

/// The longest selector accepted, in bytes: far more than any real one (a label key is at
/// most 317 bytes and a value 63), and short enough that parsing and echoing it in an error
/// stay cheap whoever wrote it.
pub const MAX_SELECTOR_BYTES: usize = 4096;

/// The most requirements (comma-separated terms) a selector may have.
pub const MAX_SELECTOR_TERMS: usize = 64;

/// Where a selector can look up label values: a map from key to value.
pub trait Labels {
    /// The value of label `key`, or `None` when the object has no such label.
    fn label(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

impl<S: std::hash::BuildHasher> Labels for HashMap<String, String, S> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).map(String::as_str)
    }
}

/// A JSON object such as `metadata.labels`; entries whose value is not a string are ignored.
impl Labels for serde_json::Map<String, serde_json::Value> {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(serde_json::Value::as_str)
    }
}

/// Absent labels (e.g. `metadata.labels` not set) behave like an empty map.
impl<L: Labels> Labels for Option<L> {
    fn label(&self, key: &str) -> Option<&str> {
        self.as_ref().and_then(|labels| labels.label(key))
    }
}

impl<L: Labels + ?Sized> Labels for &L {
    fn label(&self, key: &str) -> Option<&str> {
        (**self).label(key)
    }
}

/// How one requirement compares a label with its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    /// `key=value` or `key==value`.
    Equals,
    /// `key!=value`.
    NotEquals,
    /// `key in (v1,v2)`.
    In,
    /// `key notin (v1,v2)`.
    NotIn,
    /// `key`: the label is present, whatever its value.
    Exists,
    /// `!key`: the label is absent.
    DoesNotExist,
    /// `key>n`: the label is an integer greater than `n`.
    GreaterThan,
    /// `key<n`: the label is an integer less than `n`.
    LessThan,
}

/// One condition of a selector: a label key, an operator and the values it compares with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl Requirement {
    /// The label key this requirement looks at.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// How the label is compared.
    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// The values compared with (empty for `Exists`/`DoesNotExist`).
    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether only objects that carry this requirement's label can satisfy it (`=`, `in`,
    /// exists, `>`, `<`); `!=`, `notin` and `!key` also match objects without the label.
    pub fn needs_label(&self) -> bool {
        match self.operator {
            Operator::Equals
            | Operator::In
            | Operator::Exists
            | Operator::GreaterThan
            | Operator::LessThan => true,
            Operator::NotEquals | Operator::NotIn | Operator::DoesNotExist => false,
        }
    }

    /// Whether `labels` satisfy this requirement.
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        let value = labels.label(&self.key);
        let in_values = |v: &str| self.values.iter().any(|want| want == v);
        match self.operator {
            Operator::Equals | Operator::In => value.is_some_and(in_values),
            Operator::NotEquals | Operator::NotIn => !value.is_some_and(in_values),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(have), Some(bound)) = (
                    value.and_then(|v| v.parse::<i64>().ok()),
                    self.values.first().and_then(|v| v.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    have > bound
                } else {
                    have < bound
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = &self.key;
        match self.operator {
            Operator::Equals => write!(f, "{key}={}", self.values[0]),
            Operator::NotEquals => write!(f, "{key}!={}", self.values[0]),
            Operator::In => write!(f, "{key} in ({})", self.values.join(",")),
            Operator::NotIn => write!(f, "{key} notin ({})", self.values.join(",")),
            Operator::Exists => write!(f, "{key}"),
            Operator::DoesNotExist => write!(f, "!{key}"),
            Operator::GreaterThan => write!(f, "{key}>{}", self.values[0]),
            Operator::LessThan => write!(f, "{key}<{}", self.values[0]),
        }
    }
}

/// A parsed label selector: every requirement must hold. The default (empty) selector
/// matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// Parse the string form of a label selector, as `kubectl -l` and the API server take it.
    /// Selectors longer than [`MAX_SELECTOR_BYTES`] are refused before anything else.
    pub fn parse(selector: &str) -> Result<Self, ParseError> {
        if selector.len() > MAX_SELECTOR_BYTES {
            let shown = &selector[..selector.floor_char_boundary(64)];
            return Err(ParseError {
                selector: format!("{shown}…"),
                position: MAX_SELECTOR_BYTES,
                message: format!(
                    "the selector is {} bytes, more than the limit of {MAX_SELECTOR_BYTES}; select on fewer or shorter labels",
                    selector.len()
                ),
            });
        }
        Parser::new(selector).parse()
    }

    /// The requirements, in the order written.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether the selector has no requirements (and so matches everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether the selector narrows a set of objects down to those carrying some label: at
    /// least one requirement needs its label to exist ([`Requirement::needs_label`]). One that
    /// does not, such as `""`, `!legacy`, `app!=x` or `app notin (x)`, matches every object
    /// without those labels, which is usually nearly all of them; use it for reads, not for
    /// deleting.
    pub fn narrows(&self) -> bool {
        self.requirements.iter().any(Requirement::needs_label)
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches<L: Labels + ?Sized>(&self, labels: &L) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether a Kubernetes object (JSON) has labels (`metadata.labels`) that satisfy the
    /// selector. An object without labels matches only selectors that need no label.
    pub fn matches_object(&self, object: &serde_json::Value) -> bool {
        let labels = object
            .pointer("/metadata/labels")
            .and_then(serde_json::Value::as_object);
        self.matches(&labels)
    }
}

impl FromStr for Selector {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The canonical string form, e.g. `app=web,env in (a,b)`; it parses back to the same selector.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

/// A selector that could not be parsed: what was expected and where (a byte offset).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    selector: String,
    position: usize,
    message: String,
}

impl ParseError {
    /// Byte offset in the selector where the problem was found.
    pub fn position(&self) -> usize {
        self.position
    }

    /// What is wrong, without the selector itself.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid label selector {:?}: {} (at position {})",
            self.selector, self.message, self.position
        )
    }
}

impl std::error::Error for ParseError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn check(selector: &str, pairs: &[(&str, &str)]) -> bool {
        Selector::parse(selector)
            .unwrap_or_else(|e| panic!("{e}"))
            .matches(&labels(pairs))
    }

    #[test]
    fn equality_forms() {
        assert!(check("a=b", &[("a", "b")]));
        assert!(check("a==b", &[("a", "b")]));
        assert!(check(" a = b ", &[("a", "b")]));
        assert!(!check("a=b", &[("a", "c")]));
        assert!(!check("a=b", &[]));
        assert!(check("a!=b", &[("a", "c")]));
        assert!(check("a!=b", &[]));
        assert!(!check("a!=b", &[("a", "b")]));
    }

    #[test]
    fn existence_forms() {
        assert!(check("a", &[("a", "")]));
        assert!(!check("a", &[("b", "x")]));
        assert!(check("!a", &[("b", "x")]));
        assert!(!check("!a", &[("a", "x")]));
    }

    #[test]
    fn set_forms() {
        assert!(check("a in (x,y)", &[("a", "y")]));
        assert!(check("a in (x, y)", &[("a", "x")]));
        assert!(!check("a in (x,y)", &[("a", "z")]));
        assert!(!check("a in (x,y)", &[]));
        assert!(check("a notin (x)", &[("a", "y")]));
        assert!(check("a notin (x)", &[]));
        assert!(!check("a notin (x)", &[("a", "x")]));
    }

    #[test]
    fn comparison_forms() {
        assert!(check("a>1", &[("a", "2")]));
        assert!(!check("a>1", &[("a", "1")]));
        assert!(!check("a>1", &[("a", "x")]));
        assert!(check("a<1", &[("a", "0")]));
        assert!(Selector::parse("a>x").is_err());
    }

    #[test]
    fn conjunction_and_everything() {
        let sel = "app=web,tier in (front,back), !legacy,env";
        assert!(check(
            sel,
            &[("app", "web"), ("tier", "back"), ("env", "p")]
        ));
        assert!(!check(sel, &[("app", "web"), ("tier", "back")]));
        assert!(!check(
            sel,
            &[
                ("app", "web"),
                ("tier", "back"),
                ("env", "p"),
                ("legacy", "1")
            ]
        ));
        assert!(check("", &[]));
        assert!(check("  ", &[("a", "b")]));
        assert!(Selector::parse("").unwrap().is_empty());
    }

    #[test]
    fn empty_values() {
        assert!(check("a=", &[("a", "")]));
        assert!(!check("a=", &[("a", "x")]));
        assert!(check("a=,b", &[("a", ""), ("b", "1")]));
        assert!(check("a in (x,)", &[("a", "")]));
    }

    #[test]
    fn prefixed_keys() {
        assert!(check(
            "app.kubernetes.io/name=web",
            &[("app.kubernetes.io/name", "web")]
        ));
        assert!(Selector::parse("Bad_Prefix/name=x").is_err());
        assert!(Selector::parse("/name").is_err());
        assert!(Selector::parse("example.com/").is_err());
    }

    #[test]
    fn invalid_selectors_say_why() {
        for (selector, needle) in [
            ("a in x", "expected \"(\" after \"in\""),
            ("a in ()", "at least one value"),
            ("a in (x", "expected \",\" or \")\""),
            ("a b", "expected an operator"),
            ("a=b c", "expected \",\" or the end"),
            ("=b", "expected a label key"),
            ("a,", "expected a label key"),
            ("a=-b", "must start and end"),
            ("a=b=c", "expected \",\" or the end"),
            ("a=b*", "may contain only"),
            ("!a=b", "expected \",\" or the end"),
            ("a==(x)", "expected a label value"),
        ] {
            let err = Selector::parse(selector).expect_err(selector);
            let text = err.to_string();
            assert!(text.contains(needle), "{selector}: {text}");
            assert!(text.contains(&format!("{selector:?}")), "{text}");
        }
        let long = format!("a={}", "x".repeat(64));
        assert!(Selector::parse(&long).unwrap_err().message().contains("63"));
    }

    #[test]
    fn display_round_trips() {
        for selector in ["a=b,c!=d,e in (x,y),f notin (z),g,!h,i>3,j<4", "a="] {
            let parsed = Selector::parse(selector).unwrap();
            assert_eq!(parsed.to_string(), selector);
            assert_eq!(Selector::parse(&parsed.to_string()).unwrap(), parsed);
        }
        assert_eq!(Selector::parse("a==b").unwrap().to_string(), "a=b");
    }

    #[test]
    fn matches_objects() {
        let sel = Selector::parse("app=web").unwrap();
        let pod = serde_json::json!({"metadata": {"name": "p", "labels": {"app": "web"}}});
        assert!(sel.matches_object(&pod));
        let bare = serde_json::json!({"metadata": {"name": "p"}});
        assert!(!sel.matches_object(&bare));
        assert!(Selector::parse("!app").unwrap().matches_object(&bare));
    }

    #[test]
    fn narrows_needs_a_label_that_must_exist() {
        for selector in [
            "a=b", "a==b", "a", "a in (b)", "a>1", "a<1", "!a,b=c", "a!=b,c",
        ] {
            assert!(Selector::parse(selector).unwrap().narrows(), "{selector}");
        }
        for selector in [
            "",
            "!nonexistent",
            "a!=b",
            "a notin (b)",
            "!a,b!=c,d notin (e)",
        ] {
            assert!(!Selector::parse(selector).unwrap().narrows(), "{selector}");
        }
    }

    #[test]
    fn long_selectors_are_refused_before_parsing() {
        let at_limit = format!("a in ({})", "x,".repeat((MAX_SELECTOR_BYTES - 7) / 2));
        assert!(at_limit.len() <= MAX_SELECTOR_BYTES);
        assert_eq!(
            Selector::parse(&at_limit).unwrap().requirements()[0]
                .values()
                .len(),
            2
        );
        let too_long = format!("a={}", "é".repeat(MAX_SELECTOR_BYTES));
        let err = Selector::parse(&too_long).unwrap_err();
        assert!(
            err.message().contains("more than the limit of 4096"),
            "{err}"
        );
        assert!(
            err.to_string().len() < 300,
            "the error echoes the whole selector: {err}"
        );
    }

    #[test]
    fn terms_are_bounded() {
        let at_limit = vec!["a"; MAX_SELECTOR_TERMS].join(",");
        assert_eq!(
            Selector::parse(&at_limit).unwrap().requirements().len(),
            MAX_SELECTOR_TERMS
        );
        let err = Selector::parse(&format!("{at_limit},b")).unwrap_err();
        assert!(err.message().contains("more than 64 requirements"), "{err}");
    }

    #[test]
    fn duplicate_values_are_dropped_in_order() {
        let values: Vec<String> = (0..600).map(|i| format!("v{i}")).collect();
        let selector = format!("a in ({},{})", values.join(","), values[..100].join(","));
        assert!(selector.len() <= MAX_SELECTOR_BYTES);
        let parsed = Selector::parse(&selector).unwrap();
        assert_eq!(parsed.requirements()[0].values(), values);
    }

    #[test]
    fn requirement_accessors() {
        let sel = Selector::parse("a in (x,y,x)").unwrap();
        let req = &sel.requirements()[0];
        assert_eq!(req.key(), "a");
        assert_eq!(req.operator(), Operator::In);
        assert_eq!(req.values(), ["x", "y"]);
    }
}
