//! Subcommands of the `kubewasm` binary and what they share.

pub mod capsules;
pub mod check;
pub mod log_server;
pub mod logs;
pub mod new;
pub mod push;
pub mod reconcile;
mod registry;
mod replay;
pub mod rollout;
pub mod run;
pub mod sign;
pub mod wait;
mod yaml;

use std::sync::Arc;

use kubewasm::logs::{LogStore, RingLayer};
use tracing_subscriber::{
    EnvFilter, Layer as _, layer::SubscriberExt as _, util::SubscriberInitExt as _,
};

/// How log lines are written.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logs go to stderr (stdout carries command output); `RUST_LOG` filters, default `info`.
/// With `rings`, the lines about each controller are also kept there (`kubewasm run`).
pub fn init_logging(format: LogFormat, rings: Option<Arc<LogStore>>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal; log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().boxed(),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(rings.map(RingLayer::new))
        .init();
}
