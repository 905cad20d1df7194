//! The `kubewasm` binary, run as a user would: the two seed scenarios offline, a controller
//! whose module is in a ConfigMap, grants refusing a read, and bad input of every kind
//! ending in a non-zero exit and a message that says what is wrong.

use kubewasm_test_support::guests as common;

use std::ffi::OsStr;
use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use kubewasm::sandbox::Digest;
use serde::Deserialize as _;
use serde_json::Value;

#[path = "cli/capsules.rs"]
mod capsules;

/// No run of the binary may take longer; a hung one fails the test instead of hanging it.
const WATCHDOG: Duration = Duration::from_secs(60);

/// What one run of the binary did.
struct Run {
    args: String,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn success(self) -> Run {
        assert_eq!(
            self.code,
            Some(0),
            "`kubewasm {}` failed\nstdout:\n{}\nstderr:\n{}",
            self.args,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Fails with exit code 1 and an `error:` line on stderr containing every one of `needles`.
    fn failure(self, needles: &[&str]) -> Run {
        assert_eq!(
            self.code,
            Some(1),
            "`kubewasm {}` should fail\nstdout:\n{}\nstderr:\n{}",
            self.args,
            self.stdout,
            self.stderr
        );
        let error = self
            .stderr
            .lines()
            .find(|l| l.starts_with("error: "))
            .unwrap_or_else(|| panic!("no `error:` line on stderr:\n{}", self.stderr));
        for needle in needles {
            assert!(
                error.contains(needle),
                "`kubewasm {}`: error line lacks {needle:?}:\n{error}",
                self.args
            );
        }
        self
    }

    /// The YAML documents on stdout (documents that are only comments are left out).
    fn documents(&self) -> Vec<Value> {
        serde_yaml::Deserializer::from_str(&self.stdout)
            .map(|doc| Value::deserialize(doc).expect("stdout is YAML"))
            .filter(|v| !v.is_null())
            .collect()
    }
}

fn kubewasm<S: AsRef<OsStr>>(args: &[S]) -> Run {
    let shown = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubewasm"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("KUBEWASM_LOG_FORMAT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the kubewasm binary");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            pipe.read_to_string(&mut text).expect("reading output");
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for kubewasm") {
            break status;
        }
        if started.elapsed() > WATCHDOG {
            let _ = child.kill();
            panic!("`kubewasm {shown}` did not exit within {WATCHDOG:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Run {
        args: shown,
        code: status.code(),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn write(dir: &Path, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("writing a test file");
    path
}

fn read_yaml(path: &Path) -> Value {
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn write_yaml(dir: &Path, name: &str, value: &Value) -> PathBuf {
    write(dir, name, serde_yaml::to_string(value).unwrap())
}

/// The comment lines the CLI writes for actions that are not applies.
fn action_comments(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| l.starts_with("# action "))
        .collect()
}

#[test]
fn hello_world_seed_scenario_prints_the_pod() {
    let run = kubewasm(&[
        OsStr::new("reconcile"),
        OsStr::new("--module"),
        common::guest("hello_world").as_os_str(),
        OsStr::new("--object"),
        fixture("your-name.yaml").as_os_str(),
    ])
    .success();
    let docs = run.documents();
    assert_eq!(docs.len(), 1, "one object to apply: {docs:?}");
    let pod = &docs[0];
    assert_eq!(pod["apiVersion"], "v1");
    assert_eq!(pod["kind"], "Pod");
    assert_eq!(pod["metadata"]["name"], "your-name");
    let containers = pod["spec"]["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "{pod}");
    assert_eq!(
        containers[0]["command"],
        serde_json::json!(["echo", "Hello, Your Name!"])
    );
    assert_eq!(
        action_comments(&run.stdout),
        [
            "# action 1: apply Pod your-name",
            "# action 2: set status of HelloWorld your-name to:"
        ]
    );
    assert!(
        run.stderr
            .contains("reconciled HelloWorld your-name with sha256:"),
        "{}",
        run.stderr
    );
}

/// With `--controller`, the output is what the runtime sends: a declared child carries the
/// parent's controller ownerReference and the drift annotation; a parent the selector leaves
/// out is not reconciled at all.
#[test]
fn reconcile_with_a_controller_shows_what_the_runtime_adds_and_applies_its_selector() {
    let dir = tempfile::tempdir().unwrap();
    let mut parent = read_yaml(&fixture("your-name.yaml"));
    parent["metadata"]["namespace"] = "hello".into();
    parent["metadata"]["uid"] = "u-1".into();
    parent["metadata"]["labels"] = serde_json::json!({"team": "a"});
    let object = write_yaml(dir.path(), "parent.yaml", &parent);
    let controller =
        kubewasm_test_support::workspace().join("deploy/examples/hello-world/controller.yaml");
    let module = common::guest("hello_world");
    let run = |controller: &Path| {
        kubewasm(&[
            OsStr::new("reconcile"),
            OsStr::new("--controller"),
            controller.as_os_str(),
            OsStr::new("--module"),
            module.as_os_str(),
            OsStr::new("--object"),
            object.as_os_str(),
        ])
        .success()
    };
    let shown = run(&controller);
    let docs = shown.documents();
    assert_eq!(docs.len(), 1, "{}", shown.stdout);
    let owner = &docs[0]["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            &owner["kind"],
            &owner["name"],
            &owner["uid"],
            &owner["controller"]
        ),
        (
            &Value::from("HelloWorld"),
            &Value::from("your-name"),
            &Value::from("u-1"),
            &Value::from(true)
        ),
        "{}",
        shown.stdout
    );
    assert!(
        docs[0]["metadata"]["annotations"]["kubewasm.dev/desired-sha256"].is_string(),
        "{}",
        shown.stdout
    );
    assert!(
        shown.stdout.contains("a declared child: the runtime adds"),
        "{}",
        shown.stdout
    );

    let mut selective = read_yaml(&controller);
    selective["spec"]["parent"]["labelSelector"] = "team=b".into();
    let selective = write_yaml(dir.path(), "selective.yaml", &selective);
    let skipped = run(&selective);
    assert_eq!(
        skipped.stdout.trim(),
        "# HelloWorld hello/your-name: not reconciled: its labels do not match spec.parent.labelSelector `team=b`"
    );
    assert!(skipped.documents().is_empty());
}

/// A temp dir holding the restarter's module as a ConfigMap (plain or gzipped), its
/// WasmController and the Pods of test-space.
struct Restarter {
    dir: tempfile::TempDir,
    module_digest: Digest,
}

impl Restarter {
    fn new(gzip: bool) -> Restarter {
        let dir = tempfile::tempdir().unwrap();
        let wasm = std::fs::read(common::guest("configmap_restarter")).unwrap();
        let stored = if gzip {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            gz.write_all(&wasm).unwrap();
            gz.finish().unwrap()
        } else {
            wasm.clone()
        };
        let config_map = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: configmap-restarter-module\n  namespace: test-space\nbinaryData:\n  restarter.wasm: {}\n",
            base64::engine::general_purpose::STANDARD.encode(&stored)
        );
        write(dir.path(), "module.yaml", config_map);
        Restarter {
            dir,
            module_digest: Digest::of(&wasm),
        }
    }

    fn reconcile(&self, object: &Path, saved: Option<&str>) -> Run {
        let mut args: Vec<std::ffi::OsString> = vec![
            "reconcile".into(),
            "--controller".into(),
            fixture("restarter-controller.yaml").into(),
            "--object".into(),
            object.into(),
            "--state".into(),
            self.dir.path().join("module.yaml").into(),
            "--state".into(),
            fixture("pods.yaml").into(),
        ];
        if let Some(saved) = saved {
            args.extend(["--saved".into(), saved.into()]);
        }
        kubewasm(&args)
    }

    /// First sighting, then the same data again, then changed data: save, nothing, restart.
    fn check_the_whole_story(&self) {
        // First sighting: only the digest is saved, as the controller's state.
        let config = fixture("frontend-config.yaml");
        let first = self.reconcile(&config, None).success();
        assert!(
            first.stderr.contains(&format!(
                "reconciled ConfigMap test-space/frontend-config with {}",
                self.module_digest
            )),
            "{}",
            first.stderr
        );
        let comments = action_comments(&first.stdout);
        assert_eq!(comments.len(), 1, "{}", first.stdout);
        let digest = comments[0]
            .strip_prefix("# action 1: save state for ConfigMap test-space/frontend-config: ")
            .unwrap_or_else(|| panic!("not a saved state: {}", comments[0]))
            .to_owned();
        assert!(digest.starts_with("sha256:"), "{digest}");
        assert!(
            first.documents().is_empty(),
            "nothing applied: {}",
            first.stdout
        );

        // Same data, digest saved: nothing to do.
        let again = self.reconcile(&config, Some(&digest)).success();
        assert_eq!(
            again.stdout.trim(),
            "# ConfigMap test-space/frontend-config: nothing to do"
        );

        // Changed data: delete the matching Pods, save the new digest, say so in an Event.
        let mut changed = read_yaml(&config);
        changed["data"]["TEXT1"] = "Good morning".into();
        let changed_path = write_yaml(self.dir.path(), "changed.yaml", &changed);
        let restart = self.reconcile(&changed_path, Some(&digest)).success();
        let comments = action_comments(&restart.stdout);
        assert_eq!(comments.len(), 4, "{}", restart.stdout);
        let new_digest = comments[2]
            .strip_prefix("# action 3: save state for ConfigMap test-space/frontend-config: ")
            .unwrap_or_else(|| panic!("not a saved state: {}", comments[2]));
        assert!(new_digest.starts_with("sha256:") && new_digest != digest);
        assert_eq!(
            comments[0],
            format!(
                "# action 1: save state for ConfigMap test-space/frontend-config: pending:{new_digest}"
            )
        );
        assert_eq!(
            comments[1],
            "# action 2: delete every Pod (v1) in namespace test-space matching `app=frontend`"
        );
        assert!(
            comments[3].starts_with(
                "# action 4: record Normal Event on ConfigMap test-space/frontend-config: PodsRestarted: "
            ),
            "{}",
            comments[3]
        );
        assert!(
            restart.documents().is_empty(),
            "nothing applied: {}",
            restart.stdout
        );
    }
}

#[test]
fn restarter_from_a_configmap_module() {
    Restarter::new(false).check_the_whole_story();
}

#[test]
fn restarter_from_a_gzipped_configmap_module() {
    Restarter::new(true).check_the_whole_story();
}

#[test]
fn controller_module_configmap_must_be_given() {
    kubewasm(&[
        OsStr::new("reconcile"),
        OsStr::new("--controller"),
        fixture("restarter-controller.yaml").as_os_str(),
        OsStr::new("--object"),
        fixture("frontend-config.yaml").as_os_str(),
    ])
    .failure(&[
        "ConfigMap `configmap-restarter-module`",
        "pass that ConfigMap with --state",
    ]);
}

/// A WasmController for the hostile guest in a temp dir (its module is given with
/// `--module`, which takes the place of the spec's ConfigMap offline).
fn hostile_controller(dir: &Path, extra_spec: &str) -> PathBuf {
    let yaml = format!(
        "apiVersion: kubewasm.dev/v1alpha1\nkind: WasmController\nmetadata: {{name: hostile, namespace: test-space}}\nspec:\n  module: {{configMap: {{name: hostile, key: hostile.wasm}}}}\n  parent: {{apiVersion: v1, kind: Thing}}\n{extra_spec}"
    );
    write(dir, "controller.yaml", yaml)
}

fn thing(dir: &Path, mode: &str) -> PathBuf {
    write(
        dir,
        &format!("thing-{mode}.yaml"),
        format!(
            "apiVersion: v1\nkind: Thing\nmetadata: {{name: t, namespace: test-space}}\nspec: {{mode: {mode}}}\n"
        ),
    )
}

#[test]
fn reads_outside_the_grants_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config_maps = write(
        dir.path(),
        "config-maps.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: test-space}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b, namespace: test-space}\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: elsewhere}\n",
    );
    let hostile = common::guest("hostile");
    let run = |controller: &Path| {
        kubewasm(&[
            OsStr::new("reconcile"),
            OsStr::new("--controller"),
            controller.as_os_str(),
            OsStr::new("--module"),
            hostile.as_os_str(),
            OsStr::new("--object"),
            thing(dir.path(), "read").as_os_str(),
            OsStr::new("--state"),
            config_maps.as_os_str(),
        ])
    };

    // No grant for ConfigMaps: the host refuses the list, the hostile guest returns the
    // refusal as its (retryable) error, and the reconcile fails with it.
    let denied = run(&hostile_controller(dir.path(), ""));
    denied.failure(&[
        "reconcile of Thing test-space/t failed",
        "reconcile failed: test-space/hostile may not list ConfigMap (v1) in namespace test-space",
        "add {apiVersion: v1, kind: ConfigMap, verbs: [list]} to spec.grants",
    ]);

    // With the grant, the guest sees the two ConfigMaps of its own namespace.
    let granted = hostile_controller(
        dir.path(),
        "  grants: [{apiVersion: v1, kind: ConfigMap, verbs: [list]}]\n",
    );
    let run = run(&granted).success();
    assert_eq!(
        run.stdout,
        "# action 1: set status of Thing test-space/t to:\n#   seen: 2\n"
    );
}

#[test]
fn guest_traps_are_reported() {
    // The loop meets a 200 ms deadline; the other traps get 20 s, so that a loaded machine
    // cannot turn them into timeouts.
    let (short, long) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let hostile = common::guest("hostile");
    let run = |dir: &Path, limits: &str, mode: &str| {
        let controller = hostile_controller(dir, limits);
        kubewasm(&[
            OsStr::new("reconcile"),
            OsStr::new("--controller"),
            controller.as_os_str(),
            OsStr::new("--module"),
            hostile.as_os_str(),
            OsStr::new("--object"),
            thing(dir, mode).as_os_str(),
        ])
    };
    run(short.path(), "  limits: {timeoutMillis: 200}\n", "loop").failure(&[
        "reconcile of Thing test-space/t failed",
        "timed out",
        "200ms",
    ]);
    let patient = "  limits: {timeoutMillis: 20000}\n";
    run(long.path(), patient, "panic")
        .failure(&["guest panicked: hostile guest panicked on purpose"]);
    run(long.path(), patient, "alloc").failure(&["memory limit exceeded"]);
}

#[test]
fn a_wasm_controller_naming_a_module_file_is_refused_offline_as_live() {
    let dir = tempfile::tempdir().unwrap();
    let controller = write(
        dir.path(),
        "controller.yaml",
        format!(
            "apiVersion: kubewasm.dev/v1alpha1\nkind: WasmController\nmetadata: {{name: hello}}\nspec:\n  module: {{path: {:?}}}\n  parent: {{apiVersion: example.com/v1, kind: HelloWorld}}\n",
            common::guest("hello_world").display()
        ),
    );
    kubewasm(&[
        OsStr::new("reconcile"),
        OsStr::new("--controller"),
        controller.as_os_str(),
        OsStr::new("--object"),
        fixture("your-name.yaml").as_os_str(),
    ])
    .failure(&[
        "a WasmController may not load a module from a file",
        "offline, give the module with --module",
    ]);
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.wasm");
    kubewasm(&[
        OsStr::new("reconcile"),
        OsStr::new("--module"),
        missing.as_os_str(),
        OsStr::new("--object"),
        fixture("your-name.yaml").as_os_str(),
    ])
    .failure(&["cannot read module", "nope.wasm"]);

    let missing = dir.path().join("nope.yaml");
    kubewasm(&[
        OsStr::new("reconcile"),
        OsStr::new("--module"),
        common::guest("hello_world").as_os_str(),
        OsStr::new("--object"),
        missing.as_os_str(),
    ])
    .failure(&["cannot read", "nope.yaml"]);
}

/// `reconcile --module <file>` and `check <file>` on a module that is not a guest.
fn assert_module_refused(module: &Path, needles: &[&str]) {
    kubewasm(&[
        OsStr::new("reconcile"),
        OsStr::new("--module"),
        module.as_os_str(),
        OsStr::new("--object"),
        fixture("your-name.yaml").as_os_str(),
    ])
    .failure(needles);
    kubewasm(&[OsStr::new("check"), module.as_os_str()]).failure(needles);
}

#[test]
fn modules_that_are_not_guests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = write(dir.path(), "guest.wasm", "this is not wasm\n");
    assert_module_refused(&text, &["not a usable guest", "not a WebAssembly file"]);
    let core = write(dir.path(), "core.wasm", b"\0asm\x01\0\0\0");
    assert_module_refused(&core, &["core WebAssembly module, not a component"]);
    let empty = write(dir.path(), "empty.wasm", b"\0asm\x0d\0\x01\0");
    assert_module_refused(
        &empty,
        &["not a kubewasm controller (world `kubewasm:controller/controller@0.3.0`)"],
    );
}

#[test]
fn malformed_objects_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = |object: &Path| {
        kubewasm(&[
            OsStr::new("reconcile"),
            OsStr::new("--module"),
            common::guest("hello_world").as_os_str(),
            OsStr::new("--object"),
            object.as_os_str(),
        ])
    };
    let broken = write(
        dir.path(),
        "broken.yaml",
        "apiVersion: v1\nkind: [HelloWorld\n",
    );
    run(&broken).failure(&["broken.yaml", "is not valid YAML"]);
    let no_kind = write(
        dir.path(),
        "no-kind.yaml",
        "apiVersion: v1\nmetadata: {name: x}\n",
    );
    run(&no_kind).failure(&["no-kind.yaml", "missing `kind`"]);
    let two = write(dir.path(), "two.yaml", "kind: A\n---\nkind: B\n");
    run(&two).failure(&["holds 2 objects"]);
}

