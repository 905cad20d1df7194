//! `kubewasm wait -n NS NAME`: waits for the runtime's verdict on a WasmController as it is
//! declared now — its spec and, for a module in a ConfigMap, the ConfigMap as it is now — and
//! exits 0 once the module now declared runs, non-zero with the reason when it is refused or
//! the controller cannot start. What `kubectl rollout status` is to a Deployment: the update
//! path of `kubewasm new`'s Makefile ends with it, so `make update` fails when the module does.
//!
//! It acts with the user's own kubeconfig (`KUBECONFIG`, or `~/.kube/config`) and reads only
//! what a namespace's `view` role may: the WasmController and its module's ConfigMap.
//!
//! A verdict counts only once the runtime has seen the spec (`status.observedGeneration`) and
//! judged the module's source at its current revision (`status.moduleRevision`: a ConfigMap's
//! resourceVersion); a module from an image is judged by its ModuleReady condition alone (a tag
//! may move at any time).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

use kubewasm::api::WasmController;

/// How often the status is read again.
const POLL: Duration = Duration::from_millis(500);

/// Arguments of `kubewasm wait`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The WasmController's name.
    name: String,
    /// Its namespace.
    #[arg(short, long)]
    namespace: String,
    /// Give up after this many seconds (exit 1 with what the status says then).
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    timeout: u64,
}

/// What the status says of the controller as declared now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not judged yet (why, for the progress line).
    Waiting(String),
    /// The module now declared runs (what Ready says).
    Running(String),
    /// Refused: the module, or the controller's start; someone must act (the reason and
    /// message, which name who and how).
    Refused(String),
}

/// Ready reasons that need a person to act before the controller can start: reported at once.
const STOPPED: [&str; 5] = [
    "Forbidden",
    "InvalidSpec",
    "NotWatchable",
    "TooManyControllers",
    "StateBudgetExceeded",
];

/// Reasons of a start still under way.
const STARTING: [&str; 6] = [
    "Starting",
    "WaitingForCaches",
    "ModuleNotReady",
    "ModuleNotLoaded",
    "SetupTimedOut",
    "KindNotFound",
];

/// The verdict on `wc` when its module's source is at `revision` now (`None`: not checked).
pub fn judge(wc: &WasmController, revision: Option<&str>) -> Verdict {
    let Some(status) = &wc.status else {
        return Verdict::Waiting(
            "no status yet (is a kubewasm runtime running for this namespace?)".into(),
        );
    };
    let generation = wc.metadata.generation.unwrap_or_default();
    if status.observed_generation.unwrap_or_default() < generation {
        return Verdict::Waiting(format!(
            "the runtime has not seen generation {generation} of the spec yet"
        ));
    }
    let condition = |type_: &str| status.conditions.iter().find(|c| c.type_ == type_);
    let said = |c: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition| {
        format!("{} ({}): {}", c.type_, c.reason, c.message)
    };
    let ready = condition("Ready");
    if let Some(r) = ready.filter(|r| r.status != "True" && STOPPED.contains(&r.reason.as_str())) {
        return Verdict::Refused(said(r));
    }
    if let Some(wanted) = revision
        && status.module_revision.as_deref() != Some(wanted)
    {
        // What the status says now is about an older revision: shown, not judged.
        let now = condition("ModuleReady")
            .map(|m| format!(" (it says of an earlier one: {})", said(m)))
            .unwrap_or_default();
        return Verdict::Waiting(format!(
            "the runtime has not judged the module's ConfigMap at resourceVersion {wanted} yet{now}"
        ));
    }
    match condition("ModuleReady") {
        None => return Verdict::Waiting("no ModuleReady condition yet".into()),
        Some(m) if m.status != "True" => {
            if STARTING.contains(&m.reason.as_str()) {
                return Verdict::Waiting(said(m));
            }
            return Verdict::Refused(said(m));
        }
        Some(_) => {}
    }
    match ready {
        None => Verdict::Waiting("no Ready condition yet".into()),
        Some(r) if r.status == "True" => Verdict::Running(r.message.clone()),
        Some(r) if STARTING.contains(&r.reason.as_str()) => Verdict::Waiting(said(r)),
        // Running its module, with objects failing: the module's verdict is in (its failures
        // are the controller's work, shown in the status and as Events).
        Some(r) => Verdict::Running(said(r)),
    }
}

/// Waits for the verdict (see the module doc).
pub fn run(args: Args) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(wait(args))
}

