//! `kubewasm reconcile`: one reconcile, offline, with the state given in files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use kube::ResourceExt;
use kubewasm::api::{
    ClusterWasmController, ControllerPlan, Plan, Source, Verb, WasmController, WasmControllerSpec,
};
use kubewasm::host::actions::as_child;
use kubewasm::host::capsules::CapsuleRequest;
use kubewasm::host::request::{self, Documents};
use kubewasm::host::{GrantedReads, ObjectSet, ObjectSource, Permissions};
use kubewasm::sandbox::{Action, Limits, ObjectRef, Sandbox, SandboxConfig, parse_time};
use kubewasm::sources::{self, OfflineOrigin};
use kubewasm_guest_sdk::query::Query;
use serde_json::Value;

use super::yaml::{read_object, read_objects};

mod inputs;
use inputs::{as_cached, candidates, finalizing, not_children, not_reconciled};

/// Arguments of `kubewasm reconcile`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).multiple(true).args(["module", "controller", "capsule"])))]
pub struct Args {
    /// The guest component to run; with --controller, in place of the module its spec
    /// names (the spec's sha256 pin still applies).
    #[arg(long)]
    module: Option<PathBuf>,
    /// A WasmController YAML: its module (path, or a ConfigMap given in --state), grants and
    /// limits are used exactly as the live runtime would.
    #[arg(long)]
    controller: Option<PathBuf>,
    /// The parent object to reconcile (YAML).
    #[arg(long, required_unless_present = "capsule")]
    object: Option<PathBuf>,
    /// More objects the guest can read, and observed children (YAML, repeatable).
    #[arg(long)]
    state: Vec<PathBuf>,
    /// What the controller saved for this object earlier with `setState` (the request's
    /// `state`, e.g. the restarter's data digest); by default nothing.
    #[arg(long, value_name = "STRING")]
    saved: Option<String>,
    /// The parent as the controller last reconciled it (YAML; the request's `previous`); by
    /// default none, as at a controller's first reconcile of the object.
    #[arg(long, value_name = "FILE")]
    previous: Option<PathBuf>,
    /// Also write the request the guest is handed to FILE (JSON, as a capsule's `request`:
    /// each object as the runtime's cache would hold it).
    #[arg(long, value_name = "FILE")]
    request_out: Option<PathBuf>,
    /// Replay a failed reconcile the runtime kept (`kubewasm capsules` fetches them): the same
    /// request and read answers, the module of the capsule's digest (--module, else pulled
    /// from the image its controller names), and says whether it fails the same way (exit 0)
    /// or not (exit 1).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["controller", "object", "state", "saved", "previous"])]
    capsule: Option<PathBuf>,
    /// How to reach the registry of a capsule's image.
    #[command(flatten)]
    registry: super::registry::RegistryArgs,
}

struct Declared {
    name: String,
    spec: Option<WasmControllerSpec>,
    /// The spec parsed as the runtime parses it ([`Plan`]).
    plan: Option<Plan>,
    namespace: Option<String>,
}

impl Declared {
    /// What the controller reconciles, owns and may use, as the runtime would set it up; the
    /// error says why the runtime would not.
    fn controller(&self) -> anyhow::Result<Option<&ControllerPlan>> {
        match self.plan.as_ref().map(|p| &p.controller) {
            None => Ok(None),
            Some(Ok(c)) => Ok(Some(c)),
            Some(Err(e)) => bail!("the controller's spec: {e}; the runtime would not set it up"),
        }
    }
}

