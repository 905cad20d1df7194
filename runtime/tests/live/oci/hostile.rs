//! A registry written by an attacker (`kubewasm_test_support::hostile_registry`): endless
//! token, manifest and error bodies, a redirect to loopback and one to the API server, and a
//! registry nobody named on loopback. The runtime's memory stays within its bounds, each
//! attacker's controller says why in its status (never what the registry wrote), and another
//! tenant's controller keeps reconciling.

use kubewasm_test_support::hostile_registry::{HostileRegistry, MARKER};
use kubewasm_test_support::runtime::memory_kib;

use super::*;

/// What the runtime may grow by while six controllers pull from the attacker's registries: a
/// few capped reads at once (a token 64 KiB, a manifest 1 MiB), their buffers, and the
/// allocator's slack. Before the capped reader it grew by 4.3 GiB in 40 s.
const GROWTH_MIB: u64 = 150;

/// How long the attacks go on, retried by the runtime, before memory is read.
const ATTACK: std::time::Duration = std::time::Duration::from_secs(20);

#[tokio::test]
async fn a_hostile_registry_costs_bounded_memory_and_explains_itself() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "oci-hostile").await;
    let hostile = HostileRegistry::start().await.unwrap();
    let unnamed = HostileRegistry::start().await.unwrap();
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &[
            "--insecure-registry",
            hostile.addr(),
            "--module-poll-seconds",
            "1",
        ],
    );
    // The API server, as the runtime reaches it.
    let kubeconfig = std::fs::read_to_string(control_plane.kubeconfig()).unwrap_or_default();
    let api_server = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .map_or("https://127.0.0.1:6443", str::trim)
        .trim_end_matches('/')
        .to_owned();
    hostile.redirect_to(&format!("{api_server}/api/v1/secrets"));
    let result = hostile_registry(&client, &ns, &hostile, &unnamed, runtime.pid()).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn hostile_registry(
    client: &Client,
    ns: &str,
    hostile: &HostileRegistry,
    unnamed: &HostileRegistry,
    pid: u32,
) -> Result<()> {
    install_account(client, ns).await?;
    let (baseline_kib, _) = memory_kib(pid)?;
    let attacks: [(&str, String, &str); 6] = [
        (
            "token",
            hostile.image("endless-token"),
            "token is larger than 64Ki",
        ),
        (
            "manifest",
            hostile.image("endless-manifest"),
            "manifest is larger than 1Mi",
        ),
        (
            "error",
            hostile.image("endless-error"),
            "500 Internal Server Error",
        ),
        (
            "loopback",
            hostile.image("redirect-loopback"),
            "a redirect to",
        ),
        ("apiserver", hostile.image("redirect-to"), "a redirect to"),
        (
            "unnamed",
            unnamed.image("endless-manifest"),
            "loopback address 127.0.0.1",
        ),
    ];
    for (name, image, _) in &attacks {
        apply(client, &controller(ns, name, image, None, "hostile")).await?;
    }
    let started = Instant::now();
    for (name, _, says) in &attacks {
        let status = wait_module(client, ns, name, says, |_, st, _, m| {
            ensure!(st == "False" && m.contains(says), "not yet");
            Ok(())
        })
        .await?;
        let shown = serde_json::to_string(&status)?;
        ensure!(
            !shown.contains(MARKER),
            "{name}'s status echoes the registry: {shown}"
        );
        eprintln!(
            "{name}: {}",
            status
                .conditions
                .iter()
                .find(|c| c.type_ == "ModuleReady")
                .map_or("", |c| c.message.as_str())
        );
    }
    ensure!(
        unnamed.connections() == 0,
        "the registry nobody named was contacted {} times",
        unnamed.connections()
    );
    // Meanwhile a controller whose module is in a ConfigMap starts and works.
    local_controller_reconciles(client, ns, "the attacks").await?;
    // The attacks go on (each failed pull is retried) until ATTACK has passed.
    if let Some(rest) = ATTACK.checked_sub(started.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let (rss_kib, peak_kib) = memory_kib(pid)?;
    let sent: u64 = ["endless-token", "endless-manifest", "endless-error"]
        .iter()
        .map(|r| hostile.sent(r))
        .sum();
    eprintln!(
        "hostile registry for {:.0?}: it sent {} MiB of endless bodies in all; the runtime: {} MiB at start, {} MiB now, peak {} MiB",
        started.elapsed(),
        sent >> 20,
        baseline_kib >> 10,
        rss_kib >> 10,
        peak_kib >> 10
    );
    ensure!(
        peak_kib < baseline_kib + (GROWTH_MIB << 10),
        "the runtime grew from {} MiB to a peak of {} MiB",
        baseline_kib >> 10,
        peak_kib >> 10
    );
    Ok(())
}
