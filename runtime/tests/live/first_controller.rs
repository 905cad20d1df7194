//! "Your first controller in 10 minutes" (docs/02-first-controller.md), step by step as a new user
//! follows it: `kubewasm new` into a directory outside the repository, the crate's own native
//! tests, its wasm build, an offline run, then live against the control plane — `make deploy` (its
//! RBAC, the module by the documented one-command update, its WasmController), the child appears;
//! an edit and `make update`, the new behaviour; a labelled ConfigMap without data, the permanent
//! error in the status and `kubectl get wc`, not retried; an edit loaded gzipped.
//!
//! Builds use `CARGO_TARGET_DIR=$KUBEWASM_CACHE/first-controller/target`, so later runs are
//! warm, and the workspace's `Cargo.lock`, so versions match what is already fetched (a user's
//! crate resolves its own). The crate carries its own copy of the guest SDK, so nothing in it
//! points back into the repository. Each phase prints how long it took.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::ListParams;
use kube::{Api, Client};

use crate::cluster::{controller_status, ensure_condition, sha256, wait_status, workspace};
use crate::runtime::{RuntimeProcess, finish};
use crate::support::{ControlPlane, Kubectl, TeamUser, eventually};

/// The controller's name: crate, WasmController, ServiceAccount, label.
const NAME: &str = "summariser";

/// A build of the scaffold may take minutes cold on 2 busy cores.
const BUILD: Duration = Duration::from_secs(20 * 60);

/// A `make` target that only talks to the API server.
const KUBECTL: Duration = Duration::from_secs(60);

/// How long a permanent error is watched for retries: backoff would retry at 0.5, 1, 2, 4 s.
const NOT_RETRIED: Duration = Duration::from_secs(8);

/// How long the guest's first Event may take to appear after its child.
const WAIT_EVENTS: Duration = Duration::from_secs(30);

/// What the scaffold's summary says for tests/fixtures/example.yaml (keys color, greeting).
const SUMMARY: &str = "2 keys, 9 bytes";

/// The line of src/lib.rs the tutorial's edit changes, and what the edits make of it.
const FORMAT: &str = r#""{} keys, {} bytes""#;

#[tokio::test]
async fn a_scaffolded_controller_is_built_run_updated_and_reports_its_failure() {
    let started = Instant::now();
    let control_plane = ControlPlane::shared();
    let (admin, ns) = crate::cluster::prepare(control_plane, "first").await;
    // The team: only `admin` of the namespace a cluster admin made and enabled for it. Every
    // `make` and `kubectl` below runs with its kubeconfig, and it applies the namespace's
    // consent to the runtime (the tenant RoleBinding) itself.
    let team = control_plane
        .namespace_admin(&ns, "summariser-team")
        .await
        .expect("the team's user");
    kube::Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(admin, &ns)
        .delete("kubewasm-runtime-tenant", &Default::default())
        .await
        .expect("the tenant RoleBinding left for the team to make");
    let client = team.client().await.expect("the team's client");
    let mut scaffold = Scaffold::new(&team, &ns).expect("kubewasm new");
    if let Err(error) = scaffold.offline().await {
        let _ = control_plane.delete_namespace(&ns).await;
        panic!("{error:#}\n(the crate is kept in {})", scaffold.keep());
    }
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let live = scaffold.live(&client, &ns).await;
    if live.is_err() {
        eprintln!("the crate is kept in {}", scaffold.keep());
    }
    finish(live, &mut [&mut runtime]);
    eprintln!("first controller: all phases {:.1?}", started.elapsed());
    let _ = control_plane.delete_namespace(&ns).await;
}

/// The crate `kubewasm new` wrote, and how to run `make` in it.
struct Scaffold {
    dir: tempfile::TempDir,
    path: PathBuf,
    target_dir: PathBuf,
    kubeconfig: PathBuf,
}

