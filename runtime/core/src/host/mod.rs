//! The bridge between the sandbox and Kubernetes: grants, reads for guests (from the shared
//! caches), and actions turned into API calls.

mod access;
pub mod actions;
mod bridge;
mod cache;
pub mod capsules;
mod finalizer;
mod grants;
mod kinds;
#[cfg(test)]
mod mock_api;
mod reads;
pub mod request;
mod runner;
pub mod shadow;
mod state;

pub use access::{
    AccessReviews, Acting, Asked, GUEST_EVENTS_ROLE, MissingReads, NeededRules, OptIns, READ_VERBS,
    ReviewFailed, SERVICE_ACCOUNT_OPT_IN, ServiceAccount, TENANT_LABEL, TENANT_LABEL_VALUE,
    events_binding_command,
};
pub use actions::{ActionError, ChildKind, Executor};
pub use bridge::{call_limits, reason_of};
pub use cache::CacheSource;
pub use finalizer::Finalizer;
pub use grants::{Denied, Permissions};
pub use kinds::DeclaredKinds;
pub use reads::{GrantedReads, ObjectSet, ObjectSource};
pub use runner::{
    CANDIDATE_DIFFERS, ControllerSetup, Failing, MAX_LISTED_FINALIZING, Runner, Stats,
};
pub use state::{
    DEFAULT_MAX_STATE_BYTES_PER_NAMESPACE, GuestState, LINGER, MAX_SHARD_BYTES, STATE_SHARDS,
    StateAccounts, StateBook, StateError, StateOwner, Stored, shard_of_key,
};
