//! The `kubewasm` command: run WebAssembly controllers live, or one reconcile offline.

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Runs Kubernetes controllers as sandboxed WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "kubewasm", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format on stderr.
    #[arg(long, global = true, env = "KUBEWASM_LOG_FORMAT", value_enum, default_value_t = cli::LogFormat::Text)]
    log_format: cli::LogFormat,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one reconcile of a guest in the sandbox, offline, and print the actions as YAML.
    Reconcile(cli::reconcile::Args),
    /// Compile and validate a guest module and print its digest.
    Check(cli::check::Args),
    /// Write a new guest crate: the controller, native tests, its manifests and a Makefile.
    New(cli::new::Args),
    /// Host the cluster's WasmControllers (kubeconfig or in-cluster config) until SIGTERM.
    Run(Box<cli::run::Args>),
    /// Print a controller's log lines (its guest's and the runtime's about it), read through
    /// the Kubernetes API with your own credentials, as `kubectl logs` does for a Pod.
    Logs(cli::logs::Args),
    /// Fetch a controller's last failed reconciles (capsules), for `kubewasm reconcile
    /// --capsule` to replay offline.
    Capsules(cli::capsules::Args),
    /// A candidate module (spec.candidate) run in shadow: its status and differences, and
    /// promoting or aborting it.
    Rollout(cli::rollout::Args),
    /// Push a built component to a registry (as a wasm OCI artifact) and print its digest.
    Push(cli::push::Args),
    /// Sign a pushed module's digest with a key (cosign's format) and push the signature.
    Sign(cli::sign::Args),
    /// Wait for the runtime's verdict on a WasmController's module as declared now: exit 0
    /// once it runs, 1 with the reason when it is refused (or no verdict within --timeout).
    Wait(cli::wait::Args),
    /// Print the CustomResourceDefinitions of the kubewasm.dev API.
    Crds,
    /// Compile one module read on stdin into FILE: the process `kubewasm run` starts for each
    /// new module, under limits (not for use by hand).
    #[command(hide = true)]
    CompileModule {
        /// The file to create with the compiled module.
        #[arg(long, value_name = "FILE")]
        out: std::path::PathBuf,
        /// Compile in the epoch deadline checks (the runtime's setting).
        #[arg(long, action = clap::ArgAction::Set, default_value_t = true)]
        epoch_interruption: bool,
        /// The memory the compile may use (RLIMIT_DATA), in bytes.
        #[arg(long)]
        max_memory_bytes: u64,
        /// The CPU time the compile may use (RLIMIT_CPU), in seconds.
        #[arg(long)]
        max_cpu_seconds: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The compiler process logs nothing: its stderr is its message to the runtime.
    if let Command::CompileModule {
        out,
        epoch_interruption,
        max_memory_bytes,
        max_cpu_seconds,
    } = &cli.command
    {
        return kubewasm::sandbox::child_main(
            out,
            *epoch_interruption,
            *max_memory_bytes,
            *max_cpu_seconds,
        );
    }
    // The lines about each controller are kept for its team (`kubewasm logs`) by `run`.
    let rings = match &cli.command {
        Command::Run(args) => match args.logs.store() {
            Ok(store) => Some(store),
            Err(err) => {
                eprintln!("error: {err:#}");
                return ExitCode::FAILURE;
            }
        },
        _ => None,
    };
    cli::init_logging(cli.log_format, rings.clone());
    let result = match cli.command {
        Command::Reconcile(args) => cli::reconcile::run(args),
        Command::Check(args) => cli::check::run(args),
        Command::New(args) => cli::new::run(args),
        Command::Run(args) => cli::run::run(*args, rings.unwrap_or_default()),
        Command::Logs(args) => cli::logs::run(args),
        Command::Capsules(args) => cli::capsules::run(args),
        Command::Rollout(args) => cli::rollout::run(args),
        Command::Push(args) => cli::push::run(args),
        Command::Sign(args) => cli::sign::run(args),
        Command::Wait(args) => cli::wait::run(args),
        Command::CompileModule { .. } => Ok(()),
        Command::Crds => {
            print!("{}", kubewasm::api::crds_yaml());
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
