//! `kubectl` as a person runs it against a test cluster: a child process with `KUBECONFIG`
//! set, its output returned, and on failure an error that quotes the command and its stderr.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::io::AsyncWriteExt as _;

use super::ControlPlane;

/// Runs `kubectl` (from `PATH`) with one kubeconfig.
#[derive(Debug, Clone)]
pub struct Kubectl {
    kubeconfig: PathBuf,
}

impl ControlPlane {
    /// `kubectl` with the admin kubeconfig.
    pub fn kubectl(&self) -> Kubectl {
        Kubectl::new(self.kubeconfig())
    }
}

impl Kubectl {
    /// `kubectl` with `KUBECONFIG=<kubeconfig>`.
    pub fn new(kubeconfig: &Path) -> Self {
        Kubectl {
            kubeconfig: kubeconfig.to_owned(),
        }
    }

    /// Runs `kubectl <args>` and returns its stdout; fails with its stderr unless it exits 0.
    pub async fn run(&self, args: &[&str]) -> Result<String> {
        self.run_with_input(args, None).await
    }

    /// Runs `kubectl <args>` with `input` on its stdin (`kubectl apply -f -`).
    pub async fn run_with_input(&self, args: &[&str], input: Option<&[u8]>) -> Result<String> {
        let shown = format!("kubectl {}", args.join(" "));
        let out = self.output(args, input).await?;
        if !out.status.success() {
            bail!(
                "`{shown}` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        String::from_utf8(out.stdout).with_context(|| format!("the output of `{shown}`"))
    }

    /// `kubectl auth can-i <args>`: whether the answer is yes (kubectl exits 1 for no).
    pub async fn can_i(&self, args: &[&str]) -> Result<bool> {
        let mut all = vec!["auth", "can-i"];
        all.extend(args);
        let out = self.output(&all, None).await?;
        match (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim(),
        ) {
            (Some(0), "yes") => Ok(true),
            (Some(1), "no") => Ok(false),
            (_, stdout) => bail!(
                "`kubectl {}` failed ({}): {stdout} {}",
                all.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
    }

    async fn output(&self, args: &[&str], input: Option<&[u8]>) -> Result<std::process::Output> {
        let shown = format!("kubectl {}", args.join(" "));
        let mut child = tokio::process::Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("running `{shown}` (is kubectl installed and on PATH?)"))?;
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin
                .write_all(input)
                .await
                .with_context(|| format!("writing to the stdin of `{shown}`"))?;
        }
        child
            .wait_with_output()
            .await
            .with_context(|| format!("running `{shown}`"))
    }

    /// Runs `kubectl <args> -o json` and parses what it prints.
    pub async fn json(&self, args: &[&str]) -> Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let out = self.run(&all).await?;
        serde_json::from_str(&out).with_context(|| format!("parsing `kubectl {}`", all.join(" ")))
    }
}
