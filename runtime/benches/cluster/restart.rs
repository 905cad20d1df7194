//! P2: a ConfigMap's data changes → the Pods its `magalix.com/podDeleteMatch` annotation
//! selects are deleted. Three controllers do it, each in a namespace of its own with the
//! tutorial's ServiceAccount `joe` and its Roles: kubewasm's restarter guest under
//! `kubewasm run`, a minimal native kube-rs loop (the floor), and the tutorial's Python
//! controller. A round is timed from the ConfigMap update's API response until a Pod watch has
//! seen every matching Pod deleted; the non-matching Pod must survive it.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;
use tokio::sync::oneshot;

use crate::cluster::{apply, apply_all, example, guest, module_config_map, take};
use crate::restarter::{Owner, create_pod, wait_digest};
use crate::runtime::RuntimeProcess;
use crate::stats::{Samples, overhead};
use crate::support::{ControlPlane, eventually};
use crate::{BENCH_LOG_FILTER, UNCAPPED, python};

/// The annotation that opts a ConfigMap in (the tutorial's).
const SELECTOR_ANNOTATION: &str = "magalix.com/podDeleteMatch";

/// The ConfigMap every round changes.
const CONFIG_MAP: &str = "settings";

/// How long one round (all matching Pods gone) may take before the bench gives up.
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a restarter may take to start watching.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The tutorial's ServiceAccount, the identity of all three controllers.
const ACCOUNT: &str = "joe";

/// Lifetime of the token the Python controller authenticates with.
const TOKEN_LIFETIME: Duration = Duration::from_secs(4 * 3600);

/// The three restarters, in the order of the first round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Restarter {
    /// `guests/configmap-restarter` under `kubewasm run` with the operator's default caps.
    Kubewasm,
    /// The same with `--max-writes-per-second` and `--write-burst` lifted: the default 10
    /// writes/s (burst 50) is about one round's 9 writes (list, 5 deletes, 2 state saves, the
    /// refused Event) per second, so rounds that come faster drain it.
    KubewasmUncapped,
    /// [`native_restarter`], a task in this process.
    Native,
    /// `benches/cluster/restarter.py`, the tutorial's controller.
    Python,
}

impl Restarter {
    fn name(self) -> &'static str {
        match self {
            Restarter::Kubewasm => "kubewasm",
            Restarter::KubewasmUncapped => "kubewasm, uncapped",
            Restarter::Native => "native kube-rs",
            Restarter::Python => "python (tutorial)",
        }
    }
}

/// What runs one restarter; dropping it stops it.
enum Running {
    Kubewasm(Box<RuntimeProcess>),
    Native(tokio::task::JoinHandle<Result<()>>),
    Python(KillOnDrop),
}

/// A child process killed (and reaped) when dropped.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Running::Native(task) = self {
            task.abort();
        }
    }
}

/// One restarter and the namespace it alone acts in.
struct Subject {
    restarter: Restarter,
    namespace: String,
    running: Running,
}

impl Subject {
    /// Fails when the restarter has stopped by itself.
    fn ensure_running(&mut self) -> Result<()> {
        match &mut self.running {
            Running::Kubewasm(process) => process.ensure_running(),
            Running::Native(task) if task.is_finished() => {
                bail!("the native restarter stopped")
            }
            Running::Native(_) => Ok(()),
            Running::Python(child) => match child.0.try_wait()? {
                Some(status) => bail!("the Python restarter exited: {status}"),
                None => Ok(()),
            },
        }
    }
}

/// Rounds per restarter, and matching Pods per round.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    /// Timed rounds per restarter (after one untimed warm-up round each).
    pub rounds: usize,
    /// Pods the annotation selects, per round (plus one it does not).
    pub matching: usize,
}

/// Runs P2 and prints its table.
pub async fn bench(cp: &ControlPlane, size: Size, with_python: bool) -> Result<()> {
    let admin = cp.client().await?;
    crate::cluster::ensure_crds(cp, &admin).await?;
    let mut restarters = vec![
        Restarter::Kubewasm,
        Restarter::KubewasmUncapped,
        Restarter::Native,
    ];
    if with_python {
        restarters.push(Restarter::Python);
    }
    let mut subjects = Vec::new();
    for restarter in restarters {
        subjects.push(start(cp, &admin, restarter).await?);
    }
    let result = rounds(&admin, &mut subjects, size).await;
    for subject in &mut subjects {
        if let Running::Kubewasm(process) = &mut subject.running {
            if result.is_err() {
                process.report_failure();
            } else {
                eprintln!("P2: the runtime's log is {}", process.keep_log().display());
            }
        }
    }
    report(size, &result?);
    for subject in subjects {
        let ns = subject.namespace.clone();
        drop(subject);
        cp.delete_namespace(&ns).await?;
    }
    Ok(())
}

