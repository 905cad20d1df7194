//! The accounts' rules, without a cluster.
use super::*;
use crate::controller::ObjectKey;

fn accounts(per_namespace: u64, total: u64) -> Arc<CacheAccounts> {
    Arc::new(CacheAccounts::new(CacheCaps {
        per_namespace,
        total,
    }))
}

fn key(namespace: &str, name: &str) -> ObjectKey {
    ObjectKey {
        namespace: Some(namespace.into()),
        name: name.into(),
    }
}

fn cluster(name: &str) -> ObjectKey {
    ObjectKey {
        namespace: None,
        name: name.into(),
    }
}

/// The running total agrees with the accounts it sums, and each account with its watches.
fn audit(a: &CacheAccounts) {
    let ledger = a.ledger();
    let mut stored = ledger.cluster.sum;
    for (ns, account) in &ledger.namespaces {
        let sum = account
            .shares
            .by_watch
            .values()
            .fold(0u64, |s, b| s.saturating_add(*b));
        assert_eq!(
            account.shares.sum, sum,
            "{ns}'s account is its watches' sum"
        );
        if account.hold.is_none() {
            stored += sum;
        }
    }
    assert_eq!(
        ledger.stored, stored,
        "stored is the sum of what is not held back"
    );
}

#[test]
fn a_namespace_over_its_cap_is_held_back_and_let_in_again_under_ninety_percent() {
    let a = accounts(1000, u64::MAX);
    let (mut w, mut held, readmitted) = a.register();
    assert_eq!(w.charge(&key("team-a", "1"), 600), Admit::Store);
    assert_eq!(w.charge(&key("team-b", "1"), 900), Admit::Store);
    assert_eq!(a.withheld("team-a"), None);
    // Over: this object and every later one of team-a are dropped; team-b is untouched.
    assert_eq!(w.charge(&key("team-a", "2"), 500), Admit::Drop);
    assert_eq!(held.try_recv().ok().as_deref(), Some("team-a"));
    assert_eq!(
        a.withheld("team-a"),
        Some(Withheld::OverNamespaceCap {
            bytes: 1100,
            cap: 1000
        })
    );
    assert_eq!(a.stored_bytes(), 900, "team-a's bytes are given back");
    assert_eq!(w.charge(&key("team-a", "3"), 10), Admit::Drop);
    assert_eq!(w.charge(&key("team-b", "2"), 50), Admit::Store);
    // Shrinking to 920 (over 90%) is not enough; to 820 is.
    assert_eq!(w.charge(&key("team-a", "1"), 410), Admit::Drop);
    assert!(a.withheld("team-a").is_some());
    assert!(!readmitted.has_changed().unwrap_or(true));
    w.charge(&key("team-a", "1"), 310);
    assert!(readmitted.has_changed().unwrap_or(false));
    // Let back in, but not handed out until the watch that dropped objects has listed.
    assert_eq!(a.withheld("team-a"), Some(Withheld::Relisting));
    assert!(a.wants_relist(w.id()));
    a.relisted(w.id(), &HashSet::new());
    assert_eq!(a.withheld("team-a"), None);
    assert!(!a.wants_relist(w.id()));
    assert_eq!(a.stored_bytes(), 820 + 950);
    audit(&a);
}

