//! `kubewasm rollout status|diff|promote|abort`: a candidate module (`spec.candidate`) as its
//! team sees and decides it, with the user's own kubeconfig. `status` reads the controller's
//! `status.rollout`; `diff` fetches every difference kept through the log server (the `diffs`
//! subresource, which RBAC gives to `edit` and `admin`); `promote` and `abort` change the spec
//! as a person would (one merge patch, [`kubewasm::api::rollout`]), so that GitOps tools see
//! the change.

use anyhow::{Context as _, bail};
use kube::api::{Patch, PatchParams};
use kube::core::ObjectMeta;
use kubewasm::api::{
    ClusterWasmController, WasmController, WasmControllerSpec, WasmControllerStatus, rollout,
};

use super::logs::{Controller, RECONNECT_FOR, explain, reconnectable, user_client};

/// Arguments of `kubewasm rollout`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Print the candidate compared (its digest, and the image it was pulled as), how many
    /// reconciles were compared and how many differed, and the last differences.
    Status(Controller),
    /// Print every difference kept of the last reconciles compared (the runtime keeps the
    /// last 20 differing ones), object by object and field by field.
    Diff {
        #[command(flatten)]
        controller: Controller,
        /// Print the list as the log server answers it (JSON).
        #[arg(long)]
        json: bool,
    },
    /// Make the candidate the module, pinned to the digest compared (`spec.module.sha256`),
    /// and remove it from `spec.candidate`.
    Promote {
        #[command(flatten)]
        controller: Controller,
        /// Promote even when no reconcile was compared yet.
        #[arg(long)]
        force: bool,
    },
    /// Remove the candidate (`spec.candidate`); the live module runs on untouched.
    Abort(Controller),
}

/// Runs `kubewasm rollout`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    rt.block_on(async {
        let client = user_client().await?;
        match args.action {
            Action::Status(controller) => status(&client, &controller).await,
            Action::Diff { controller, json } => diff(&client, &controller, json).await,
            Action::Promote { controller, force } => promote(&client, &controller, force).await,
            Action::Abort(controller) => abort(&client, &controller).await,
        }
    })
}

/// A controller as read: its metadata, spec and status.
struct Read {
    meta: ObjectMeta,
    spec: WasmControllerSpec,
    status: Option<WasmControllerStatus>,
}

fn what(client: &kube::Client, c: &Controller) -> String {
    match c.namespace_in(client) {
        Some(ns) => format!("WasmController {ns}/{}", c.name()),
        None => format!("ClusterWasmController {}", c.name()),
    }
}

async fn read(client: &kube::Client, c: &Controller) -> anyhow::Result<Read> {
    let read = match c.namespace_in(client) {
        Some(ns) => kube::Api::<WasmController>::namespaced(client.clone(), &ns)
            .get(c.name())
            .await
            .map(|o| Read {
                meta: o.metadata,
                spec: o.spec,
                status: o.status,
            }),
        None => kube::Api::<ClusterWasmController>::all(client.clone())
            .get(c.name())
            .await
            .map(|o| Read {
                meta: o.metadata,
                spec: o.spec.controller,
                status: o.status,
            }),
    };
    read.with_context(|| format!("reading {}", what(client, c)))
}

async fn patch(
    client: &kube::Client,
    c: &Controller,
    patch: &serde_json::Value,
) -> anyhow::Result<()> {
    let params = PatchParams::default();
    let done = match c.namespace_in(client) {
        Some(ns) => kube::Api::<WasmController>::namespaced(client.clone(), &ns)
            .patch(c.name(), &params, &Patch::Merge(patch))
            .await
            .map(drop),
        None => kube::Api::<ClusterWasmController>::all(client.clone())
            .patch(c.name(), &params, &Patch::Merge(patch))
            .await
            .map(drop),
    };
    match done {
        Err(kube::Error::Api(s)) if s.code == 409 => bail!(
            "{} changed since it was read: look at `kubewasm rollout status` again and repeat",
            what(client, c)
        ),
        other => other.with_context(|| format!("changing the spec of {}", what(client, c))),
    }
}

/// The rollout as the status tells it, and whether the runtime has seen the spec as it is.
fn current(read: &Read) -> (Option<&kubewasm::api::RolloutStatus>, bool) {
    let status = read.status.as_ref();
    let seen = status.and_then(|s| s.observed_generation) == read.meta.generation;
    (status.and_then(|s| s.rollout.as_ref()), seen)
}