#[test]
fn pinned_digest_must_match() {
    let dir = tempfile::tempdir().unwrap();
    let controller = write(
        dir.path(),
        "controller.yaml",
        "apiVersion: kubewasm.dev/v1alpha1\nkind: WasmController\nmetadata: {name: hello}\nspec:\n  module: {configMap: {name: hello, key: hello.wasm}, sha256: \"00\"}\n  parent: {apiVersion: example.com/v1, kind: HelloWorld}\n",
    );
    kubewasm(&[
        OsStr::new("reconcile"),
        OsStr::new("--controller"),
        controller.as_os_str(),
        OsStr::new("--module"),
        common::guest("hello_world").as_os_str(),
        OsStr::new("--object"),
        fixture("your-name.yaml").as_os_str(),
    ])
    .failure(&["not the spec.module.sha256 pin sha256:00"]);
}

#[test]
fn check_prints_the_digest_of_a_good_module() {
    let path = common::guest("hello_world");
    let run = kubewasm(&[OsStr::new("check"), path.as_os_str()]).success();
    let digest = Digest::of(&std::fs::read(&path).unwrap());
    assert!(
        run.stdout.contains(&format!("digest: {digest}\n")),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("digest: sha256:"), "{}", run.stdout);
}

#[test]
fn crds_prints_both_crds() {
    let run = kubewasm(&["crds"]).success();
    let docs = run.documents();
    let names: Vec<&str> = docs
        .iter()
        .map(|d| {
            assert_eq!(d["kind"], "CustomResourceDefinition", "{d}");
            d["metadata"]["name"].as_str().expect("a CRD name")
        })
        .collect();
    assert_eq!(
        names,
        [
            "wasmcontrollers.kubewasm.dev",
            "clusterwasmcontrollers.kubewasm.dev",
            "wasmcontrollerstates.kubewasm.dev"
        ]
    );
}

