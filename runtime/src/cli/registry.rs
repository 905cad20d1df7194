//! What `kubewasm push` and `kubewasm sign` share: how they reach a registry and with which
//! credentials.
//!
//! Credentials: `--username` with `--password-stdin`, else the registry's entry in the docker
//! config (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`; `auths` entries only,
//! no credential helpers), else none.

use std::future::Future;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use kubewasm::sources::oci::{RegistryConfig, docker_config_auth};
use oci_client::secrets::RegistryAuth;

/// How long a whole push or sign may take.
const TIMEOUT: Duration = Duration::from_secs(600);

/// How to reach the registry.
#[derive(Debug, clap::Args)]
pub struct RegistryArgs {
    /// Speak plain HTTP to the registry (a development registry on loopback); the runtime
    /// pulls from it only with `kubewasm run --insecure-registry HOST:PORT`.
    #[arg(long)]
    pub insecure: bool,
    /// The registry user; the password is read from stdin (`--password-stdin`). Without it,
    /// the registry's entry in the docker config is used, if there is one.
    #[arg(long, requires = "password_stdin")]
    username: Option<String>,
    /// Read the password for `--username` from stdin.
    #[arg(long, requires = "username")]
    password_stdin: bool,
}

impl RegistryArgs {
    /// A client for `registry` (plain HTTP with `--insecure`).
    pub fn client(&self, registry: &str) -> anyhow::Result<oci_client::Client> {
        let config = RegistryConfig {
            insecure: if self.insecure {
                vec![registry.to_owned()]
            } else {
                Vec::new()
            },
            ..RegistryConfig::new(kubewasm::sources::DEFAULT_MAX_MODULE_BYTES)
        };
        Ok(config.client()?)
    }

    /// What failed talking to `reference`, with the hint that a plain-HTTP registry needs
    /// `--insecure`.
    pub fn cannot(&self, what: &str, reference: &str) -> String {
        match self.insecure {
            true => format!("cannot {what} {reference}"),
            false => format!(
                "cannot {what} {reference} over HTTPS (a registry that speaks plain HTTP needs --insecure)"
            ),
        }
    }

    /// `--username` and the password on stdin, else the docker config's entry, else anonymous.
    pub fn credentials(&self, registry: &str) -> anyhow::Result<RegistryAuth> {
        if let Some(user) = &self.username {
            let mut password = String::new();
            std::io::stdin()
                .take(64 << 10)
                .read_to_string(&mut password)
                .context("cannot read the password from stdin")?;
            let password = password.trim_end_matches(['\n', '\r']);
            if password.is_empty() {
                bail!("--password-stdin: stdin gave no password");
            }
            return Ok(RegistryAuth::Basic(user.clone(), password.to_owned()));
        }
        let path = match std::env::var_os("DOCKER_CONFIG") {
            Some(dir) => PathBuf::from(dir).join("config.json"),
            None => match std::env::var_os("HOME") {
                Some(home) => Path::new(&home).join(".docker/config.json"),
                None => return Ok(RegistryAuth::Anonymous),
            },
        };
        let json = match std::fs::read(&path) {
            Ok(json) => json,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(RegistryAuth::Anonymous);
            }
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        Ok(docker_config_auth(&json, registry)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
            .unwrap_or(RegistryAuth::Anonymous))
    }
}

/// An image reference as `spec.module.image` takes it, its errors naming "the reference".
pub fn image_reference(reference: &str) -> anyhow::Result<kubewasm::api::ImageRef> {
    kubewasm::api::ImageRef::parse(reference)
        .map_err(|e| anyhow::anyhow!("{}", e.replacen("spec.module.image", "the reference", 1)))
}

/// Runs `work` on a runtime of its own, within the commands' deadline.
pub fn block_on<T>(what: &str, work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    rt.block_on(async {
        tokio::time::timeout(TIMEOUT, work)
            .await
            .unwrap_or_else(|_| bail!("{what} took more than {}s", TIMEOUT.as_secs()))
    })
}
