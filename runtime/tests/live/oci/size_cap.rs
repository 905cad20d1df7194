//! A module over `--max-module-bytes` is refused before its layer is read.

use super::*;

#[tokio::test]
async fn a_module_over_the_size_cap_is_refused_unread() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "oci-cap").await;
    let registry = Registry::start().expect("starting docker-registry");
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &[
            "--insecure-registry",
            registry.addr(),
            "--max-module-bytes",
            "64Ki",
        ],
    );
    let result = over_cap(&client, &ns, &registry).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn over_cap(client: &Client, ns: &str, registry: &Registry) -> Result<()> {
    install_account(client, ns).await?;
    let file = crate::support::guests::guest_dir().join("hostile.wasm");
    let wasm = guest("hostile");
    ensure!(
        wasm.len() > 64 << 10,
        "the hostile guest is only {} bytes",
        wasm.len()
    );
    let tag = format!("{}/team/big:v1", registry.addr());
    push(&file, &tag, None)?;
    apply(client, &controller(ns, "big", &tag, None, "big")).await?;
    wait_module(
        client,
        ns,
        "big",
        "the module over 64Ki refused",
        |s, st, reason, m| {
            ensure!(
                st == "False" && reason == "ModuleInvalid",
                "not refused yet"
            );
            ensure!(
                m.contains("larger than 64Ki") && m.contains("--max-module-bytes"),
                "{m}"
            );
            ensure!(
                s.module_digest.is_none(),
                "a module runs: {:?}",
                s.module_digest
            );
            Ok(())
        },
    )
    .await?;
    ensure!(
        !blob_was_read(registry, &layer_digest(&wasm)),
        "the registry was asked for the layer over the cap"
    );
    Ok(())
}
