use super::*;

fn spec(yaml: &str) -> WasmControllerSpec {
    serde_yaml::from_str(yaml).unwrap()
}

const HELLO: &str = "module: {configMap: {name: hello, key: m.wasm}}
parent: {apiVersion: example.com/v1, kind: HelloWorld, labelSelector: tier=web}
children: [{apiVersion: v1, kind: Pod, updateStrategy: Recreate}]
grants:
- {apiVersion: v1, kind: ConfigMap, verbs: [get]}
- {apiVersion: v1, kind: Secret, verbs: [apply]}
serviceAccountName: hello
finalize: true";

#[test]
fn a_spec_is_parsed_once_into_its_plan() {
    let plan = Plan::of(&spec(HELLO), Some("team"));
    assert_eq!(
        plan.source.unwrap(),
        Source::ConfigMap {
            namespace: "team".into(),
            name: "hello".into(),
            key: "m.wasm".into()
        }
    );
    assert_eq!(plan.account.unwrap(), ("team".into(), "hello".into()));
    let c = plan.controller.unwrap();
    assert_eq!(c.parent.kind, "HelloWorld");
    assert!(c.selector.is_some());
    assert_eq!(c.children[0].1, UpdateStrategy::Recreate);
    assert!(c.finalize);
    let declared: Vec<&str> = c.declared().map(|(_, k)| k.kind.as_str()).collect();
    assert_eq!(declared, ["HelloWorld", "Pod", "ConfigMap", "Secret"]);
    // A grant that only applies hands the guest no objects.
    let readable: Vec<&str> = c.readable().map(|(_, k)| k.kind.as_str()).collect();
    assert_eq!(readable, ["HelloWorld", "Pod", "ConfigMap"]);
}

#[test]
fn a_spec_wrong_in_its_parent_still_names_its_module_and_account() {
    let wrong = HELLO.replace("example.com/v1", "example.com/v1/extra");
    let plan = Plan::of(&spec(&wrong), Some("team"));
    let e = plan.controller.unwrap_err();
    assert!(e.starts_with("spec.parent: "), "{e}");
    assert!(plan.source.is_ok(), "its module still loads");
    assert!(plan.account.is_ok());

    let selector = HELLO.replace("tier=web", "tier in (");
    let e = Plan::of(&spec(&selector), Some("team"))
        .controller
        .unwrap_err();
    assert!(
        e.starts_with("spec.parent.labelSelector `tier in (`"),
        "{e}"
    );

    let child = HELLO.replace("kind: Pod", "kind: pod!");
    let e = Plan::of(&spec(&child), Some("team"))
        .controller
        .unwrap_err();
    assert!(e.starts_with("spec.children: "), "{e}");

    let limits = format!("{HELLO}\nlimits: {{memory: lots}}");
    let e = Plan::of(&spec(&limits), Some("team"))
        .controller
        .unwrap_err();
    assert!(e.contains("spec.limits.memory"), "{e}");
}

#[test]
fn a_spec_wrong_in_its_module_or_account_fails_that_part_alone() {
    let module = HELLO.replace("name: hello,", "name: Hello_World,");
    let plan = Plan::of(&spec(&module), Some("team"));
    let e = plan.source.unwrap_err();
    assert!(e.starts_with("spec.module.configMap.name: "), "{e}");
    assert!(plan.controller.is_ok());

    let account = HELLO.replace(
        "serviceAccountName: hello",
        "serviceAccountName: Not/A/Name",
    );
    let plan = Plan::of(&spec(&account), Some("team"));
    let e = plan.account.unwrap_err();
    assert!(e.starts_with("spec.serviceAccountName: "), "{e}");
    assert!(plan.source.is_ok() && plan.controller.is_ok());
}

#[test]
fn a_spec_declares_at_most_so_many_kinds() {
    let grants: String = (0..MAX_DECLARED_KINDS)
        .map(|i| format!("\n- {{apiVersion: v1, kind: Kind{i}, verbs: [get]}}"))
        .collect();
    let many = format!(
        "module: {{path: /m.wasm}}\nparent: {{apiVersion: v1, kind: ConfigMap}}\ngrants:{grants}"
    );
    let e = Plan::of(&spec(&many), None).controller.unwrap_err();
    assert!(e.contains("at most 32"), "{e}");
}

