//! Kubernetes machinery, kube-rs only: kind discovery, shared watches, the work queue,
//! shards over Leases and their fences, and which kinds may be watched at all.

mod accounts;
mod budget;
mod discovery;
mod fence;
mod queue;
mod scheduler;
mod shards;
mod watchable;
mod watches;

pub use accounts::{
    CacheAccounts, CacheCaps, READMIT_PERCENT, RELIST_FLOOR, WatchBook, Withheld, weigh,
};
pub use budget::{TokenBucket, WriteGate};
pub use discovery::{DISCOVERY_TIMEOUT, Kind, ResolveError, Resolver};
pub use fence::Fence;
pub use queue::{Backoff, WorkQueue};
pub use scheduler::{Lane, WriteScheduler};
pub use shards::{
    DEFAULT_SHARDS, Held, ROLE_LABEL, SHARD_SET_LABEL, ShardHolder, ShardSettings, shard_of,
    tenant_of,
};
pub use watchable::{DEFAULT_WATCHABLE_KINDS, InvalidRule, WatchableKinds};
pub use watches::{
    Cached, Change, LIST_PAGE_SIZE, ObjectKey, SharedWatches, Watch, cached_then_paged,
    capped_lists, over_cap, watch_config,
};