/// Runs the reconcile and prints the actions.
pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(capsule) = &args.capsule {
        return super::replay::run(capsule, args.module.as_deref(), &args.registry);
    }
    let object = args
        .object
        .as_deref()
        .context("--object: the parent object to reconcile")?;
    let parent = read_object(object)?;
    let target =
        ObjectRef::of(&parent).map_err(|e| anyhow::anyhow!("`{}`: {e}", object.display()))?;
    let mut state = Vec::new();
    for path in &args.state {
        state.extend(read_objects(path)?);
    }
    let declared = match &args.controller {
        Some(path) => read_controller(path)?,
        None => Declared {
            name: "offline/reconcile".into(),
            spec: None,
            plan: None,
            namespace: None,
        },
    };
    let bytes = module_bytes(&args, &declared, &state)?;
    let controller = declared.controller()?;
    let limits = match controller {
        Some(c) => kubewasm::host::call_limits(&c.limits.limits),
        None => Limits::default(),
    };
    let permissions = match &declared.spec {
        Some(spec) => Permissions::from_spec(&declared.name, declared.namespace.as_deref(), spec),
        None => Permissions::allow_all(&declared.name),
    };

    // What the runtime checks before it calls the guest at all, and the request it makes
    // (host::request, the same code as the runtime's).
    let cached = as_cached(&parent);
    if let Some(c) = controller
        && let Some(why) = not_reconciled(&parent, &cached, c)?
    {
        println!("# {target}: not reconciled: {why}");
        eprintln!("{target} is not one of this controller's parents: the guest was not called");
        return Ok(());
    }
    let sandbox = Sandbox::new(SandboxConfig::default())?;
    let guest = sandbox
        .load(&bytes)
        .context("the module is not a usable guest")?;
    let candidates = candidates(&state, controller);
    let children = request::children_of(&cached, candidates.iter().cloned());
    for left in not_children(&cached, &candidates, &children) {
        eprintln!("{left}");
    }
    let mut documents = Documents::of(Some(&cached), &children);
    documents.state = args.saved.clone();
    if let Some(path) = &args.previous {
        documents.previous = Some(as_cached(&read_object(path)?).text().clone());
    }
    let finalizing = finalizing(&declared, controller, &parent);
    let request = documents.request(&declared.name, &target, finalizing);
    if let Some(out) = &args.request_out {
        let shown = serde_json::to_vec_pretty(&CapsuleRequest::from(&request))?;
        std::fs::write(out, shown).with_context(|| format!("writing {}", out.display()))?;
    }
    let declared_parent = declared.spec.as_ref().map(|spec| (spec, parent));
    let state = Arc::new(ObjectSet::new(state));
    let permissions_shown = permissions.clone();
    let reads = Arc::new(GrantedReads::new(
        state.clone(),
        Arc::new(permissions),
        target.namespace.clone(),
    ));
    let outcome = guest
        .call(request, reads, &limits)
        .with_context(|| format!("reconcile of {target} failed"))?;
    let runtime = declared_parent.as_ref().map(|(spec, parent)| AsApplied {
        spec,
        parent,
        permissions: &permissions_shown,
    });
    print!(
        "{}",
        render(&target, &outcome.response.actions, &state, runtime.as_ref())?
    );
    eprintln!(
        "reconciled {target} with {} in {:.2} ms: {} action(s)",
        guest.digest(),
        outcome.elapsed.as_secs_f64() * 1e3,
        outcome.response.actions.len()
    );
    Ok(())
}

fn read_controller(path: &Path) -> anyhow::Result<Declared> {
    let object = read_object(path)?;
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let invalid = || format!("`{}` is not a valid {kind}", path.display());
    let (name, namespace, spec) = match kind.as_str() {
        "WasmController" => {
            let wc: WasmController = serde_json::from_value(object).with_context(invalid)?;
            let namespace = wc.namespace().unwrap_or_else(|| "default".into());
            (wc.name_any(), Some(namespace), wc.spec)
        }
        "ClusterWasmController" => {
            let cwc: ClusterWasmController =
                serde_json::from_value(object).with_context(invalid)?;
            (cwc.name_any(), None, cwc.spec.controller)
        }
        other => bail!(
            "`{}` is a `{other}`, not a WasmController or ClusterWasmController",
            path.display()
        ),
    };
    let name = match &namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name,
    };
    let mut spec = spec;
    // A module path in the file is relative to the file, as a person reading it expects.
    if let Some(p) = &spec.module.path
        && Path::new(p).is_relative()
    {
        let base = path.parent().unwrap_or(Path::new("."));
        spec.module.path = Some(base.join(p).to_string_lossy().into_owned());
    }
    Ok(Declared {
        name,
        plan: Some(Plan::of(&spec, namespace.as_deref())),
        spec: Some(spec),
        namespace,
    })
}