/// `kubewasm run`'s defaults are the library's own, written once: the help shows them.
#[test]
fn run_help_shows_the_library_defaults() {
    let help = kubewasm(&["run", "--help"]).success().stdout;
    for (flag, default) in [
        ("--max-memory", "256Mi"),
        ("--max-timeout-millis", "10000"),
        ("--max-response-bytes", "4Mi"),
        ("--max-cached-bytes-per-namespace", "64Mi"),
        ("--max-cached-bytes", "1Gi"),
        ("--max-state-bytes-per-namespace", "32Mi"),
        ("--max-writes-per-second", "1000"),
        ("--max-instances", "32"),
        ("--max-log-lines-per-second", "100"),
        ("--min-requeue-millis", "1000"),
    ] {
        let at = help
            .find(&format!("{flag} <"))
            .unwrap_or_else(|| panic!("{flag} is not in the help:\n{help}"));
        let next = help[at..]
            .find("[default: ")
            .map(|i| &help[at + i + 10..])
            .and_then(|rest| rest.split(']').next())
            .unwrap_or_else(|| panic!("{flag} shows no default:\n{help}"));
        assert_eq!(next, default, "the default of {flag}");
    }
}

/// A guest grown to `size` bytes by a custom section (which every loader ignores) of random
/// bytes masked by `mask`: `0` zeros (gzip shrinks them a thousand times), `1` one random bit a
/// byte (about 6×), `0xff` bytes gzip cannot shrink.
fn padded_guest(dir: &Path, name: &str, size: usize, mask: u8) -> PathBuf {
    let module = std::fs::read(common::guest("hello_world")).unwrap();
    let section_name = "padding";
    let payload_len = size - module.len() - 1 - 5 - 1 - section_name.len();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let payload: Vec<u8> = (0..payload_len)
        .map(|_| {
            // xorshift64: incompressible enough for gzip.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8 & mask
        })
        .collect();
    let module = common::with_custom_section(module, section_name, &payload);
    assert_eq!(module.len(), size);
    write(dir, name, module)
}

