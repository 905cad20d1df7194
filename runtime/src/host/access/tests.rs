//! Access reviews' rules, without a cluster.
use super::*;

fn rule(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> ResourceRule {
    let list = |items: &[&str]| Some(items.iter().map(|s| s.to_string()).collect());
    ResourceRule {
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        api_groups: list(groups),
        resources: list(resources),
        resource_names: if names.is_empty() { None } else { list(names) },
    }
}

#[test]
fn rules_allow_as_rbac_does() {
    let rules = [
        rule(&["get", "list", "watch"], &[""], &["configmaps"], &[]),
        rule(&["*"], &["example.com"], &["helloworlds"], &[]),
        rule(&["get"], &["*"], &["*"], &["one-secret"]),
        rule(&["list"], &["apps"], &["*"], &[]),
    ];
    assert!(rules_allow(&rules, "watch", "", "configmaps"));
    assert!(!rules_allow(&rules, "delete", "", "configmaps"));
    // The group must match: configmaps are in the core group only.
    assert!(!rules_allow(&rules, "get", "example.com", "configmaps"));
    assert!(rules_allow(&rules, "watch", "example.com", "helloworlds"));
    assert!(!rules_allow(&rules, "watch", "example.com", "guitars"));
    // A rule naming objects allows no read of every object.
    assert!(!rules_allow(&rules, "get", "", "secrets"));
    assert!(rules_allow(&rules, "list", "apps", "deployments"));
    assert!(!rules_allow(&rules, "watch", "apps", "deployments"));
    assert!(!rules_allow(&[], "get", "", "pods"));
}

#[test]
fn missing_reads_say_what_and_how_to_grant_it() {
    let missing = MissingReads {
        account: ServiceAccount {
            namespace: "team-a".into(),
            name: "prober".into(),
        },
        namespace: Some("team-a".into()),
        controller: "probes".into(),
        missing: BTreeMap::from([
            ("configmaps".to_owned(), vec!["get", "list", "watch"]),
            ("helloworlds.example.com".to_owned(), vec!["watch"]),
        ]),
    };
    let text = missing.to_string();
    assert!(
        text.contains("ServiceAccount team-a/prober may not get/list/watch configmaps, watch helloworlds.example.com in namespace team-a"),
        "{text}"
    );
    assert!(
        text.contains("kubectl -n team-a create role kubewasm-reads-probes --verb=get,list,watch --resource=configmaps,helloworlds.example.com && kubectl -n team-a create rolebinding kubewasm-reads-probes --role=kubewasm-reads-probes --serviceaccount=team-a:prober"),
        "{text}"
    );
    let cluster = MissingReads {
        namespace: None,
        ..missing
    };
    assert!(
        cluster
            .to_string()
            .contains("watch helloworlds.example.com cluster-wide, and the controller is handed objects of those kinds; grant them with: kubectl create clusterrole kubewasm-reads-probes"),
        "{cluster}"
    );
}
