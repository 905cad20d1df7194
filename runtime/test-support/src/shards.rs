//! A shard set of `kubewasm run --leader-elect` replicas, as tests and benches start them.

use std::collections::BTreeSet;

use kubewasm::controller::{DEFAULT_SHARDS, shard_of};

use crate::RUNTIME_NAMESPACE;

/// `count` tenant (namespace) names of `run`, each in a shard of its own (at most
/// [`DEFAULT_SHARDS`]): how many controllers a replica runs then follows from how many shards
/// it holds, not from how names hash.
pub fn one_per_shard(run: &str, count: usize) -> Vec<String> {
    let mut shards = BTreeSet::new();
    (0..)
        .map(|i| format!("{run}-t{i}"))
        .filter(|name| shards.insert(shard_of(name, DEFAULT_SHARDS)))
        .take(count.min(DEFAULT_SHARDS as usize))
        .collect()
}

/// The `kubewasm run` arguments of a replica of the shard set `id` (its Leases in
/// [`RUNTIME_NAMESPACE`]), with `more` after them.
pub fn replica_args<'a>(id: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--leader-elect",
        "--leader-election-namespace",
        RUNTIME_NAMESPACE,
        "--leader-election-id",
        id,
    ];
    args.extend_from_slice(more);
    args
}