/// The warm-up and the timed rounds: the times of each restarter.
async fn rounds(
    admin: &Client,
    subjects: &mut [Subject],
    size: Size,
) -> Result<BTreeMap<Restarter, Vec<Duration>>> {
    // Warm-up: proves each restarter is watching and acting before anything is timed.
    for subject in subjects.iter_mut() {
        round(admin, subject, 0, 1)
            .await
            .with_context(|| format!("warm-up round of {}", subject.restarter.name()))?;
    }
    let mut times: BTreeMap<Restarter, Vec<Duration>> = BTreeMap::new();
    for r in 1..=size.rounds {
        // Interleaved, and each round starts with another restarter.
        let n = subjects.len();
        for k in 0..n {
            let subject = &mut subjects[(r + k) % n];
            let took = round(admin, subject, r, size.matching)
                .await
                .with_context(|| format!("round {r} of {}", subject.restarter.name()))?;
            eprintln!(
                "  P2 round {r:>2}: {:<18} {} (ended {})",
                subject.restarter.name(),
                crate::stats::ms(took),
                k8s_openapi::jiff::Timestamp::now()
            );
            times.entry(subject.restarter).or_default().push(took);
        }
    }
    Ok(times)
}

fn report(size: Size, times: &BTreeMap<Restarter, Vec<Duration>>) {
    println!(
        "P2: ConfigMap data changed → {} matching Pods deleted (seen by a watch), 1 other kept; \
         from the update's response; {} interleaved rounds each",
        size.matching, size.rounds
    );
    let samples: BTreeMap<Restarter, Samples> = times
        .iter()
        .map(|(r, t)| (*r, Samples::new(t.clone())))
        .collect();
    for (restarter, s) in &samples {
        println!("  {:<18} {}", restarter.name(), s.rounds());
    }
    if let (Some(wasm), Some(native)) = (
        samples.get(&Restarter::Kubewasm),
        samples.get(&Restarter::Native),
    ) {
        println!(
            "  kubewasm above the native floor (medians): {}",
            overhead(wasm.median(), native.median())
        );
    }
    if let (Some(wasm), Some(native)) = (
        samples.get(&Restarter::KubewasmUncapped),
        samples.get(&Restarter::Native),
    ) {
        println!(
            "  kubewasm, uncapped, above the native floor (medians): {}",
            overhead(wasm.median(), native.median())
        );
    }
    if let (Some(python), Some(native)) = (
        samples.get(&Restarter::Python),
        samples.get(&Restarter::Native),
    ) {
        println!(
            "  python above the native floor (medians): {}",
            overhead(python.median(), native.median())
        );
    }
}

/// A namespace with the tutorial's RBAC and the annotated ConfigMap, and its restarter
/// running.
async fn start(cp: &ControlPlane, admin: &Client, restarter: Restarter) -> Result<Subject> {
    let ns = cp.namespace(&format!("p2-{restarter:?}")).await?;
    apply_all(admin, &example("configmap-restarter/rbac.yaml", &ns)?).await?;
    apply(
        admin,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, "namespace": ns,
                "annotations": {SELECTOR_ANNOTATION: "app=web"}},
            "data": {"round": "none"}}),
    )
    .await?;
    let running = match restarter {
        Restarter::Kubewasm | Restarter::KubewasmUncapped => {
            let wasm = guest("configmap_restarter");
            let module = module_config_map(
                &ns,
                "configmap-restarter",
                "configmap_restarter.wasm",
                &wasm,
            );
            apply(admin, &module).await?;
            let mut controller = example("configmap-restarter/controller.yaml", &ns)?;
            apply(admin, &take(&mut controller, "WasmController")?).await?;
            let args: &[&str] = match restarter {
                Restarter::KubewasmUncapped => &[
                    "--max-writes-per-second",
                    UNCAPPED,
                    "--write-burst",
                    UNCAPPED,
                ],
                _ => &[],
            };
            let process = RuntimeProcess::start_with_log_filter(
                &cp.runtime_kubeconfig(),
                &ns,
                args,
                BENCH_LOG_FILTER,
            );
            // Its first sighting of the ConfigMap saves the digest: from then on it acts.
            let key = format!("{ns}/{CONFIG_MAP}");
            wait_digest(
                admin,
                Owner::Namespaced(&ns, "configmap-restarter"),
                &key,
                None,
            )
            .await?;
            Running::Kubewasm(Box::new(process))
        }
        Restarter::Native => {
            let client = cp.client_for_service_account(&ns, ACCOUNT).await?;
            let (ready, listed) = oneshot::channel();
            let task = tokio::spawn(native_restarter(client, ns.clone(), ready));
            tokio::time::timeout(START_TIMEOUT, listed)
                .await
                .context("the native restarter did not list the ConfigMaps in time")?
                .context("the native restarter stopped before it listed the ConfigMaps")?;
            Running::Native(task)
        }
        Restarter::Python => {
            let dir = cp
                .state_dir()
                .map(Path::to_owned)
                .unwrap_or_else(std::env::temp_dir);
            let kubeconfig = dir.join(format!("{ns}-{ACCOUNT}.kubeconfig"));
            cp.write_service_account_kubeconfig(&ns, ACCOUNT, TOKEN_LIFETIME, &kubeconfig)
                .await?;
            let log = dir.join(format!("{ns}.log"));
            let child = start_python(&kubeconfig, &ns, &log)?;
            // The tutorial only sees changes made after its watch began.
            let seen = format!("ADDED {CONFIG_MAP}");
            eventually(
                &format!(
                    "the Python restarter's watch sends {seen} (log: {})",
                    log.display()
                ),
                START_TIMEOUT,
                || async { Ok(std::fs::read_to_string(&log)?.contains(&seen).then_some(())) },
            )
            .await?;
            Running::Python(child)
        }
    };
    Ok(Subject {
        restarter,
        namespace: ns,
        running,
    })
}