async fn wait(args: Args) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("no kubeconfig (KUBECONFIG, ~/.kube/config) or in-cluster configuration")?;
    let controllers: Api<WasmController> = Api::namespaced(client.clone(), &args.namespace);
    let started = Instant::now();
    let timeout = Duration::from_secs(args.timeout);
    let mut last = String::new();
    let shown = format!("wasmcontroller {}/{}", args.namespace, args.name);
    loop {
        let wc = controllers
            .get_opt(&args.name)
            .await
            .with_context(|| format!("reading {shown}"))?;
        let Some(wc) = wc else {
            bail!("{shown} does not exist");
        };
        let revision = match &wc.spec.module.config_map {
            Some(cm) => {
                let ns = cm.namespace.as_deref().unwrap_or(&args.namespace);
                let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
                let meta = maps
                    .get_metadata_opt(&cm.name)
                    .await
                    .with_context(|| format!("reading the module's ConfigMap {ns}/{}", cm.name))?;
                let Some(meta) = meta else {
                    bail!(
                        "the module's ConfigMap {ns}/{} does not exist: create it (`make load` in a crate from `kubewasm new`)",
                        cm.name
                    );
                };
                meta.metadata.resource_version
            }
            None => None,
        };
        match judge(&wc, revision.as_deref()) {
            Verdict::Running(message) => {
                let digest = wc
                    .status
                    .as_ref()
                    .and_then(|s| s.module_digest.clone())
                    .unwrap_or_default();
                println!("{shown} runs module {digest}: {message}");
                return Ok(());
            }
            Verdict::Refused(why) => bail!("{shown} refused: {why}"),
            Verdict::Waiting(why) => {
                if started.elapsed() >= timeout {
                    bail!(
                        "{shown}: no verdict within {}s (--timeout): {why}",
                        timeout.as_secs()
                    );
                }
                if why != last {
                    eprintln!("waiting: {why}");
                    last = why;
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(generation: i64, status: serde_json::Value) -> WasmController {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubewasm.dev/v1alpha1", "kind": "WasmController",
            "metadata": {"name": "c", "namespace": "team", "generation": generation},
            "spec": {"module": {"configMap": {"name": "m", "key": "m.wasm"}},
                     "parent": {"apiVersion": "v1", "kind": "ConfigMap"}},
            "status": status,
        }))
        .unwrap()
    }

    fn conditions(module: (&str, &str), ready: (&str, &str)) -> serde_json::Value {
        let c = |t: &str, (s, r): (&str, &str)| serde_json::json!({"type": t, "status": s, "reason": r, "message": format!("{t} says {r}"), "lastTransitionTime": "2026-01-01T00:00:00Z"});
        serde_json::json!([c("ModuleReady", module), c("Ready", ready)])
    }

    #[test]
    fn a_verdict_counts_only_for_the_spec_and_module_revision_now() {
        let running = |rev: &str, gen_seen: i64| {
            serde_json::json!({"observedGeneration": gen_seen, "moduleRevision": rev, "reconciles": 0, "failures": 0,
                "conditions": conditions(("True", "ModuleLoaded"), ("True", "Running"))})
        };
        assert!(
            matches!(judge(&wc(2, running("7", 1)), Some("7")), Verdict::Waiting(w) if w.contains("generation 2"))
        );
        assert!(
            matches!(judge(&wc(2, running("6", 2)), Some("7")), Verdict::Waiting(w) if w.contains("resourceVersion 7"))
        );
        assert!(matches!(
            judge(&wc(2, running("7", 2)), Some("7")),
            Verdict::Running(_)
        ));
        assert!(matches!(
            judge(&wc(2, running("6", 2)), None),
            Verdict::Running(_)
        ));
        let no_status: WasmController = {
            let mut w = wc(1, serde_json::json!({}));
            w.status = None;
            w
        };
        assert!(matches!(judge(&no_status, None), Verdict::Waiting(_)));
    }

    #[test]
    fn a_refused_module_or_start_is_refused_and_starting_is_waiting() {
        let status = |module, ready| {
            serde_json::json!({"observedGeneration": 1, "moduleRevision": "7", "reconciles": 0, "failures": 0,
                "conditions": conditions(module, ready)})
        };
        // The new module refused while the last good one runs (READY True).
        let v = judge(
            &wc(1, status(("False", "ModuleInvalid"), ("True", "Running"))),
            Some("7"),
        );
        assert_eq!(
            v,
            Verdict::Refused("ModuleReady (ModuleInvalid): ModuleReady says ModuleInvalid".into())
        );
        let v = judge(
            &wc(
                1,
                status(("False", "ModuleNotLoaded"), ("False", "Starting")),
            ),
            Some("7"),
        );
        assert!(matches!(v, Verdict::Waiting(_)), "{v:?}");
        // Not allowed to start: reported whatever the module's revision (it is never read).
        let v = judge(
            &wc(
                1,
                status(("False", "ModuleNotLoaded"), ("False", "Forbidden")),
            ),
            Some("8"),
        );
        assert!(
            matches!(v, Verdict::Refused(ref m) if m.starts_with("Ready (Forbidden)")),
            "{v:?}"
        );
        let v = judge(
            &wc(
                1,
                status(("True", "ModuleLoaded"), ("False", "WaitingForCaches")),
            ),
            Some("7"),
        );
        assert!(matches!(v, Verdict::Waiting(_)), "{v:?}");
        // Running, an object failing: the module's verdict is in.
        let v = judge(
            &wc(
                1,
                status(("True", "ModuleLoaded"), ("False", "ReconcileFailed")),
            ),
            Some("7"),
        );
        assert!(
            matches!(v, Verdict::Running(ref m) if m.contains("ReconcileFailed")),
            "{v:?}"
        );
    }
}
