//! The request as it crosses the WIT boundary (each JSON document as text) and the one place
//! the SDK turns it into a [`Request`]: the guest glue calls [`WireRequest::parse`], and so
//! does the runtime's reconcile bench for its native and webhook columns, so that they do the
//! guest's parsing work whatever that becomes.

use crate::{Error, ObjectRef, Request};

/// The WIT `request` record with plain Rust types: the documents as the host serialized them.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireRequest {
    /// `namespace/name` of the WasmController.
    pub controller: String,
    /// The object the call is about.
    pub target: ObjectRef,
    /// The parent object as JSON text, or `None` when it is gone.
    pub parent: Option<String>,
    /// The observed children, each as JSON text.
    pub children: Vec<String>,
    /// The parent as last reconciled, as JSON text.
    pub previous: Option<String>,
    /// The state saved with `setState`.
    pub state: Option<String>,
    /// The target is being deleted and carries the controller's finalizer.
    pub finalizing: bool,
}

impl WireRequest {
    /// The request a guest's reconcile function gets. Fails (permanently) on a document that
    /// is not JSON.
    pub fn parse(self) -> Result<Request, Error> {
        Ok(Request {
            controller: self.controller,
            target: self.target,
            parent: self
                .parent
                .map(|json| serde_json::from_str(&json))
                .transpose()?,
            children: self
                .children
                .iter()
                .map(|json| serde_json::from_str(json))
                .collect::<Result<_, _>>()?,
            previous: self
                .previous
                .map(|json| serde_json::from_str(&json))
                .transpose()?,
            state: self.state,
            finalizing: self.finalizing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wire(parent: &str) -> WireRequest {
        WireRequest {
            controller: "ns/c".into(),
            target: ObjectRef::new("v1", "ConfigMap", Some("ns"), "cm"),
            parent: Some(parent.into()),
            children: vec![r#"{"kind":"Pod"}"#.into()],
            previous: None,
            state: Some("s".into()),
            finalizing: true,
        }
    }

    #[test]
    fn parses_each_document() {
        let request = wire(r#"{"data":{"a":"b"}}"#).parse().unwrap();
        assert_eq!(request.controller, "ns/c");
        assert_eq!(request.parent, Some(json!({"data": {"a": "b"}})));
        assert_eq!(request.children, vec![json!({"kind": "Pod"})]);
        assert_eq!(request.previous, None);
        assert_eq!(request.state.as_deref(), Some("s"));
        assert!(request.finalizing);
    }

    #[test]
    fn a_document_that_is_not_json_is_a_permanent_error() {
        let err = wire("{not json").parse().unwrap_err();
        assert!(err.message.starts_with("invalid JSON"), "{}", err.message);
        assert!(!err.retryable);
    }
}
