//! The bridge between the sandbox and Kubernetes: grants, reads for guests, module sources,
//! actions to API calls.

mod grants;
pub mod module;
mod reads;

pub use grants::{Denied, Permissions};
pub use reads::{GrantedReads, ObjectSet, ObjectSource};