/// `python restarter.py` as the tutorial runs it: the namespace in `res_namespace`.
fn start_python(kubeconfig: &Path, namespace: &str, log: &Path) -> Result<KillOnDrop> {
    let out = std::fs::File::create(log).with_context(|| format!("{}", log.display()))?;
    let err = out.try_clone()?;
    let script: PathBuf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/cluster/restarter.py");
    let child = Command::new(python::interpreter()?)
        .arg(&script)
        .env("KUBECONFIG", kubeconfig)
        .env("res_namespace", namespace)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {}", script.display()))?;
    Ok(KillOnDrop(child))
}

/// One round: `matching` Pods labelled `app=web` and one `app=db`, then the ConfigMap's data
/// changes; returns the time from the update's response until every `app=web` Pod is gone.
async fn round(
    admin: &Client,
    subject: &mut Subject,
    r: usize,
    matching: usize,
) -> Result<Duration> {
    subject.ensure_running()?;
    let ns = &subject.namespace;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    for i in 0..matching {
        create_pod(&pods, &format!("web-{r}-{i}"), "web").await?;
    }
    let other = format!("db-{r}");
    create_pod(&pods, &other, "db").await?;
    let web = pods.list(&ListParams::default().labels("app=web")).await?;
    let mut left: HashSet<String> = web.items.iter().map(|p| p.name_any()).collect();
    ensure!(
        left.len() == matching,
        "{} app=web Pods, want {matching}",
        left.len()
    );
    let version = web.metadata.resource_version.unwrap_or_default();
    let mut events = pods
        .watch(&WatchParams::default().labels("app=web"), &version)
        .await?
        .boxed();

    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
    let change = json!({"data": {"round": r.to_string()}});
    // One field manager for every round, as a user's repeated `kubectl patch` (kube-apiserver
    // 1.20 then keeps the manager's managedFields `time` at the first change; the restarter
    // bounds a restart by the Pods' own creation times, so it must still restart every round).
    let params = PatchParams::default();
    config_maps
        .patch(CONFIG_MAP, &params, &Patch::Merge(&change))
        .await?;
    let changed = Instant::now();
    let gone = async {
        while let Some(event) = events.try_next().await? {
            match event {
                WatchEvent::Deleted(pod) => {
                    left.remove(&pod.name_any());
                }
                WatchEvent::Error(e) => bail!("the Pod watch failed: {e}"),
                _ => {}
            }
            if left.is_empty() {
                return Ok(changed.elapsed());
            }
        }
        bail!("the Pod watch ended")
    };
    let took = tokio::time::timeout(ROUND_TIMEOUT, gone)
        .await
        .map_err(|_| {
            anyhow::anyhow!("timed out after {ROUND_TIMEOUT:?}: Pods {left:?} were not deleted")
        })??;

    let kept = pods.get_opt(&other).await?;
    ensure!(
        kept.is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        "the non-matching Pod {other} was deleted"
    );
    pods.delete(&other, &DeleteParams::default()).await?;
    Ok(took)
}

/// The floor: watch the namespace's ConfigMaps; when an annotated one's data changes, list the
/// Pods its selector matches and delete them one by one — the API calls of the restarter, with
/// no sandbox and no framework around them. Runs until aborted.
/// Says on `ready` once it has listed the ConfigMaps.
async fn native_restarter(
    client: Client,
    namespace: String,
    ready: oneshot::Sender<()>,
) -> Result<()> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let mut data: BTreeMap<String, Option<BTreeMap<String, String>>> = BTreeMap::new();
    let mut events = watcher(config_maps, watcher::Config::default()).boxed();
    let mut ready = Some(ready);
    while let Some(event) = events.try_next().await? {
        if matches!(event, watcher::Event::InitDone)
            && let Some(ready) = ready.take()
        {
            let _ = ready.send(());
        }
        let (watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) = event else {
            continue;
        };
        let name = cm.name_any();
        let before = data.insert(name, cm.data.clone());
        let Some(selector) = cm.annotations().get(SELECTOR_ANNOTATION) else {
            continue;
        };
        if before.is_none_or(|before| before == cm.data) {
            continue;
        }
        let matching = pods.list(&ListParams::default().labels(selector)).await?;
        for pod in matching {
            match pods.delete(&pod.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => return Err(error.into()),
            }
        }
    }
    bail!("the ConfigMap watch of namespace {namespace} ended")
}