fn gzip(path: &Path) -> PathBuf {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&std::fs::read(path).unwrap()).unwrap();
    let gz_path = path.with_extension("wasm.gz");
    std::fs::write(&gz_path, gz.finish().unwrap()).unwrap();
    gz_path
}

fn warning(run: &Run) -> Option<&str> {
    run.stderr.lines().find(|l| l.starts_with("warning: "))
}

#[track_caller]
fn assert_warns(module: &Path, needles: &[&str]) {
    let run = kubewasm(&[OsStr::new("check"), module.as_os_str()]).success();
    assert!(run.stdout.starts_with("ok: "), "{}", run.stdout);
    let line = warning(&run).unwrap_or_else(|| panic!("no warning:\n{}", run.stderr));
    for needle in needles {
        assert!(line.contains(needle), "warning lacks {needle:?}:\n{line}");
    }
}

#[test]
fn check_warns_when_a_module_does_not_fit_in_a_configmap() {
    let dir = tempfile::tempdir().unwrap();
    let limit = "more than the 1048576 bytes a ConfigMap holds";
    // The exact limit fits (the API server accepts a 1,048,576-byte value).
    let exact = padded_guest(dir.path(), "exact.wasm", 1 << 20, 0xff);
    let run = kubewasm(&[OsStr::new("check"), exact.as_os_str()]).success();
    assert_eq!(warning(&run), None, "{}", run.stderr);
    let over = padded_guest(dir.path(), "over.wasm", (1 << 20) + 1, 0xff);
    assert_warns(&over, &["over.wasm is 1048577 bytes, ", limit]);
    let small = common::guest("hello_world");
    let run = kubewasm(&[OsStr::new("check"), small.as_os_str()]).success();
    assert_eq!(warning(&run), None, "{}", run.stderr);

    // Too big as it is, small once gzipped: the fix is gzip.
    let sparse = padded_guest(dir.path(), "sparse.wasm", 3 << 20, 1);
    assert_warns(
        &sparse,
        &[
            "sparse.wasm is 3145728 bytes, ",
            limit,
            "Gzipped it is ",
            "which fits: `gzip -9k ",
            "make update GZIPPED=1",
            "--release",
        ],
    );
    let run = kubewasm(&[OsStr::new("check"), gzip(&sparse).as_os_str()]).success();
    assert_eq!(warning(&run), None, "gzipped, it fits:\n{}", run.stderr);

    // Zeros gzip a thousand times, past what the runtime inflates: gzip is not the fix, and
    // the gzipped file is refused as the runtime would refuse it.
    let zeros = padded_guest(dir.path(), "zeros.wasm", 3 << 20, 0);
    assert_warns(
        &zeros,
        &["but it inflates more than 32×", "spec.module.image"],
    );
    kubewasm(&[OsStr::new("check"), gzip(&zeros).as_os_str()]).failure(&[
        "inflates to more than 32× its size",
        "store it uncompressed",
    ]);

    // Too big either way: a smaller build, a module file, or (later) an OCI image.
    // (The guest itself shrinks to a third gzipped; the random padding does not.)
    let dense = padded_guest(dir.path(), "dense.wasm", 3 << 19, 0xff);
    for module in [dense.clone(), gzip(&dense)] {
        assert_warns(
            &module,
            &[
                limit,
                "the API server will refuse it",
                "release profile",
                "lto = true",
                "spec.module.path",
                "spec.module.image",
            ],
        );
    }
    assert_warns(&gzip(&dense), &[" bytes gzipped, more than"]);
}

