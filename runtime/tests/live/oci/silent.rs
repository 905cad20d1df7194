//! A registry that accepts connections and never answers stalls nothing else.

use super::*;

#[tokio::test]
async fn a_registry_that_never_answers_stalls_nothing_else() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "oci-silent").await;
    // Accepts connections and never says a byte.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &["--insecure-registry", &addr, "--module-poll-seconds", "1"],
    );
    let result = silent_registry(&client, &ns, &addr).await;
    finish(result, &mut [&mut runtime]);
    held.abort();
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn silent_registry(client: &Client, ns: &str, addr: &str) -> Result<()> {
    install_account(client, ns).await?;
    for i in 0..6 {
        let image = format!("{addr}/team/silent-{i}:v1");
        apply(
            client,
            &controller(ns, &format!("silent-{i}"), &image, None, "silent"),
        )
        .await?;
    }
    wait_module(
        client,
        ns,
        "silent-0",
        "pulling, said in the status",
        |_, st, reason, m| {
            ensure!(
                st == "False" && reason == "ModuleNotLoaded" && m.contains("pulling"),
                "not yet"
            );
            Ok(())
        },
    )
    .await?;
    // Meanwhile a controller whose module is in a ConfigMap starts and works at once.
    let started = Instant::now();
    local_controller_reconciles(client, ns, "the silent pulls").await?;
    eprintln!(
        "a ConfigMap controller beside 6 silent pulls reconciled in {:.2?}",
        started.elapsed()
    );
    ensure!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the ConfigMap controller waited {:?} for the silent registry",
        started.elapsed()
    );
    Ok(())
}
