//! `kubewasm run`: host the cluster's WasmControllers until SIGTERM or Ctrl-C.

use std::time::Duration;

use anyhow::Context;
use kubewasm::manager::{Manager, ManagerConfig};

/// Arguments of `kubewasm run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Guest instances that may run at once across all controllers.
    #[arg(long, default_value_t = 32)]
    max_instances: u32,
    /// Seconds between re-reads of modules given as file paths.
    #[arg(long, default_value_t = 5)]
    module_poll_seconds: u64,
    /// Host only the WasmControllers of this namespace (no ClusterWasmControllers); several
    /// runtimes can then share a cluster, one per namespace.
    #[arg(long)]
    namespace: Option<String>,
}

/// Connects with the kubeconfig (or in-cluster config) and runs the manager.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    rt.block_on(async move {
        let kube_config = kube::Config::infer().await.context(
            "cannot find a Kubernetes configuration: set KUBECONFIG (e.g. `eval \"$(make -s cluster-up)\"`) or run inside a cluster",
        )?;
        let mut config = ManagerConfig::default();
        config.sandbox.max_instances = args.max_instances;
        config.namespace = args.namespace;
        config.module_poll = Duration::from_secs(args.module_poll_seconds.max(1));
        let manager = Manager::new(kube_config, config)?;
        manager.run(shutdown_signal()).await
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("received shutdown signal");
}
