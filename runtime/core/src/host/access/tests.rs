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
fn missing_reads_say_what_and_grant_everything_the_spec_needs_at_once() {
    let mut needed = NeededRules::default();
    needed.add("", "configmaps", &["get", "list", "watch"]);
    needed.add(
        "example.com",
        "helloworlds",
        &["get", "list", "watch", "patch"],
    );
    needed.add("example.com", "helloworlds/status", &["patch"]);
    needed.add(
        "",
        "pods",
        &["create", "patch", "delete", "get", "list", "watch"],
    );
    needed.add("", "configmaps", &["get"]);
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
        needed,
        every: Duration::from_secs(60),
    };
    let text = missing.to_string();
    assert!(
        text.contains("ServiceAccount team-a/prober may not get/list/watch configmaps, watch helloworlds.example.com in namespace team-a"),
        "{text}"
    );
    assert!(text.contains("asks again every 60 s"), "{text}");
    // The fix is one command whose JSON is a Role with every rule and its binding.
    let json = text
        .split("echo '")
        .nth(1)
        .and_then(|rest| rest.split("' | kubectl apply -f -").next())
        .unwrap_or_else(|| panic!("no `echo '…' | kubectl apply -f -` in {text}"));
    let list: serde_json::Value = serde_json::from_str(json).unwrap();
    let role = &list["items"][0];
    assert_eq!(role["kind"], "Role");
    assert_eq!(role["metadata"]["name"], "kubewasm-probes");
    assert_eq!(role["metadata"]["namespace"], "team-a");
    assert_eq!(
        role["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete", "get", "list", "patch", "watch"]},
            {"apiGroups": ["example.com"], "resources": ["helloworlds"], "verbs": ["get", "list", "patch", "watch"]},
            {"apiGroups": ["example.com"], "resources": ["helloworlds/status"], "verbs": ["patch"]},
        ])
    );
    let binding = &list["items"][1];
    assert_eq!(binding["kind"], "RoleBinding");
    assert_eq!(binding["roleRef"]["name"], "kubewasm-probes");
    assert_eq!(
        binding["subjects"][0],
        serde_json::json!({"kind": "ServiceAccount", "name": "prober", "namespace": "team-a"})
    );
    let cluster = MissingReads {
        namespace: None,
        ..missing
    };
    let text = cluster.to_string();
    assert!(
        text.contains("watch helloworlds.example.com cluster-wide, and the controller is handed objects of those kinds")
            && text.contains(r#""kind":"ClusterRole","metadata":{"name":"kubewasm-probes"}"#)
            && text.contains(r#""kind":"ClusterRoleBinding""#),
        "{text}"
    );
}
