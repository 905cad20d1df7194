//! The density bench's modules from a registry (`KUBEWASM_DENSITY_IMAGE=1`, implied by
//! `KUBEWASM_DENSITY_EXAMPLE=python-hello-world`): a `docker-registry` on loopback, the
//! example's module pushed once with `kubewasm push`, and every WasmController naming it by
//! digest (`spec.module.image: REGISTRY/density/module@sha256:…`) instead of a module
//! ConfigMap of its own. A Python component (18.6 MB) cannot be in a ConfigMap (1 MiB at most),
//! and 10,000 ConfigMaps of a 240 KB Rust module are more than etcd's default quota.
//!
//! The runtime runs as the Deployment does, with `--module-cache-dir` and
//! `--compiled-cache-dir` (directories that live as long as the bench): the first start of
//! the first N pulls and compiles, every later start finds both in its caches — as a replica
//! restarted on its `emptyDir` does.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use kubewasm_test_support::registry::Registry;

/// Where the example's module comes from.
pub enum Modules {
    /// A ConfigMap in every namespace, as the tutorial makes it (the default).
    ConfigMap,
    /// One image, pushed once, named by digest by every WasmController.
    Image(Pushed),
}

/// The registry, the image pushed to it, and the runtime's cache directories.
pub struct Pushed {
    registry: Registry,
    /// `REGISTRY/density/module@sha256:…`, as `kubewasm push` printed it.
    pub image: String,
    caches: tempfile::TempDir,
}

impl Modules {
    /// Starts a registry and pushes `wasm` with `kubewasm` (`binary push … --insecure`).
    pub fn push(binary: &Path, wasm: &[u8]) -> Result<Modules> {
        let registry = Registry::start()?;
        let caches = tempfile::tempdir()?;
        let file = caches.path().join("module.wasm");
        std::fs::write(&file, wasm)?;
        let reference = format!("{}/density/module:v1", registry.addr());
        let out = Command::new(binary)
            .arg("push")
            .arg(&file)
            .arg(&reference)
            .arg("--insecure")
            .env("DOCKER_CONFIG", "/nonexistent")
            .output()
            .with_context(|| format!("running {} push", binary.display()))?;
        ensure!(
            out.status.success(),
            "kubewasm push failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let image = String::from_utf8(out.stdout)?
            .lines()
            .last()
            .context("kubewasm push printed nothing")?
            .trim()
            .to_owned();
        ensure!(
            image.contains("@sha256:"),
            "kubewasm push printed {image:?}, not a reference with a digest"
        );
        std::fs::remove_file(&file)?;
        Ok(Modules::Image(Pushed {
            registry,
            image,
            caches,
        }))
    }

    /// The image WasmControllers name, if modules come from the registry.
    pub fn image(&self) -> Option<&str> {
        match self {
            Modules::ConfigMap => None,
            Modules::Image(pushed) => Some(&pushed.image),
        }
    }

    /// What `kubewasm run` is given besides `run`.
    pub fn runtime_args(&self) -> Vec<String> {
        let Modules::Image(pushed) = self else {
            return Vec::new();
        };
        let dir = |name: &str| pushed.caches.path().join(name).display().to_string();
        vec![
            "--insecure-registry".into(),
            pushed.registry.addr().to_owned(),
            "--module-cache-dir".into(),
            dir("pulled"),
            "--compiled-cache-dir".into(),
            dir("compiled"),
        ]
    }
}
