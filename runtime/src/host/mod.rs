//! The bridge between the sandbox and Kubernetes: grants, reads for guests (from the shared
//! caches), module sources, and actions turned into API calls.

pub mod actions;
mod cache;
mod grants;
pub mod module;
mod reads;
mod runner;

pub use actions::{ActionError, ChildKind, Executor};
pub use cache::{CacheSource, to_json};
pub use grants::{Denied, Permissions};
pub use reads::{GrantedReads, ObjectSet, ObjectSource};
pub use runner::{ControllerSetup, Runner, Stats};
