//! The accounts' rules, without a cluster.
use super::*;

fn accounts(per_namespace: u64, total: u64) -> CacheAccounts {
    CacheAccounts::new(CacheCaps {
        per_namespace,
        total,
    })
}

#[test]
fn a_namespace_over_its_cap_is_held_back_and_let_in_again_under_ninety_percent() {
    let a = accounts(1000, u64::MAX);
    let (w, mut held, readmitted) = a.register();
    assert_eq!(a.charge(w, Some("team-a"), 0, 600), Admit::Store);
    assert_eq!(a.charge(w, Some("team-b"), 0, 900), Admit::Store);
    assert_eq!(a.withheld("team-a"), None);
    // Over: this object and every later one of team-a are dropped; team-b is untouched.
    assert_eq!(a.charge(w, Some("team-a"), 0, 500), Admit::Drop);
    assert_eq!(held.try_recv().ok().as_deref(), Some("team-a"));
    assert_eq!(
        a.withheld("team-a"),
        Some(Withheld::OverNamespaceCap {
            bytes: 1100,
            cap: 1000
        })
    );
    assert_eq!(a.stored_bytes(), 900, "team-a's bytes are given back");
    assert_eq!(a.charge(w, Some("team-a"), 0, 10), Admit::Drop);
    assert_eq!(a.charge(w, Some("team-b"), 0, 50), Admit::Store);
    // Shrinking to 920 (over 90%) is not enough; to 820 is.
    assert_eq!(a.charge(w, Some("team-a"), 600, 410), Admit::Drop);
    assert!(a.withheld("team-a").is_some());
    assert!(!readmitted.has_changed().unwrap_or(true));
    a.charge(w, Some("team-a"), 410, 310);
    assert!(readmitted.has_changed().unwrap_or(false));
    // Let back in, but not handed out until the watch that dropped objects has listed.
    assert_eq!(a.withheld("team-a"), Some(Withheld::Relisting));
    assert!(a.wants_relist(w));
    a.relisted(w, &HashSet::new());
    assert_eq!(a.withheld("team-a"), None);
    assert!(!a.wants_relist(w));
    assert_eq!(a.stored_bytes(), 820 + 950);
}

#[test]
fn over_the_total_the_largest_namespace_is_held_back_and_cluster_objects_never() {
    let a = accounts(u64::MAX, 1000);
    let (w, _held, _) = a.register();
    a.charge(w, None, 0, 300);
    a.charge(w, Some("small"), 0, 200);
    a.charge(w, Some("large"), 0, 400);
    assert_eq!(a.charge(w, Some("small"), 0, 150), Admit::Store);
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
    assert_eq!(a.charge(w, None, 300, 2000), Admit::Store);
    assert_eq!(a.withheld("small").map(|_| ()), Some(()));
    assert_eq!(a.charge(w, None, 0, 1), Admit::Store);
    // Room again: both namespaces come back once 90% of the total fits them.
    a.charge(w, None, 2001, 0);
    assert_eq!(
        a.withheld("small"),
        None,
        "never dropped by a watch: nothing to relist"
    );
    assert_eq!(a.withheld("large"), None);
}

#[test]
fn a_relist_that_dropped_a_namespace_again_keeps_it_pending() {
    let a = accounts(1000, u64::MAX);
    let (w1, ..) = a.register();
    let (w2, ..) = a.register();
    a.charge(w1, Some("t"), 0, 800);
    assert_eq!(a.charge(w2, Some("t"), 0, 800), Admit::Drop);
    a.dropped(w1, "t");
    a.charge(w2, Some("t"), 800, 0);
    assert_eq!(a.withheld("t"), Some(Withheld::Relisting));
    a.relisted(w1, &HashSet::new());
    assert_eq!(a.withheld("t"), Some(Withheld::Relisting), "w2 still lists");
    a.relisted(w2, &HashSet::from(["t".to_owned()]));
    assert_eq!(
        a.withheld("t"),
        Some(Withheld::Relisting),
        "dropped again by w2"
    );
    a.relisted(w2, &HashSet::new());
    assert_eq!(a.withheld("t"), None);
}

#[test]
fn empty_accounts_are_forgotten() {
    let a = accounts(1000, u64::MAX);
    let (w, ..) = a.register();
    a.charge(w, Some("t"), 0, 10);
    a.charge(w, Some("t"), 10, 0);
    assert!(a.ledger().namespaces.is_empty());
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