#[test]
fn over_the_total_the_largest_namespace_is_held_back_and_cluster_objects_never() {
    let a = accounts(u64::MAX, 1000);
    let (mut w, _held, _) = a.register();
    w.charge(&cluster("c1"), 300);
    w.charge(&key("small", "1"), 200);
    w.charge(&key("large", "1"), 400);
    assert_eq!(w.charge(&key("small", "2"), 150), Admit::Store);
    // 1050 stored: the largest namespace goes, not the one that tipped it over.
    assert_eq!(
        a.withheld("large"),
        Some(Withheld::OverTotalCap {
            bytes: 400,
            cap: 1000
        })
    );
    assert_eq!(a.withheld("small"), None);
    assert_eq!(a.stored_bytes(), 650);
    // Cluster-scoped objects alone over the total: nothing left to hold back.
    assert_eq!(w.charge(&cluster("c1"), 2000), Admit::Store);
    assert_eq!(a.withheld("small").map(|_| ()), Some(()));
    assert_eq!(w.charge(&cluster("c2"), 1), Admit::Store);
    audit(&a);
    // Room again: both namespaces come back once 90% of the total fits them.
    w.credit(&cluster("c1"));
    w.credit(&cluster("c2"));
    assert_eq!(
        a.withheld("small"),
        None,
        "never dropped by a watch: nothing to relist"
    );
    assert_eq!(a.withheld("large"), None);
    assert_eq!(a.stored_bytes(), 750);
    audit(&a);
}

#[test]
fn a_relist_that_dropped_a_namespace_again_keeps_it_pending() {
    let a = accounts(1000, u64::MAX);
    let (mut w1, ..) = a.register();
    let (mut w2, ..) = a.register();
    w1.charge(&key("t", "a"), 800);
    assert_eq!(w2.charge(&key("t", "b"), 800), Admit::Drop);
    a.dropped(w1.id(), "t");
    w2.credit(&key("t", "b"));
    assert_eq!(a.withheld("t"), Some(Withheld::Relisting));
    a.relisted(w1.id(), &HashSet::new());
    assert_eq!(a.withheld("t"), Some(Withheld::Relisting), "w2 still lists");
    a.relisted(w2.id(), &HashSet::from(["t".to_owned()]));
    assert_eq!(
        a.withheld("t"),
        Some(Withheld::Relisting),
        "dropped again by w2"
    );
    a.relisted(w2.id(), &HashSet::new());
    assert_eq!(a.withheld("t"), None);
    audit(&a);
}

#[test]
fn empty_accounts_are_forgotten() {
    let a = accounts(1000, u64::MAX);
    let (mut w, ..) = a.register();
    w.charge(&key("t", "x"), 10);
    w.credit(&key("t", "x"));
    assert!(a.ledger().namespaces.is_empty());
}

#[test]
fn a_change_charges_in_place_and_a_deletion_credits() {
    let a = accounts(u64::MAX, u64::MAX);
    let (mut w, ..) = a.register();
    w.charge(&key("t", "x"), 100);
    w.charge(&key("t", "x"), 250);
    assert_eq!(
        a.namespace_bytes("t"),
        250,
        "a new version replaces the old"
    );
    w.charge(&key("t", "y"), 50);
    w.credit(&key("t", "x"));
    w.credit(&key("t", "never-charged"));
    assert_eq!((a.namespace_bytes("t"), w.charged(Some("t"))), (50, 50));
    assert_eq!(w.len(), 1);
    audit(&a);
}

#[test]
fn a_relist_replaces_charges_and_credits_what_it_did_not_see_again() {
    let a = accounts(u64::MAX, u64::MAX);
    let (mut w, ..) = a.register();
    w.listing();
    w.charge(&key("t", "a"), 100);
    w.charge(&key("t", "b"), 200);
    w.charge(&cluster("c"), 30);
    assert!(w.listed().is_empty());
    assert_eq!(a.namespace_bytes("t"), 300);
    // Relisted: `a` again (not charged twice), `b` gone meanwhile, `c` new.
    w.listing();
    w.charge(&key("t", "a"), 100);
    w.charge(&key("t", "c"), 50);
    w.charge(&cluster("c"), 30);
    assert_eq!(
        a.namespace_bytes("t"),
        350,
        "until the list is done, `b` is still held"
    );
    assert_eq!(w.listed(), vec![key("t", "b")]);
    assert_eq!(a.namespace_bytes("t"), 150);
    assert_eq!(
        a.stored_bytes(),
        150 + 30,
        "the cluster-scoped object, once"
    );
    audit(&a);
}

