//! Kubernetes machinery, kube-rs only: kind discovery, shared watches, the work queue,
//! leader election.

mod discovery;
mod leader;
mod queue;
mod watches;

pub use discovery::{Kind, Resolver};
pub use leader::LeaderElector;
pub use queue::{Backoff, WorkQueue};
pub use watches::{Change, ObjectKey, SharedWatches, Watch};