/// The part of `yaml`'s plan (as a WasmController of namespace `team`) that failed, checked
/// to be one line.
fn refused(yaml: &str) -> String {
    let plan = Plan::of(&spec(yaml), Some("team"));
    let e = [plan.source.err(), plan.account.err(), plan.controller.err()]
        .into_iter()
        .flatten()
        .next()
        .expect("a part fails");
    assert!(!e.contains('\n'), "{e}");
    e
}

#[test]
fn specs_that_would_reach_a_url_or_a_key_unparsed_are_refused() {
    let plan = Plan::of(
        &spec(
            "module: {configMap: {name: hello-controller, key: hello_world.wasm}}\nparent: {apiVersion: example.com/v1, kind: HelloWorld}\nchildren: [{apiVersion: v1, kind: Pod}]\ngrants: [{apiVersion: apps/v1, kind: Deployment, verbs: [get]}]\nserviceAccountName: hello-controller",
        ),
        Some("team"),
    );
    assert!(plan.source.is_ok() && plan.account.is_ok() && plan.controller.is_ok());
    // The two strings a hostile tenant tried: a watch URL of another namespace and a query.
    let m = refused(
        "module: {configMap: {name: m, key: k}}\nparent: {apiVersion: 'apps/v1/namespaces/team-a/deployments?watch=1&timeoutSeconds=86400', kind: Deployment}",
    );
    assert!(m.starts_with("spec.parent: invalid apiVersion"), "{m}");
    let m = refused(
        "module: {configMap: {name: m, key: k}}\nparent: {apiVersion: v1, kind: ConfigMap}\nchildren: [{apiVersion: 'apps/v1?a=b', kind: Deployment}]",
    );
    assert!(m.starts_with("spec.children: invalid apiVersion"), "{m}");
    let m = refused(
        "module: {configMap: {name: m, key: k}}\nparent: {apiVersion: v1, kind: ConfigMap}\ngrants: [{apiVersion: v1, kind: 'Pod/status', verbs: [get]}]",
    );
    assert!(m.starts_with("spec.grants: invalid kind"), "{m}");
    let m = refused(
        "module: {configMap: {name: m, key: k}}\nparent: {apiVersion: v1, kind: ConfigMap}\nserviceAccountName: 'x:y'",
    );
    assert!(
        m.starts_with("spec.serviceAccountName: invalid name"),
        "{m}"
    );
    let m = refused(
        "module: {configMap: {name: 'm,metadata.name=x', key: k}}\nparent: {apiVersion: v1, kind: ConfigMap}",
    );
    assert!(m.starts_with("spec.module.configMap.name"), "{m}");
    let m = refused(
        "module: {configMap: {name: m, key: k, namespace: 'A\\nB'}}\nparent: {apiVersion: v1, kind: ConfigMap}",
    );
    assert!(m.contains("\\n"), "escaped: {m}");
}

#[test]
fn a_candidate_is_parsed_like_the_module_and_its_errors_name_it() {
    let plan = Plan::of(&spec(HELLO), Some("team"));
    assert!(plan.candidate.is_none());
    assert_eq!(plan.rollout.sample_every, 1);
    assert_eq!(plan.rollout.promote_after, None);
    let with = format!(
        "{HELLO}\ncandidate: {{image: registry.example/hello:v2}}\nrollout: {{sampleEvery: 10, promoteAfter: 100}}"
    );
    let plan = Plan::of(&spec(&with), Some("team"));
    assert!(matches!(plan.candidate, Some(Ok(Source::Oci { .. }))));
    assert_eq!(plan.rollout.sample_every, 10);
    assert_eq!(plan.rollout.promote_after, Some(100));
    // A wrong candidate leaves the module and the controller's plan whole.
    let wrong = format!(
        "{HELLO}\ncandidate: {{image: registry.example/hello:v2, configMap: {{name: x, key: y}}}}"
    );
    let plan = Plan::of(&spec(&wrong), Some("team"));
    assert!(plan.source.is_ok() && plan.controller.is_ok());
    let err = plan.candidate.unwrap().unwrap_err();
    assert_eq!(
        err,
        "spec.candidate names both configMap and image; name exactly one"
    );
    let hostile = format!("{HELLO}\ncandidate: {{configMap: {{name: \"Bad Name\", key: y}}}}");
    let err = Plan::of(&spec(&hostile), Some("team"))
        .candidate
        .unwrap()
        .unwrap_err();
    assert!(err.starts_with("spec.candidate.configMap.name: "), "{err}");
}
