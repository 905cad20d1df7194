//! The flags of `kubewasm run` about the controllers' log lines: how many are kept, and the
//! server that hands them to each team (`logs.kubewasm.dev`, through the aggregation layer).

use std::sync::Arc;
use std::time::Duration;

use kubewasm::api::Unit;
use kubewasm::logs::{DEFAULT_NAMESPACE_BYTES, DEFAULT_RING_BYTES, LogStore};

/// How often setting the log server up is tried again after it failed.
const RETRY: Duration = Duration::from_secs(30);

/// Flags of the controllers' log lines.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// The most bytes of log lines kept in memory per controller, a quantity: its guest's
    /// lines and the runtime's lines about it, newest kept, each line counting 64 bytes more
    /// than its text.
    #[arg(long, default_value_t = Unit::Bytes.show(DEFAULT_RING_BYTES as u64))]
    log_ring_bytes: String,
    /// The most bytes of log lines kept per namespace, all its controllers together (the
    /// ClusterWasmControllers count as one namespace), a quantity: past it, the namespace's
    /// largest ring gives its oldest lines up.
    #[arg(long, default_value_t = Unit::Bytes.show(DEFAULT_NAMESPACE_BYTES as u64))]
    log_ring_bytes_per_namespace: String,
    /// Serve the controllers' log lines on this address (HTTPS), as the API group
    /// `logs.kubewasm.dev` behind the Kubernetes aggregation layer (deploy/runtime/logs.yaml),
    /// e.g. `0.0.0.0:8443`. Unset: lines are kept but not served.
    #[arg(long, value_name = "ADDR")]
    api_addr: Option<std::net::SocketAddr>,
    /// The serving certificate (PEM) of `--api-addr`; unset, a self-signed one is made at start
    /// (the APIService then says `insecureSkipTLSVerify`).
    #[arg(long, value_name = "FILE", requires = "api_key_file")]
    api_cert_file: Option<std::path::PathBuf>,
    /// The key (PEM) of `--api-cert-file`.
    #[arg(long, value_name = "FILE", requires = "api_cert_file")]
    api_key_file: Option<std::path::PathBuf>,
    /// Readers following logs (`kubewasm logs -f`) at once on this replica, in all.
    #[arg(long, default_value_t = 100)]
    log_max_followers: usize,
    /// Readers following one controller's log at once.
    #[arg(long, default_value_t = 10)]
    log_max_followers_per_controller: usize,
    /// Seconds a follower may leave its lines unread before its connection is cut.
    #[arg(long, default_value_t = 15)]
    log_follow_stall_seconds: u64,
}

impl LogArgs {
    /// The store of lines the flags say.
    pub fn store(&self) -> anyhow::Result<Arc<LogStore>> {
        let bytes = |flag: &str, value: &str| -> anyhow::Result<usize> {
            match kubewasm::api::parse_bytes(value) {
                Ok(0) | Err(_) => {
                    anyhow::bail!("--{flag} {value}: give a quantity above 0, e.g. 256Ki")
                }
                Ok(bytes) => Ok(bytes),
            }
        };
        Ok(Arc::new(LogStore::new(
            bytes("log-ring-bytes", &self.log_ring_bytes)?,
            bytes(
                "log-ring-bytes-per-namespace",
                &self.log_ring_bytes_per_namespace,
            )?,
        )))
    }

    /// Starts the log server when `--api-addr` says so, beside the runtime: a cluster without
    /// the aggregation layer (or a runtime without the RBAC of deploy/runtime/logs.yaml) does
    /// not stop the controllers; the reason is logged and the setup tried again.
    pub fn start(
        &self,
        store: Arc<LogStore>,
        kept: kubewasm::logs::serve::Kept,
        client: kube::Client,
        shards: Option<Arc<kubewasm::controller::ShardHolder>>,
    ) {
        let Some(addr) = self.api_addr else {
            return;
        };
        let config = kubewasm::logs::serve::ServeConfig {
            addr,
            cert: self.api_cert_file.clone().zip(self.api_key_file.clone()),
            max_followers: self.log_max_followers,
            max_followers_per_controller: self.log_max_followers_per_controller,
            stall: Duration::from_secs(self.log_follow_stall_seconds.max(1)),
        };
        tokio::spawn(async move {
            loop {
                match kubewasm::logs::serve::start(
                    store.clone(),
                    kept.clone(),
                    client.clone(),
                    config.clone(),
                    shards.clone(),
                )
                .await
                {
                    Ok(bound) => {
                        tracing::info!(
                            "serving the controllers' logs (logs.kubewasm.dev) on https://{bound}"
                        );
                        return;
                    }
                    Err(e) => {
                        tracing::error!(
                            "cannot serve the controllers' logs (trying again in {RETRY:?}): {e}"
                        );
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        });
    }
}