/// The module: `--module`, or what the controller's spec names, fetched through the same
/// seam as the runtime's ([`kubewasm::sources::fetch`]) from the user's files and `--state`.
fn module_bytes(args: &Args, declared: &Declared, state: &[Value]) -> anyhow::Result<Vec<u8>> {
    let spec = declared.spec.as_ref();
    let pin = spec.and_then(|s| s.module.sha256.as_deref());
    let source = match (&args.module, spec.zip(declared.plan.as_ref())) {
        (Some(path), _) => Source::File {
            path: path.to_string_lossy().into_owned(),
        },
        (None, Some((spec, plan))) => plan.source.clone().map_err(|e| match &spec.module.path {
            Some(_) if declared.namespace.is_some() => {
                anyhow::anyhow!("{e}; offline, give the module with --module")
            }
            _ => anyhow::Error::msg(e),
        })?,
        (None, None) => bail!("no module: give --module or --controller"),
    };
    let origin = OfflineOrigin::new(state);
    let fetched = tokio::runtime::Builder::new_current_thread()
        .build()
        .context("cannot start the async runtime")?
        .block_on(sources::fetch(&origin, &source, pin, None))?;
    match fetched {
        sources::Fetched::Module { bytes, .. } => Ok(bytes.to_vec()),
        // Nothing was loaded before, so nothing can be unchanged.
        sources::Fetched::Unchanged | sources::Fetched::Pending => {
            bail!("no module was read from {source}")
        }
    }
}

/// With a declaration: what the runtime does to an apply on the way to the API server.
struct AsApplied<'a> {
    spec: &'a WasmControllerSpec,
    parent: &'a Value,
    permissions: &'a Permissions,
}

impl AsApplied<'_> {
    /// The object as the runtime would send it, or why it would refuse it; and a note on
    /// what it added.
    fn apply(&self, target: &ObjectRef, object: &mut Value) -> Result<&'static str, String> {
        let r = ObjectRef::of(object).map_err(|e| e.message)?;
        self.permissions
            .check(Verb::Apply, &r.api_version, &r.kind, r.namespace.as_deref())
            .map_err(|e| e.to_string())?;
        let is_parent =
            r.api_version == target.api_version && r.kind == target.kind && r.name == target.name;
        let child = self
            .spec
            .children
            .iter()
            .any(|c| c.api_version == r.api_version && c.kind == r.kind);
        if is_parent {
            Ok("the parent itself (skipped when nothing changes)")
        } else if child {
            as_child(object, self.parent, target).map_err(|e| e.to_string())?;
            Ok(
                "a declared child: the runtime adds the controller ownerReference and the kubewasm.dev/desired-sha256 annotation shown",
            )
        } else {
            Ok(
                "granted, not a declared child: applied without an owner, nothing deletes it with its parent",
            )
        }
    }
}

