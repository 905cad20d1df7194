//! A tutorial's controller in either language, as `deploy/examples/` ships it: the Rust guest
//! with its module in a ConfigMap of the controller's namespace, or the Python guest
//! (`deploy/examples/python-<tutorial>/`) with its module pushed to a registry — a Python
//! component is ~19 MB, past what a ConfigMap holds. The tutorials' live tests run each step
//! for both, so the two guests are held to the same behaviour.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kube::Client;
use kubewasm_test_support::registry::Registry;
use serde_json::{Value, json};

use crate::cluster::{apply, condition, controller_status, example, module_config_map};
use crate::oci::push;
use crate::runtime::RuntimeProcess;
use crate::support::{ControlPlane, eventually, guests};

/// The registry every example image names (the node's, `deploy/dev/local`); a test's own
/// registry listens elsewhere, so the test puts its address there instead.
const EXAMPLE_REGISTRY: &str = "127.0.0.1:5000/";

/// How long a module may take to become ready the first time: a Python component is compiled
/// by the debug runtime in 13–24 s alone, longer while the other tests share the two cores.
const COMPILE_WAIT: Duration = Duration::from_secs(300);

/// Which guest runs a tutorial's controller.
#[derive(Clone, Copy)]
pub enum Flavour<'a> {
    /// `guests/<tutorial>`, its module in a ConfigMap.
    Rust,
    /// `guests/python-<tutorial>`, its module pushed to this registry.
    Python(&'a Registry),
}

/// A runtime for a flavour's controllers, with what it needs kept alive beside it.
pub struct FlavouredRuntime {
    /// `kubewasm run --namespace <ns>` (with `--insecure-registry` and the caches of the
    /// deployment for Python).
    pub process: RuntimeProcess,
    /// The compiled and pulled module caches (Python): a restart loads the compiled module
    /// instead of compiling it again, as the deployment's `emptyDir` does.
    _caches: Option<tempfile::TempDir>,
}

impl Flavour<'_> {
    /// The directory of `deploy/examples/` holding `tutorial` (e.g. `hello-world`).
    pub fn example_dir(self, tutorial: &str) -> String {
        match self {
            Flavour::Rust => tutorial.to_owned(),
            Flavour::Python(_) => format!("python-{tutorial}"),
        }
    }

    /// The example manifest `file` of `tutorial` moved into `ns` (as [`example`]).
    pub fn example(self, tutorial: &str, file: &str, ns: &str) -> Result<Vec<Value>> {
        example(&format!("{}/{file}", self.example_dir(tutorial)), ns)
    }

    /// The built guest of `tutorial` (`make guests`).
    pub fn guest_file(self, tutorial: &str) -> PathBuf {
        let name = tutorial.replace('-', "_");
        match self {
            Flavour::Rust => guests::guest(&name),
            Flavour::Python(_) => guests::guest(&format!("python_{name}")),
        }
    }

    /// Starts `kubewasm run --namespace <ns>` for this flavour's controllers.
    pub fn start_runtime(self, control_plane: &ControlPlane, ns: &str) -> FlavouredRuntime {
        let kubeconfig = control_plane.runtime_kubeconfig();
        match self {
            Flavour::Rust => FlavouredRuntime {
                process: RuntimeProcess::start(&kubeconfig, ns),
                _caches: None,
            },
            Flavour::Python(registry) => {
                let caches = tempfile::tempdir().expect("a directory for the module caches");
                let compiled = caches.path().join("compiled").display().to_string();
                let pulled = caches.path().join("pulled").display().to_string();
                let process = RuntimeProcess::start_with_args(
                    &kubeconfig,
                    ns,
                    &[
                        "--insecure-registry",
                        registry.addr(),
                        "--compiled-cache-dir",
                        &compiled,
                        "--module-cache-dir",
                        &pulled,
                    ],
                );
                FlavouredRuntime {
                    process,
                    _caches: Some(caches),
                }
            }
        }
    }

    /// Puts the module of `tutorial` where its example controller reads it — ConfigMap
    /// `config_map` holding `<guest>.wasm` (Rust), or the example's image reference, pushed
    /// with `kubewasm push` (Python) — then applies the example's `controller.yaml` and waits
    /// until WasmController `name` says its module is ready. Returns the module's bytes.
    pub async fn install_controller(
        self,
        client: &Client,
        ns: &str,
        tutorial: &str,
        config_map: &str,
        name: &str,
    ) -> Result<Vec<u8>> {
        let file = self.guest_file(tutorial);
        let wasm = std::fs::read(&file).with_context(|| format!("{}", file.display()))?;
        let mut controllers = self.example(tutorial, "controller.yaml", ns)?;
        match self {
            Flavour::Rust => {
                let key = file.file_name().context("a guest file name")?;
                apply(
                    client,
                    &module_config_map(ns, config_map, &key.to_string_lossy(), &wasm),
                )
                .await?;
            }
            Flavour::Python(registry) => {
                for controller in &mut controllers {
                    let image = controller["spec"]["module"]["image"]
                        .as_str()
                        .context("the Python example's controller names an image")?;
                    let path = image.strip_prefix(EXAMPLE_REGISTRY).with_context(|| {
                        format!("the example's image {image} is not in {EXAMPLE_REGISTRY}")
                    })?;
                    let image = format!("{}/{path}", registry.addr());
                    push(&file, &image, None)?;
                    controller["spec"]["module"]["image"] = json!(image);
                }
            }
        }
        for controller in &controllers {
            apply(client, controller).await?;
        }
        eventually(
            &format!("WasmController {name} reports its module ready"),
            COMPILE_WAIT,
            || async {
                let status = controller_status(client, ns, name).await?;
                let ready = condition(&status, "ModuleReady")?;
                ensure!(
                    ready.status == "True",
                    "ModuleReady {} {}: {}",
                    ready.status,
                    ready.reason,
                    ready.message
                );
                Ok(Some(()))
            },
        )
        .await?;
        Ok(wasm)
    }
}
