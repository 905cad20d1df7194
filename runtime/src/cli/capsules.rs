//! `kubewasm capsules`: a controller's last failed reconciles, fetched with the user's own
//! kubeconfig through the log server (`GET .../wasmcontrollers/NAME/capsules`, which RBAC gives
//! to `edit` and `admin`), each written to a file that `kubewasm reconcile --capsule` replays.

use std::path::PathBuf;

use anyhow::Context as _;
use kubewasm::host::capsules::Capsule;

use super::logs::{Controller, RECONNECT_FOR, explain, reconnectable, user_client};

/// Arguments of `kubewasm capsules`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    controller: Controller,
    /// Write each capsule to `<DIR>/capsule-<N>.json` (the oldest first); without it, the
    /// list is printed as JSON.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// The list the log server answers.
#[derive(serde::Deserialize)]
struct List {
    items: Vec<Capsule>,
}

/// Runs `kubewasm capsules`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let text = rt.block_on(async {
        let client = user_client().await?;
        let path = args.controller.path(&client, "capsules");
        let started = std::time::Instant::now();
        loop {
            let request = http::Request::get(&path)
                .body(Vec::new())
                .context("building the request")?;
            match client.request_text(request).await {
                Ok(text) => return Ok(text),
                // Reached a replica that does not run the controller: another try lands on
                // another one.
                Err(e) if reconnectable(&e, false) && started.elapsed() < RECONNECT_FOR => {
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
                Err(e) => return Err(explain(e, &args.controller, "capsules")),
            }
        }
    })?;
    let Some(dir) = &args.out else {
        println!("{text}");
        return Ok(());
    };
    let list: List =
        serde_json::from_str(&text).context("the log server's answer is not a capsule list")?;
    if list.items.is_empty() {
        eprintln!(
            "no capsules: none of the controller's reconciles failed lately on the replica running it"
        );
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (i, capsule) in list.items.iter().enumerate() {
        let file = dir.join(format!("capsule-{}.json", i + 1));
        let json = serde_json::to_vec_pretty(capsule)?;
        std::fs::write(&file, json).with_context(|| format!("cannot write {}", file.display()))?;
        let replay = match capsule.complete {
            true => "replayable".to_owned(),
            false => format!(
                "not complete: {}",
                capsule.incomplete.as_deref().unwrap_or("?")
            ),
        };
        println!(
            "{}: {} at {}, module {}: {}: {} ({replay})",
            file.display(),
            capsule.object,
            capsule.failed_at,
            capsule.module.digest,
            capsule.error.reason,
            capsule.error.message
        );
    }
    println!(
        "replay one with `kubewasm reconcile --capsule {}` (with --module FILE for a module from a ConfigMap)",
        dir.join("capsule-1.json").display()
    );
    Ok(())
}
