//! The kinds a controller declared (parent, children, grants), resolved once when it starts.
//!
//! Actions and reads look kinds up here, never in discovery: a kind the controller did not
//! declare is refused before the API server hears of it.

use std::collections::HashMap;

use crate::controller::Kind;

/// Declared kinds by `(apiVersion, kind)`.
#[derive(Debug, Clone, Default)]
pub struct DeclaredKinds(HashMap<(String, String), Kind>);

impl DeclaredKinds {
    /// Adds a resolved kind.
    pub fn insert(&mut self, kind: Kind) {
        let key = (
            kind.resource.api_version.clone(),
            kind.resource.kind.clone(),
        );
        self.0.insert(key, kind);
    }

    /// The kind, if declared.
    pub fn get(&self, api_version: &str, kind: &str) -> Option<&Kind> {
        self.0.get(&(api_version.to_owned(), kind.to_owned()))
    }

    /// Every declared kind.
    pub fn iter(&self) -> impl Iterator<Item = &Kind> {
        self.0.values()
    }
}