async fn status(client: &kube::Client, c: &Controller) -> anyhow::Result<()> {
    let read = read(client, c).await?;
    let Some(declared) = &read.spec.candidate else {
        println!("{} has no candidate (spec.candidate)", what(client, c));
        return Ok(());
    };
    let (rollout, seen) = current(&read);
    println!("controller: {}", what(client, c));
    let live = read
        .status
        .as_ref()
        .and_then(|s| s.module_digest.as_deref());
    println!("live module: {}", live.unwrap_or("(none loaded)"));
    println!(
        "candidate: {}",
        serde_json::to_string(declared).unwrap_or_default()
    );
    if !seen {
        println!("(the runtime has not reported on this generation of the spec yet)");
    }
    let Some(r) = rollout else {
        println!("not compared yet: the runtime has not reported on the candidate");
        return Ok(());
    };
    println!(
        "compared module: {}",
        r.candidate.as_deref().unwrap_or("(none loaded)")
    );
    if let Some(problem) = &r.problem {
        println!("problem: {problem}");
    }
    println!("compared: {}", r.compared);
    println!("differing: {}", r.differing);
    for d in &r.last_differences {
        println!("difference on {}:", d.object);
        for change in &d.changes {
            println!("  {change}");
        }
    }
    Ok(())
}

/// What the `diffs` subresource answers.
#[derive(serde::Deserialize)]
struct Diffs {
    #[serde(default)]
    candidate: Option<String>,
    compared: u64,
    differing: u64,
    #[serde(default)]
    items: Vec<Differed>,
}

#[derive(serde::Deserialize)]
struct Differed {
    object: String,
    at: String,
    changes: Vec<String>,
}

async fn diff(client: &kube::Client, c: &Controller, json: bool) -> anyhow::Result<()> {
    let path = c.path(client, "diffs");
    let started = std::time::Instant::now();
    let text = loop {
        let request = http::Request::get(&path)
            .body(Vec::new())
            .context("building the request")?;
        match client.request_text(request).await {
            Ok(text) => break text,
            Err(e) if reconnectable(&e, false) && started.elapsed() < RECONNECT_FOR => {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) => return Err(explain(e, c, "diffs")),
        }
    };
    if json {
        println!("{text}");
        return Ok(());
    }
    let diffs: Diffs =
        serde_json::from_str(&text).context("the log server's answer is not a difference list")?;
    println!(
        "candidate {}: {} reconciles compared, {} differing",
        diffs.candidate.as_deref().unwrap_or("(none)"),
        diffs.compared,
        diffs.differing
    );
    for d in &diffs.items {
        println!("{} at {}:", d.object, d.at);
        for change in &d.changes {
            println!("  {change}");
        }
    }
    Ok(())
}

async fn promote(client: &kube::Client, c: &Controller, force: bool) -> anyhow::Result<()> {
    let read = read(client, c).await?;
    if read.spec.candidate.is_none() {
        bail!(
            "{} has no candidate (spec.candidate): nothing to promote",
            what(client, c)
        );
    }
    let (rollout, seen) = current(&read);
    if !seen {
        bail!(
            "the runtime has not reported on {} as its spec is now (generation {:?}): wait (`kubewasm wait`), look at `kubewasm rollout status`, and promote then",
            what(client, c),
            read.meta.generation
        );
    }
    let Some(digest) = rollout.and_then(rollout::compared_digest) else {
        let why = rollout
            .and_then(|r| r.problem.as_deref())
            .unwrap_or("not loaded yet");
        bail!("no candidate module was loaded, so none can be promoted: {why}");
    };
    let (compared, differing) = rollout.map_or((0, 0), |r| (r.compared, r.differing));
    if compared == 0 && !force {
        bail!(
            "no reconcile was compared with candidate {digest} yet: wait for some (`kubewasm rollout status`), or promote it unseen with --force"
        );
    }
    let p = rollout::promotion(&read.spec, digest, read.meta.resource_version.as_deref())
        .map_err(anyhow::Error::msg)?;
    patch(client, c, &p).await?;
    println!(
        "promoted candidate {digest} (compared: {compared}, differing: {differing}) to spec.module of {}, pinned by spec.module.sha256; the runtime runs it from its next reconcile of every object",
        what(client, c)
    );
    Ok(())
}

async fn abort(client: &kube::Client, c: &Controller) -> anyhow::Result<()> {
    let read = read(client, c).await?;
    if read.spec.candidate.is_none() {
        println!("{} has no candidate: nothing to abort", what(client, c));
        return Ok(());
    }
    patch(
        client,
        c,
        &rollout::abort(read.meta.resource_version.as_deref()),
    )
    .await?;
    println!(
        "removed the candidate of {}; the live module runs on",
        what(client, c)
    );
    Ok(())
}
