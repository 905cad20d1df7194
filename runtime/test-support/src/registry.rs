//! A real OCI registry for tests: Debian's `docker-registry serve` (distribution 2.8) on a free
//! loopback port with its storage in a temporary directory, optionally behind htpasswd basic
//! auth; stopped when dropped. `make k8s-binaries` (`cluster.sh install`) installs it.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The binary of Debian's `docker-registry` package.
pub const REGISTRY_BINARY: &str = "docker-registry";

/// A registry serving plain HTTP on `127.0.0.1:<port>`.
pub struct Registry {
    child: Child,
    addr: String,
    dir: tempfile::TempDir,
}

impl Registry {
    /// A registry anyone may push to and pull from.
    pub fn start() -> Result<Registry> {
        Self::start_with(None)
    }

    /// A registry that asks for `user` and `password` (HTTP basic auth, bcrypt htpasswd).
    pub fn with_basic_auth(user: &str, password: &str) -> Result<Registry> {
        Self::start_with(Some((user, password)))
    }

    fn start_with(auth: Option<(&str, &str)>) -> Result<Registry> {
        let dir = tempfile::tempdir().context("cannot make the registry's directory")?;
        let storage = dir.path().join("storage");
        std::fs::create_dir(&storage)?;
        // A free port: bound, read and released (the registry binds it a moment later).
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = format!("127.0.0.1:{port}");
        let auth_section = match auth {
            None => String::new(),
            Some((user, password)) => {
                let hash = bcrypt::hash(password, 4).context("cannot hash the password")?;
                let htpasswd = dir.path().join("htpasswd");
                std::fs::write(&htpasswd, format!("{user}:{hash}\n"))?;
                format!(
                    "auth:\n  htpasswd:\n    realm: kubewasm-test\n    path: {}\n",
                    htpasswd.display()
                )
            }
        };
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n{auth_section}",
                storage.display()
            ),
        )?;
        let log = std::fs::File::create(dir.path().join("registry.log"))?;
        let child = Command::new(REGISTRY_BINARY)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| {
                format!("cannot start `{REGISTRY_BINARY}`: install it with `make k8s-binaries` (cluster.sh install installs Debian's docker-registry)")
            })?;
        let mut registry = Registry { child, addr, dir };
        registry.wait_until_listening()?;
        Ok(registry)
    }

    fn wait_until_listening(&mut self) -> Result<()> {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{REGISTRY_BINARY} exited ({status}): {}",
                    std::fs::read_to_string(self.log()).unwrap_or_default()
                );
            }
            if TcpStream::connect(&self.addr).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "{REGISTRY_BINARY} did not listen on {} within 20 s",
            self.addr
        )
    }

    /// `127.0.0.1:<port>`: the registry part of an image reference, and what
    /// `--insecure-registry` names.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Where the registry keeps blobs and manifests (to corrupt a blob on purpose).
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// The file a blob of `digest` (`sha256:<hex>`) is stored in.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The registry's log.
    pub fn log(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    /// The directory the registry's files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