#[test]
fn a_list_that_starts_over_midway_credits_what_the_last_one_did_not_bring() {
    let a = accounts(u64::MAX, u64::MAX);
    let (mut w, ..) = a.register();
    w.charge(&key("t", "a"), 100);
    w.charge(&key("t", "b"), 200);
    w.listing();
    w.charge(&key("t", "a"), 100);
    // The watcher failed midway and lists from the start: only `b` and `c` are there now.
    w.listing();
    w.charge(&key("t", "b"), 200);
    w.charge(&key("t", "c"), 5);
    let mut gone = w.listed();
    gone.sort();
    assert_eq!(gone, vec![key("t", "a")]);
    assert_eq!(a.namespace_bytes("t"), 205);
    audit(&a);
}

#[test]
fn a_stopped_watch_credits_all_it_charged_and_leaves_nothing_to_relist() {
    let a = accounts(1000, u64::MAX);
    let (mut w1, ..) = a.register();
    let (mut w2, ..) = a.register();
    w1.charge(&key("t", "a"), 300);
    w1.charge(&key("u", "a"), 70);
    w1.charge(&cluster("c"), 9);
    w2.charge(&key("t", "b"), 400);
    assert_eq!(
        a.namespace_bytes("t"),
        700,
        "the account is the watches' sum"
    );
    // w2 goes over the cap and drops t's objects.
    assert_eq!(w2.charge(&key("t", "c"), 400), Admit::Drop);
    a.dropped(w1.id(), "t");
    assert!(a.withheld("t").is_some());
    drop(w2);
    assert_eq!(a.namespace_bytes("t"), 300);
    // Under the cap again; only w1 still has t's objects to list again.
    assert_eq!(a.withheld("t"), Some(Withheld::Relisting));
    a.relisted(w1.id(), &HashSet::new());
    assert_eq!(a.withheld("t"), None, "w2, stopped, lists nothing");
    audit(&a);
    drop(w1);
    assert_eq!(a.stored_bytes(), 0);
    assert_eq!(a.watches_charged(), 0);
    assert!(a.ledger().namespaces.is_empty(), "back to zero");
    assert!(a.ledger().cluster.by_watch.is_empty());
}

/// The red team's finding of issue 38, in miniature: team-b holds 20 objects of a kind (about
/// 3.6 MiB) that only team-a's controller watches; team-a starts and stops that controller 25
/// times. Each start lists the kind again; each stop must give it all back, so team-b stays
/// at what its own controller's watch charges, and is never held back.
#[test]
fn starting_and_stopping_watches_leaves_the_accounts_at_their_baseline() {
    let a = accounts(64 << 20, 1 << 30);
    let (mut own, ..) = a.register();
    own.charge(&key("team-b", "probe"), 2_000);
    let baseline = (a.namespace_bytes("team-b"), a.stored_bytes());
    for _ in 0..25 {
        let (mut other_kind, ..) = a.register();
        other_kind.listing();
        for i in 0..20 {
            assert_eq!(
                other_kind.charge(&key("team-b", &format!("large-{i}")), 185 << 10),
                Admit::Store
            );
        }
        other_kind.listed();
        assert_eq!(a.namespace_bytes("team-b"), baseline.0 + 20 * (185 << 10));
        drop(other_kind);
        assert_eq!((a.namespace_bytes("team-b"), a.stored_bytes()), baseline);
    }
    assert_eq!(a.withheld("team-b"), None);
    assert_eq!(a.watches_charged(), 1);
    audit(&a);
}

#[test]
fn weight_is_the_json_length_and_the_cost_of_maps_strings_and_elements() {
    // 2 maps, 4 strings (keys "a", "d", "e" and value "b,{\"c"), 3 commas outside strings.
    let v = serde_json::json!({"a": "b,{\"c", "d": [1, 2], "e": {}});
    let text = v.to_string();
    assert_eq!(
        weigh(&v),
        text.len() as u64 + 2 * MAP_COST + 4 * STRING_COST + 3 * ELEMENT_COST
    );
}