impl Scaffold {
    /// `kubewasm new summariser --namespace <ns>` in a fresh directory under the system's
    /// temporary directory, with the workspace's Cargo.lock.
    fn new(team: &TeamUser, ns: &str) -> Result<Scaffold> {
        let phase = Instant::now();
        let parent = tempfile::Builder::new()
            .prefix("kubewasm-first-")
            .tempdir_in(std::env::temp_dir())?;
        let path = parent.path().join(NAME);
        ensure!(
            !path.starts_with(workspace()),
            "{} is inside the repository",
            path.display()
        );
        let out = std::process::Command::new(crate::runtime::kubewasm_bin())
            .args(["new", NAME, "--namespace", ns, "--dir"])
            .arg(&path)
            .output()
            .context("running kubewasm new")?;
        ensure!(
            out.status.success(),
            "kubewasm new failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::copy(workspace().join("Cargo.lock"), path.join("Cargo.lock"))?;
        let cache = std::env::var_os("KUBEWASM_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/kubewasm")))
            .context("neither KUBEWASM_CACHE nor HOME is set")?;
        eprintln!("phase kubewasm new: {:.1?}", phase.elapsed());
        Ok(Scaffold {
            dir: parent,
            path,
            target_dir: cache.join("first-controller/target"),
            kubeconfig: team.kubeconfig.clone(),
        })
    }

    /// Keeps the crate on disk (after a failure) and says where it is.
    fn keep(&mut self) -> String {
        self.dir.disable_cleanup(true);
        self.path.display().to_string()
    }

    /// The tutorial's offline steps: `make test`, `make build`, `make run`.
    async fn offline(&self) -> Result<()> {
        self.cargo_fmt_check().await?;
        let tests = self.make(&["test"], BUILD).await?;
        ensure!(
            tests.contains("test result: ok. 4 passed"),
            "make test: {tests}"
        );
        let built = self.make(&["build"], BUILD).await?;
        ensure!(
            built.contains("is a kubewasm controller") && !built.contains("a ConfigMap holds"),
            "make build: {built}"
        );
        let ran = self.make(&["run"], KUBECTL).await?;
        ensure!(
            ran.contains("name: example-summary") && ran.contains(&format!("summary: {SUMMARY}")),
            "make run: {ran}"
        );
        let failed = self
            .make_fails(&["run", "FIXTURE=tests/fixtures/empty.yaml"])
            .await?;
        ensure!(
            failed.contains("ConfigMap empty has no data to summarise"),
            "make run on the empty fixture: {failed}"
        );
        Ok(())
    }

    /// The tutorial's live steps against the control plane.
    async fn live(&self, client: &Client, ns: &str) -> Result<()> {
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let kubectl = Kubectl::new(&self.kubeconfig);

        let phase = Instant::now();
        self.make(&["deploy"], KUBECTL).await?;
        self.kubectl(&kubectl, &["apply", "-f", "tests/fixtures/example.yaml"])
            .await?;
        wait_summary(&config_maps, SUMMARY).await?;
        wait_status(client, ns, NAME, "the controller Ready", |s| {
            ensure_condition(s, "Ready", "True").map(drop)
        })
        .await?;
        // The guest's Events on its parent, through the RoleBinding to kubewasm-guest-events
        // that the team's rbac.yaml makes.
        let events: Api<Event> = Api::namespaced(client.clone(), ns);
        eventually(
            "the Summarised Event on ConfigMap example",
            WAIT_EVENTS,
            || async {
                let on = ListParams::default().fields("involvedObject.name=example");
                let found = events
                    .list(&on)
                    .await?
                    .items
                    .into_iter()
                    .any(|e| e.reason.as_deref() == Some("Summarised"));
                Ok(found.then_some(()))
            },
        )
        .await?;
        eprintln!(
            "phase make deploy → the child appears, its Event on the parent: {:.1?}",
            phase.elapsed()
        );

        // The tutorial's edit, then `make update`: the runtime swaps the module in.
        let phase = Instant::now();
        self.edit(" (v2)")?;
        self.make(&["update"], BUILD).await?;
        let digest = sha256(&std::fs::read(self.wasm())?);
        wait_summary(&config_maps, &format!("{SUMMARY} (v2)")).await?;
        wait_status(client, ns, NAME, "the new module's digest", |s| {
            ensure!(
                s.module_digest.as_deref() == Some(digest.as_str()),
                "moduleDigest {:?}, want {digest}",
                s.module_digest
            );
            Ok(())
        })
        .await?;
        eprintln!(
            "phase edit, make update → the new behaviour: {:.1?}",
            phase.elapsed()
        );

        // A labelled ConfigMap without data: a permanent error, where the author looks.
        let phase = Instant::now();
        self.kubectl(&kubectl, &["apply", "-f", "tests/fixtures/empty.yaml"])
            .await?;
        let failed = wait_status(
            client,
            ns,
            NAME,
            "the permanent error in the status, Ready=False and Degraded=True",
            |s| {
                ensure!(
                        s.failures >= 1
                            && s.last_error.as_deref().is_some_and(
                                |e| e.contains("ConfigMap empty has no data to summarise")
                            ),
                        "failures {}, lastError {:?}",
                        s.failures,
                        s.last_error
                    );
                ensure_condition(s, "Ready", "False")?;
                ensure_condition(s, "Degraded", "True")?;
                Ok(())
            },
        )
        .await?;
        let row = self
            .kubectl(&kubectl, &["-n", ns, "get", "wasmcontrollers", NAME])
            .await?;
        ensure!(
            row.contains("False") && row.contains("has no data to summarise"),
            "kubectl get wc shows READY False and the LAST ERROR:\n{row}"
        );
        eprintln!(
            "phase empty ConfigMap → the failure in the status: {:.1?}",
            phase.elapsed()
        );
        tokio::time::sleep(NOT_RETRIED).await;
        let later = controller_status(client, ns, NAME).await?;
        ensure!(
            later.failures == failed.failures,
            "the permanent error was retried: {} failures, then {} after {NOT_RETRIED:?}",
            failed.failures,
            later.failures
        );
        // Reported once, on the object itself: one Warning Event, counted once.
        let events: Api<Event> = Api::namespaced(client.clone(), ns);
        let on_empty = ListParams::default().fields("involvedObject.name=empty");
        let failures: Vec<Event> = events
            .list(&on_empty)
            .await?
            .items
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .collect();
        let shown: Vec<_> = failures
            .iter()
            .map(|e| (&e.reason, e.count, &e.message))
            .collect();
        ensure!(
            failures.len() == 1
                && failures[0].reason.as_deref() == Some("ReconcileFailed")
                && failures[0].count == Some(1)
                && failures[0]
                    .message
                    .as_deref()
                    .is_some_and(|m| m.contains("has no data to summarise")),
            "want one Warning Event ReconcileFailed counted once on ConfigMap empty, got {shown:?}"
        );

        // Bytes that are no module, loaded by the Makefile's own commands: its `wait` fails
        // with the runtime's reason (the last good module keeps running).
        let garbage = self.path.join("garbage.wasm");
        std::fs::write(&garbage, b"not a wasm module")?;
        let refused = self
            .make_fails(&["load", "wait", &format!("WASM={}", garbage.display())])
            .await?;
        ensure!(
            refused.contains("refused") && refused.contains("ModuleInvalid"),
            "make load wait of bytes that are no module: {refused}"
        );

        // Another edit, loaded gzipped under the same key with the same command.
        let phase = Instant::now();
        self.edit(" (v3)")?;
        self.make(&["update", "GZIPPED=1"], BUILD).await?;
        let gzipped = std::fs::read(self.wasm().with_extension("wasm.gz"))?;
        ensure!(
            gzipped.starts_with(&[0x1f, 0x8b]),
            "the module was not gzipped"
        );
        let digest = sha256(&std::fs::read(self.wasm())?);
        wait_summary(&config_maps, &format!("{SUMMARY} (v3)")).await?;
        wait_status(client, ns, NAME, "the gzipped module's digest", |s| {
            ensure!(
                s.module_digest.as_deref() == Some(digest.as_str()),
                "moduleDigest {:?}, want {digest}",
                s.module_digest
            );
            Ok(())
        })
        .await?;
        eprintln!(
            "phase edit, make update GZIPPED=1 → the new behaviour: {:.1?}",
            phase.elapsed()
        );
        Ok(())
    }

    /// The crate is written as rustfmt writes it, whatever its name (the user's own
    /// `cargo fmt` changes nothing).
    async fn cargo_fmt_check(&self) -> Result<()> {
        let mut command = tokio::process::Command::new("cargo");
        command
            .args(["fmt", "--check"])
            .current_dir(&self.path)
            .env_remove("CARGO")
            .env_remove("RUSTUP_TOOLCHAIN")
            .kill_on_drop(true);
        let out = tokio::time::timeout(KUBECTL, command.output())
            .await
            .with_context(|| format!("`cargo fmt --check` did not finish within {KUBECTL:?}"))??;
        ensure!(
            out.status.success(),
            "the new crate is not formatted as rustfmt does:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        Ok(())
    }

    /// The built module.
    fn wasm(&self) -> PathBuf {
        self.target_dir
            .join("wasm32-unknown-unknown/release")
            .join(format!("{NAME}.wasm"))
    }

    /// The tutorial's edit of the summary: `"{} keys, {} bytes"` gets `suffix`.
    fn edit(&self, suffix: &str) -> Result<()> {
        let lib = self.path.join("src/lib.rs");
        let source = std::fs::read_to_string(&lib)?;
        let edited = format!("{}{suffix}\"", FORMAT.trim_end_matches('"'));
        let previous = source
            .lines()
            .find_map(|line| {
                let start = line.find(FORMAT.trim_end_matches('"'))?;
                let end = start + line[start..].find("\",")? + 1;
                Some(line[start..end].to_owned())
            })
            .with_context(|| format!("src/lib.rs has no {FORMAT}"))?;
        std::fs::write(&lib, source.replacen(&previous, &edited, 1))?;
        Ok(())
    }

    /// `make <args>` in the crate, as a user runs it; its output, or an error that quotes it.
    async fn make(&self, args: &[&str], timeout: Duration) -> Result<String> {
        let phase = Instant::now();
        let (ok, output) = self.run_make(args, timeout).await?;
        ensure!(ok, "`make {}` failed:\n{output}", args.join(" "));
        eprintln!("phase make {}: {:.1?}", args.join(" "), phase.elapsed());
        Ok(output)
    }

    /// `make <args>`, which must fail; its output.
    async fn make_fails(&self, args: &[&str]) -> Result<String> {
        let (ok, output) = self.run_make(args, KUBECTL).await?;
        ensure!(!ok, "`make {}` succeeded:\n{output}", args.join(" "));
        Ok(output)
    }

    async fn run_make(&self, args: &[&str], timeout: Duration) -> Result<(bool, String)> {
        let shown = format!("make {}", args.join(" "));
        let mut command = tokio::process::Command::new("make");
        command
            .args(args)
            .arg(format!(
                "KUBEWASM={}",
                crate::runtime::kubewasm_bin().display()
            ))
            .current_dir(&self.path)
            .env("CARGO_TARGET_DIR", &self.target_dir)
            .env("KUBECONFIG", &self.kubeconfig)
            // Not the variables of a `make test` this test may run under.
            .env_remove("MAKEFLAGS")
            .env_remove("MFLAGS")
            .env_remove("MAKELEVEL")
            // Nor the cargo and toolchain this test runs under: the crate's own
            // rust-toolchain.toml decides, as for a user.
            .env_remove("CARGO")
            .env_remove("RUSTUP_TOOLCHAIN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("running `{shown}` (is make installed?)"))?;
        let pid = child.id();
        match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(out) => {
                let out = out.with_context(|| format!("running `{shown}`"))?;
                let output = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                Ok((out.status.success(), output))
            }
            Err(_) => {
                // make and what it started (cargo, kubectl): the whole process group.
                if let Some(pid) = pid {
                    let _ = std::process::Command::new("kill")
                        .args(["-TERM", "--", &format!("-{pid}")])
                        .status();
                }
                bail!("`{shown}` did not finish within {timeout:?}")
            }
        }
    }

    /// `kubectl <args>` in the crate's directory, as the tutorial runs it.
    async fn kubectl(&self, kubectl: &Kubectl, args: &[&str]) -> Result<String> {
        let args_here: Vec<String> = args
            .iter()
            .map(|a| {
                if a.starts_with("tests/") {
                    self.path.join(a).display().to_string()
                } else {
                    (*a).to_owned()
                }
            })
            .collect();
        let args_here: Vec<&str> = args_here.iter().map(String::as_str).collect();
        let shown = format!("kubectl {}", args.join(" "));
        tokio::time::timeout(KUBECTL, kubectl.run(&args_here))
            .await
            .with_context(|| format!("`{shown}` did not finish within {KUBECTL:?}"))?
    }
}

/// Waits until `example-summary` says `summary` and is owned by `example`.
async fn wait_summary(config_maps: &Api<ConfigMap>, summary: &str) -> Result<()> {
    eventually(
        &format!("ConfigMap example-summary says {summary:?}, owned by example"),
        crate::cluster::WAIT,
        || async {
            let child = config_maps.get("example-summary").await?;
            let said = child
                .data
                .as_ref()
                .and_then(|d| d.get("summary"))
                .map(String::as_str);
            ensure!(said == Some(summary), "it says {said:?}");
            let owned = child
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.name == "example" && o.controller == Some(true));
            ensure!(owned, "no controller ownerReference to example");
            Ok(Some(()))
        },
    )
    .await
}