#[test]
fn wait_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_kubewasm"))
        .args(["wait", "-n", "team", "summariser", "--timeout", "1"])
        .env("KUBECONFIG", dir.path().join("absent"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no kubeconfig"), "{stderr}");
}

#[test]
fn new_writes_a_guest_crate_and_refuses_what_it_cannot_write() {
    let dir = tempfile::tempdir().unwrap();
    let crate_dir = dir.path().join("summariser");
    let run = kubewasm(&[
        OsStr::new("new"),
        OsStr::new("summariser"),
        OsStr::new("--dir"),
        crate_dir.as_os_str(),
    ])
    .success();
    assert!(run.stdout.contains("make test"), "{}", run.stdout);
    for file in [
        "Cargo.toml",
        "rust-toolchain.toml",
        ".cargo/config.toml",
        "Makefile",
        "README.md",
        "src/lib.rs",
        "tests/reconcile.rs",
        "tests/fixtures/example.yaml",
        "deploy/controller.yaml",
        "deploy/rbac.yaml",
    ] {
        assert!(crate_dir.join(file).is_file(), "{file} missing");
    }
    // The SDK is copied into the crate, so it builds wherever it is moved: no path leads out.
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains("kubewasm-guest-sdk = { path = \"kubewasm-guest-sdk\" }")
            && manifest.contains("[workspace]"),
        "{manifest}"
    );
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk");
    for file in [
        "src/lib.rs",
        "src/selector/parse.rs",
        "wit/kubewasm.wit",
        "alloc/src/tail.rs",
    ] {
        assert_eq!(
            std::fs::read(crate_dir.join("kubewasm-guest-sdk").join(file)).unwrap(),
            std::fs::read(sdk.join(file)).unwrap(),
            "{file} of the copied SDK"
        );
    }
    let workspace = sdk.parent().unwrap().canonicalize().unwrap();
    for file in ["Cargo.toml", "Makefile", "kubewasm-guest-sdk/Cargo.toml"] {
        let text = std::fs::read_to_string(crate_dir.join(file)).unwrap();
        let outward = text
            .lines()
            .filter(|line| line.contains(&*workspace.to_string_lossy()))
            .filter(|line| !line.starts_with("KUBEWASM ?="));
        assert_eq!(outward.count(), 0, "{file} names the checkout:\n{text}");
    }
    // Appliable by a user who is only `admin` of the namespace: no Namespace (the cluster
    // admin's), no Role granting Events (RBAC would refuse it: `admin` holds no `events
    // create`), which come from a RoleBinding to kubewasm-guest-events instead.
    let rbac = std::fs::read_to_string(crate_dir.join("deploy/rbac.yaml")).unwrap();
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&rbac)
        .map(|d| Value::deserialize(d).unwrap())
        .collect();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert!(!kinds.contains(&"Namespace"), "{kinds:?}");
    assert!(
        !rbac.contains("\"events\""),
        "a Role granting Events: {rbac}"
    );
    let bound: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "RoleBinding")
        .filter_map(|d| d["roleRef"]["name"].as_str())
        .collect();
    assert!(
        bound.contains(&"kubewasm-guest-events") && bound.contains(&"kubewasm-runtime-tenant"),
        "{bound:?}"
    );
    let account = docs.iter().find(|d| d["kind"] == "ServiceAccount").unwrap();
    assert_eq!(
        account["metadata"]["annotations"]["kubewasm.dev/wasm-controllers"],
        "allowed"
    );
    // `make deploy` and `make update` end with the runtime's verdict.
    let makefile = std::fs::read_to_string(crate_dir.join("Makefile")).unwrap();
    // The module is built without WASI, linked into a component by the toolchain's linker.
    assert!(
        makefile.contains("TARGET ?= wasm32-unknown-unknown"),
        "{makefile}"
    );
    let config = std::fs::read_to_string(crate_dir.join(".cargo/config.toml")).unwrap();
    assert!(
        config.contains("[target.wasm32-unknown-unknown]")
            && config.contains("linker = \"wasm-component-ld\""),
        "{config}"
    );
    assert!(
        makefile.contains("$(KUBEWASM) wait -n $(NAMESPACE) summariser"),
        "{makefile}"
    );
    let controller = read_yaml(&crate_dir.join("deploy/controller.yaml"));
    assert_eq!(controller["metadata"]["namespace"], "summariser");
    assert_eq!(
        controller["spec"]["parent"]["labelSelector"],
        "summariser=yes"
    );

    let again = [
        OsStr::new("new"),
        OsStr::new("other"),
        OsStr::new("--dir"),
        crate_dir.as_os_str(),
    ];
    kubewasm(&again).failure(&["exists and is not empty"]);
    kubewasm(&["new", "Summariser"]).failure(&["NAME `Summariser`", "DNS-1123 label"]);
    kubewasm(&["new", "2fast"]).failure(&["starts with a digit"]);
    let elsewhere = dir.path().join("x");
    kubewasm(&[
        OsStr::new("new"),
        OsStr::new("x"),
        OsStr::new("--dir"),
        elsewhere.as_os_str(),
        OsStr::new("--sdk"),
        dir.path().as_os_str(),
    ])
    .failure(&["is not the kubewasm-guest-sdk crate", "leave --sdk out"]);
    assert!(
        !elsewhere.exists(),
        "nothing is written when the SDK is wrong"
    );
}

