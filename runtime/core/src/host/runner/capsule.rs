//! A failed reconcile kept as a capsule (see [`crate::host::capsules`]): made of what the
//! pipeline holds anyway — the request's documents shared with the caches, the reads recorded
//! on their way to the guest — so that a reconcile that succeeds costs nothing more.

use crate::api::Problem;
use crate::host::capsules::{CapsuleError, Recording, Stage};
use crate::sandbox::Digest;

use super::Runner;
use super::pipeline::Prepared;

impl Runner {
    /// Keeps the failure of `prepared`'s reconcile at `stage` as a capsule of this controller.
    pub(super) fn capsule(
        &self,
        prepared: &Prepared,
        recording: &Recording,
        problem: &Problem,
        stage: Stage,
        module: Digest,
    ) {
        let request = prepared.request(&self.setup.id);
        self.setup.capsules.record(
            &prepared.key.to_string(),
            Some(&request),
            recording.take(),
            format!("sha256:{}", module.hex()),
            CapsuleError {
                reason: problem.reason.as_str().to_owned(),
                message: problem.message.clone(),
                stage,
            },
        );
    }
}
