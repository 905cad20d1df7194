//! A tag that moves to a new digest at every poll cannot make the runtime compile forever:
//! the namespace's compile budget (`--compile-burst`, `--compiles-per-hour`) refuses the
//! compiles past it, the status says so, and the last good module keeps running.

use super::*;

#[tokio::test]
async fn a_tag_that_moves_every_poll_is_compiled_within_the_budget() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "oci-moving").await;
    let registry = Registry::start().expect("starting docker-registry");
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &[
            "--insecure-registry",
            registry.addr(),
            "--module-poll-seconds",
            "1",
            "--compile-burst",
            "2",
            "--compiles-per-hour",
            "0",
        ],
    );
    let result = moving_tag(&client, &ns, &registry).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

/// The hostile guest with a custom section naming `n`: the same component, another digest.
fn variant(n: u8) -> Vec<u8> {
    let mut wasm = guest("hostile");
    let name = b"kubewasm-test-variant";
    let size = u8::try_from(name.len() + 2).unwrap_or(u8::MAX);
    wasm.extend_from_slice(&[0, size, u8::try_from(name.len()).unwrap_or(0)]);
    wasm.extend_from_slice(name);
    wasm.push(n);
    wasm
}

async fn moving_tag(client: &Client, ns: &str, registry: &Registry) -> Result<()> {
    install_account(client, ns).await?;
    let dir = tempfile::tempdir()?;
    let tag = format!("{}/team/moving:v1", registry.addr());
    let push_variant = |n: u8| -> Result<Vec<u8>> {
        let wasm = variant(n);
        let file = dir.path().join(format!("variant-{n}.wasm"));
        std::fs::write(&file, &wasm)?;
        push(&file, &tag, None)?;
        Ok(wasm)
    };
    // The burst: two compiles.
    apply(client, &controller(ns, "moving", &tag, None, "moving")).await?;
    // One after the other: the tag moves once the status shows the module before.
    for n in 0..2 {
        let wasm = push_variant(n)?;
        wait_module(
            client,
            ns,
            "moving",
            &format!("variant {n} loaded"),
            |s, st, _, _| {
                ensure!(
                    st == "True" && s.module_digest == Some(sha256(&wasm)),
                    "not yet"
                );
                Ok(())
            },
        )
        .await?;
    }
    let running = sha256(&variant(1));
    // Then the tag moves at every poll: nothing more is compiled.
    let started = Instant::now();
    for n in 2..8 {
        push_variant(n)?;
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    }
    let status = wait_module(
        client,
        ns,
        "moving",
        "the compile refused",
        |s, st, reason, m| {
            ensure!(
                st == "False" && reason == "CompileBudgetExceeded",
                "not refused yet"
            );
            ensure!(
                m.contains("--compiles-per-hour") && m.contains("--compile-burst"),
                "{m}"
            );
            ensure!(
                s.module_digest.as_ref() == Some(&running),
                "{:?}",
                s.module_digest
            );
            Ok(())
        },
    )
    .await?;
    eprintln!(
        "a tag moved 6 times in {:.0?}: 2 compiles, then {}",
        started.elapsed(),
        status
            .conditions
            .iter()
            .find(|c| c.type_ == "ModuleReady")
            .map_or("", |c| c.message.as_str())
    );
    // The last good module keeps running.
    let ready = condition(&status, "Ready")?;
    ensure!(
        ready.status == "True",
        "Ready {} {}",
        ready.status,
        ready.message
    );
    Ok(())
}
