//! Why a state could not be saved or loaded, in words a controller's owner can act on.

use crate::api::Reason;
use crate::sandbox::MAX_GUEST_STATE_BYTES;

use super::MAX_SHARD_BYTES;

/// Why a state could not be saved or loaded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StateError {
    /// Saving it would take the controller past its quota.
    #[error(
        "cannot save state for {key}: this controller's states would take more than its quota of {quota} bytes (--max-state-bytes-per-controller; {used} used by {objects} objects); state is forgotten when its object is gone, or the guest can forget it with setState(null)"
    )]
    Full {
        key: String,
        quota: usize,
        /// Bytes used now.
        used: usize,
        /// Objects with state now.
        objects: usize,
    },
    /// Saving it would take the states of the controller's namespace (all its controllers
    /// run by this replica) past the operator's cap.
    #[error(
        "cannot save state for {key}: the saved states of {whose} would take more than the operator's cap of {cap} bytes per namespace (--max-state-bytes-per-namespace; {used} bytes used, {mine} of them by this controller); forget states the controllers no longer need (setState(null); a state is also forgotten when its object is gone) or delete controllers the namespace no longer needs; only the runtime's operator can raise the cap"
    )]
    NamespaceFull {
        key: String,
        /// Whose states: `namespace team-a's controllers`, or the ClusterWasmControllers.
        whose: String,
        cap: usize,
        /// Bytes the namespace's states take now (at worst: saves being written count).
        used: usize,
        /// Of them, this controller's.
        mine: usize,
    },
    /// Saving it would take its shard object past [`MAX_SHARD_BYTES`].
    #[error(
        "cannot save state for {key}: its shard of this controller's states would hold more than {MAX_SHARD_BYTES} bytes; keep smaller states"
    )]
    ShardFull { key: String },
    /// Larger than an entry may be (checked where the response enters, so only reached by a
    /// caller that skipped that).
    #[error("cannot save state for {key}: {len} bytes, more than {MAX_GUEST_STATE_BYTES}")]
    TooLarge { key: String, len: usize },
    /// The API server refused or failed the write.
    #[error("saving state for {key} in its WasmControllerState failed: {message}")]
    Api {
        key: String,
        /// What the API server said.
        message: String,
    },
    /// The states could not be read when the controller started.
    #[error("reading this controller's saved states failed: {0}; retrying")]
    Load(String),
}

impl StateError {
    /// The reason a reconcile that failed with it shows in the controller's conditions.
    pub fn reason(&self) -> Reason {
        match self {
            StateError::Full { .. }
            | StateError::NamespaceFull { .. }
            | StateError::ShardFull { .. } => Reason::StateBudgetExceeded,
            StateError::Load(_) => Reason::StateUnavailable,
            StateError::TooLarge { .. } | StateError::Api { .. } => Reason::ActionFailed,
        }
    }
}
