//! Kubernetes machinery, kube-rs only: kind discovery, shared watches, the work queue.

mod discovery;
mod queue;
mod watches;

pub use discovery::{Kind, Resolver};
pub use queue::{Backoff, WorkQueue};
pub use watches::{Change, ObjectKey, SharedWatches, Watch};