#[test]
fn push_refuses_what_it_cannot_push_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let guest = common::guest("hostile");
    let guest = guest.to_str().unwrap();
    // Nothing listens here: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let at = |repo: &str| format!("127.0.0.1:{port}/{repo}");
    kubewasm(&["push", guest, "hello:v1"])
        .failure(&["the reference `hello:v1`", "name the registry"]);
    kubewasm(&["push", guest, &at("hello")]).failure(&["no implicit `latest`"]);
    let digest = format!("{}@sha256:{}", at("hello"), "0".repeat(64));
    kubewasm(&["push", guest, &digest]).failure(&["push to a tag"]);
    kubewasm(&["push", "/nonexistent/guest.wasm", &at("hello:v1")])
        .failure(&["cannot read /nonexistent/guest.wasm"]);
    let junk = write(dir.path(), "junk.wasm", b"not wasm at all");
    kubewasm(&["push", junk.to_str().unwrap(), &at("hello:v1")])
        .failure(&["junk.wasm", "not a WebAssembly component"]);
    let core = write(dir.path(), "core.wasm", wat::parse_str("(module)").unwrap());
    kubewasm(&["push", core.to_str().unwrap(), &at("hello:v1")])
        .failure(&["not a WebAssembly component (a core module"]);
    kubewasm(&["push", guest, &at("hello:v1"), "--insecure"])
        .failure(&[&format!("cannot push to {}", at("hello:v1"))]);
    kubewasm(&["push", guest, &at("hello:v1")]).failure(&["over HTTPS", "needs --insecure"]);
    // A docker config that is not one is named, not ignored.
    let config_dir = tempfile::tempdir().unwrap();
    write(config_dir.path(), "config.json", "{not json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubewasm"))
        .args(["push", guest, &at("hello:v1"), "--insecure"])
        .env("DOCKER_CONFIG", config_dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!child.wait().unwrap().success());
    assert!(
        stderr.contains("config.json: not a docker config"),
        "{stderr}"
    );
    // --username needs --password-stdin (clap's usage error, exit code 2).
    let run = kubewasm(&["push", guest, &at("hello:v1"), "--username", "u"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("--password-stdin"), "{}", run.stderr);
}