/// Objects to apply become YAML documents `kubectl apply -f -` accepts; every other action
/// is written as a comment so the stream stays appliable. With a declaration (`runtime`),
/// applies are shown as the runtime sends them, and refused ones as comments.
fn render(
    target: &ObjectRef,
    actions: &[Action],
    state: &ObjectSet,
    runtime: Option<&AsApplied<'_>>,
) -> anyhow::Result<String> {
    let mut out = String::new();
    if actions.is_empty() {
        out.push_str(&format!("# {target}: nothing to do\n"));
    }
    for (i, action) in actions.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        let n = i + 1;
        match action {
            Action::Apply(object) => {
                let mut object = object.clone();
                if object.pointer("/metadata/namespace").is_none()
                    && let (Some(ns), Some(meta)) = (&target.namespace, object.get_mut("metadata"))
                {
                    meta["namespace"] = Value::String(ns.clone());
                }
                let what = ObjectRef::of(&object)
                    .map(|r| r.to_string())
                    .unwrap_or_default();
                out.push_str(&format!("# action {n}: apply {what}\n"));
                match runtime.map(|r| r.apply(target, &mut object)) {
                    None => out.push_str(&serde_yaml::to_string(&object)?),
                    Some(Ok(note)) => {
                        out.push_str(&format!("#   {note}\n"));
                        out.push_str(&serde_yaml::to_string(&object)?);
                    }
                    Some(Err(why)) => {
                        out.push_str(&format!("#   refused by the runtime: {why}\n"));
                        out.push_str(&comment(&serde_yaml::to_string(&object)?));
                    }
                }
            }
            Action::Delete(r) => out.push_str(&format!("# action {n}: delete {r}\n")),
            Action::DeleteAllOf {
                api_version,
                kind,
                namespace,
                label_selector,
                created_before,
            } => {
                let ns = namespace
                    .as_deref()
                    .or(target.namespace.as_deref())
                    .unwrap_or("(cluster)");
                let before = created_before
                    .as_deref()
                    .map(|t| format!(" created before {t}"))
                    .unwrap_or_default();
                out.push_str(&format!(
                    "# action {n}: delete every {kind} ({api_version}) in namespace {ns} matching `{label_selector}`{before}\n"
                ));
                let before = created_before.as_deref().and_then(|t| parse_time(t).ok());
                for name in matching(state, api_version, kind, ns, label_selector, before) {
                    out.push_str(&format!(
                        "#   would delete {kind} {ns}/{name} (from --state)\n"
                    ));
                }
            }
            Action::SetStatus(status) => {
                out.push_str(&format!("# action {n}: set status of {target} to:\n"));
                out.push_str(&comment(&serde_yaml::to_string(status)?));
            }
            Action::Event {
                event_type,
                reason,
                message,
            } => out.push_str(&format!(
                "# action {n}: record {event_type:?} Event on {target}: {reason}: {message}\n"
            )),
            Action::RequeueAfter(d) => out.push_str(&format!(
                "# action {n}: reconcile {target} again in {d:?}\n"
            )),
            Action::SetState(Some(saved)) => {
                out.push_str(&format!("# action {n}: save state for {target}: {saved}\n"))
            }
            Action::SetState(None) => {
                out.push_str(&format!("# action {n}: forget the state of {target}\n"))
            }
            Action::Finalized(done) => out.push_str(&format!(
                "# action {n}: clean-up of {target} {}\n",
                if *done {
                    "done: remove the finalizer"
                } else {
                    "not done yet"
                }
            )),
        }
    }
    Ok(out)
}

fn comment(text: &str) -> String {
    text.lines().map(|l| format!("#   {l}\n")).collect()
}

/// Names of the `--state` objects a delete-by-selector would hit.
fn matching(
    state: &ObjectSet,
    api_version: &str,
    kind: &str,
    namespace: &str,
    selector: &str,
    created_before: Option<k8s_openapi::jiff::Timestamp>,
) -> Vec<String> {
    let namespaced = state.namespaced(api_version, kind).unwrap_or(true);
    let namespace = Some(namespace).filter(|_| namespaced);
    let Ok(query) = Query::new(
        api_version,
        kind,
        namespaced,
        namespace,
        None,
        Some(selector),
    ) else {
        return Vec::new();
    };
    let mut found = state.list(&query);
    kubewasm_guest_sdk::query::sort(&mut found);
    found
        .iter()
        .filter(|o| match created_before {
            None => true,
            Some(before) => o
                .pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .and_then(|t| parse_time(t).ok())
                .is_some_and(|created| created < before),
        })
        .filter_map(|o| {
            o.pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect()
}
