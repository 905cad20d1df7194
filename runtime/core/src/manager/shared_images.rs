//! Compiled modules of anonymous, digest-pinned images, by reference: a controller naming
//! `registry/repository@sha256:…` without a pull secret runs the module another such
//! controller already runs, without pulling, reading or hashing its bytes again.
//!
//! A module that does not compile is remembered the same way (the same bytes fail the same
//! way): ten thousand controllers naming a broken module cost one compile.
//!
//! Sound because the reference names the bytes (the digest) and anyone may pull them (no
//! credentials): a tenant gets nothing it could not pull itself. A module pulled with a pull
//! secret is never recorded here: another tenant naming the same digest pulls it with its
//! own credentials, or fails. A spec's `module.sha256` pin is still checked.
//!
//! The controllers a reload wakes read their modules concurrently: [`SharedImages::turn`]
//! lets one controller per reference fetch and compile while the others wait, and find it
//! compiled when they get their turn.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::sandbox::Digest;
use crate::sync::Locks as _;

/// See the module doc.
#[derive(Default)]
pub(super) struct SharedImages {
    /// What each reference's bytes were found to be.
    known: Mutex<HashMap<String, Known>>,
    /// One reader of a reference at a time.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// What a reference's bytes were found to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Known {
    /// Their digest (the module's).
    pub digest: Digest,
    /// `Err`: why they do not compile.
    pub compiled: Result<(), String>,
}

impl SharedImages {
    /// Waits until no other controller reads `reference`'s module; holds that until dropped.
    pub(super) async fn turn(&self, reference: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let turn = self
            .turns
            .locked()
            .entry(reference.to_owned())
            .or_default()
            .clone();
        turn.lock_owned().await
    }

    /// What `reference`'s bytes were found to be, if they were compiled (or failed to).
    pub(super) fn known(&self, reference: &str) -> Option<Known> {
        self.known.locked().get(reference).cloned()
    }

    /// What `reference`'s bytes were found to be.
    pub(super) fn record(&self, reference: &str, known: Known) {
        self.known.locked().insert(reference.to_owned(), known);
    }

    /// Forgets the modules no longer loaded (`loaded`), the failures of references no
    /// controller names (`named`), and the turns nobody holds or waits for.
    pub(super) fn retain(&self, loaded: &HashSet<Digest>, named: &HashSet<String>) {
        self.known.locked().retain(|reference, k| match k.compiled {
            Ok(()) => loaded.contains(&k.digest),
            Err(_) => named.contains(reference),
        });
        self.turns
            .locked()
            .retain(|_, turn| Arc::strong_count(turn) > 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_reader_per_reference_and_forgotten_when_unloaded() {
        let shared = SharedImages::default();
        let first = shared.turn("r@sha256:1").await;
        let other = shared.turn("r@sha256:2").await;
        let waiting = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            shared.turn("r@sha256:1"),
        )
        .await;
        assert!(waiting.is_err(), "a second reader of one reference waits");
        let one = Known {
            digest: Digest::of(b"one"),
            compiled: Ok(()),
        };
        let broken = Known {
            digest: Digest::of(b"two"),
            compiled: Err("does not compile".into()),
        };
        shared.record("r@sha256:1", one.clone());
        shared.record("r@sha256:2", broken.clone());
        drop(first);
        let again = shared.turn("r@sha256:1").await;
        assert_eq!(shared.known("r@sha256:1"), Some(one.clone()));
        drop((again, other));
        let named: HashSet<String> = ["r@sha256:2".to_owned()].into();
        shared.retain(&[one.digest].into(), &named);
        assert_eq!(shared.known("r@sha256:1"), Some(one), "still loaded");
        assert_eq!(shared.known("r@sha256:2"), Some(broken), "still named");
        assert!(shared.turns.locked().is_empty(), "nobody holds a turn");
        shared.retain(&HashSet::new(), &HashSet::new());
        assert_eq!(shared.known("r@sha256:1"), None);
        assert_eq!(shared.known("r@sha256:2"), None);
    }
}