#[test]
fn sign_and_verify_keys_refuse_what_is_no_key_and_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let image = format!("127.0.0.1:{port}/team/hello:v1");
    kubewasm(&["sign", "--key", "/nonexistent/cosign.key", &image])
        .failure(&["--key cannot read /nonexistent/cosign.key"]);
    let public = write(
        dir.path(),
        "cosign.pub",
        "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAENptdY/l3nB0yqkXLBWkZWQwo6+cu\nOSWS1X9vPavpiQOoTTGC0xX57OojUadxF1cdQmrsiReWg2Wn4FneJfa8xw==\n-----END PUBLIC KEY-----\n",
    );
    kubewasm(&["sign", "--key", public.to_str().unwrap(), &image])
        .failure(&["a PEM `PUBLIC KEY`, not a private key"]);
    // cosign's encrypted key needs its password, from where cosign reads it.
    let encrypted = kubewasm_test_support::workspace()
        .join("runtime/tests/fixtures/cosign/cosign-generated-empty-password.key");
    let run = Command::new(env!("CARGO_BIN_EXE_kubewasm"))
        .args(["sign", "--key", encrypted.to_str().unwrap(), &image])
        .env_remove("COSIGN_PASSWORD")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(stderr.contains("$COSIGN_PASSWORD"), "{stderr}");
    let run = Command::new(env!("CARGO_BIN_EXE_kubewasm"))
        .args(["sign", "--key", encrypted.to_str().unwrap(), &image])
        .env("COSIGN_PASSWORD", "wrong")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("wrong password"), "{stderr}");
    // The right key, a registry that is not there: said, nothing signed.
    let run = Command::new(env!("CARGO_BIN_EXE_kubewasm"))
        .args([
            "sign",
            "--insecure",
            "--key",
            encrypted.to_str().unwrap(),
            &image,
        ])
        .env("COSIGN_PASSWORD", "")
        .env("DOCKER_CONFIG", "/nonexistent")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains(&format!("cannot log in to {image}")),
        "{stderr}"
    );
    // `run --verify-key` takes only public P-256 keys, and says so before it starts.
    kubewasm(&["run", "--verify-key", encrypted.to_str().unwrap()])
        .failure(&["--verify-key", "not a PEM ECDSA P-256 public key"]);
    kubewasm(&["run", "--verify-key", "/nonexistent/cosign.pub"])
        .failure(&["--verify-key cannot read /nonexistent/cosign.pub"]);
}

#[test]
fn run_help_shows_the_module_cap_and_the_insecure_registries() {
    let help = kubewasm(&["run", "--help"]).success().stdout;
    assert!(
        help.contains("--max-module-bytes <MAX_MODULE_BYTES>"),
        "{help}"
    );
    assert!(help.contains("[default: 64Mi]"), "{help}");
    assert!(help.contains("--insecure-registry <HOST:PORT>"), "{help}");
    assert!(help.contains("--verify-key <FILE>"), "{help}");
    assert!(
        help.contains("--module-read-bytes <MODULE_READ_BYTES>")
            && help.contains("[default: 128Mi]"),
        "{help}"
    );
    // Less than a gzipped layer at the cap and what it inflates to: refused before it starts.
    kubewasm(&["run", "--module-read-bytes", "100Mi"]).failure(&[
        "--module-read-bytes 100Mi",
        "at least twice --max-module-bytes (128Mi)",
    ]);
}

/// `--max-instances` is refused at 0 and above 100000: the sandbox's pool sizes are multiples
/// of it, and none may be 0 or overflow.
#[test]
fn max_instances_is_bounded() {
    for n in ["0", "100001", "4294967295"] {
        let run = kubewasm(&["run", "--max-instances", n]);
        assert_eq!(run.code, Some(2), "{}", run.stderr);
        assert!(
            run.stderr.contains("is not in 1..=100000"),
            "{}",
            run.stderr
        );
    }
}

/// `kubewasm logs` and the log flags of `kubewasm run` refuse bad input, saying what to give.
#[test]
fn log_flags_refuse_bad_input_saying_what_to_give() {
    // Usage errors: clap's exit code 2, with our words.
    for (since, says) in [("5 days", "30s, 5m or 2h"), ("0s", "above 0")] {
        let run = kubewasm(&["logs", "hello", "--since", since]);
        assert_eq!(run.code, Some(2), "{}", run.stderr);
        assert!(run.stderr.contains(says), "{}", run.stderr);
    }
    kubewasm(&["run", "--log-ring-bytes", "0"]).failure(&["--log-ring-bytes 0", "above 0"]);
    kubewasm(&["run", "--log-ring-bytes-per-namespace", "lots"])
        .failure(&["--log-ring-bytes-per-namespace lots", "e.g. 256Ki"]);
    let help = kubewasm(&["run", "--help"]).success().stdout;
    for (flag, default) in [
        ("--log-ring-bytes <", "[default: 256Ki]"),
        ("--log-ring-bytes-per-namespace <", "[default: 1Mi]"),
        ("--log-max-followers <", "[default: 100]"),
        ("--api-addr <ADDR>", ""),
    ] {
        let at = help
            .find(flag)
            .unwrap_or_else(|| panic!("{flag} not in:\n{help}"));
        assert!(help[at..].contains(default), "{flag} {default}");
    }
}
