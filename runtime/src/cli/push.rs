//! `kubewasm push FILE REF`: a built component into a registry as the CNCF wasm OCI artifact
//! (config `application/vnd.wasm.config.v0+json` naming its world, one `application/wasm`
//! layer), printing `REF@sha256:…` — what `spec.module.image` can pin.
//!
//! Credentials: `--username` with `--password-stdin`, else the registry's entry in the docker
//! config (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`; `auths` entries only,
//! no credential helpers), else none.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use kubewasm::api::ImageRef;
use kubewasm::sandbox::Digest;
use kubewasm::sources::oci::{
    CONFIG_MEDIA_TYPE, ComponentInfo, LAYER_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, RegistryConfig,
    WasmConfig, docker_config_auth,
};
use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::OciImageManifest;
use oci_client::secrets::RegistryAuth;

/// How long a whole push may take.
const PUSH_TIMEOUT: Duration = Duration::from_secs(600);

/// Arguments of `kubewasm push`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The built component (`.wasm`, e.g. from `cargo build --target wasm32-wasip2`).
    file: PathBuf,
    /// Where to push it: `registry/repository:tag` (the registry named, e.g.
    /// `127.0.0.1:5000/team/hello:v1`).
    reference: String,
    /// Speak plain HTTP to the registry (a development registry on loopback); the runtime
    /// pulls from it only with `kubewasm run --insecure-registry HOST:PORT`.
    #[arg(long)]
    insecure: bool,
    /// The registry user; the password is read from stdin (`--password-stdin`). Without it,
    /// the registry's entry in the docker config is used, if there is one.
    #[arg(long, requires = "password_stdin")]
    username: Option<String>,
    /// Read the password for `--username` from stdin.
    #[arg(long, requires = "username")]
    password_stdin: bool,
}

/// Pushes the file and prints the reference with the pushed digest.
pub fn run(args: Args) -> anyhow::Result<()> {
    let image = ImageRef::parse(&args.reference)
        .map_err(|e| anyhow::anyhow!("{}", e.replacen("spec.module.image", "the reference", 1)))?;
    let reference = image.reference();
    if reference.digest().is_some() || reference.tag().is_none() {
        bail!(
            "push to a tag (`{}/{}:v1`): the registry gives the digest",
            reference.registry(),
            reference.repository()
        );
    }
    let bytes = std::fs::read(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let info =
        ComponentInfo::of(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
    if info.target.is_none() {
        eprintln!(
            "warning: {} is not a kubewasm controller (it does not import kubewasm:controller/host and export reconcile); the runtime will refuse it",
            args.file.display()
        );
    }
    let auth = credentials(&args, image.registry())?;
    let layer_digest = format!("sha256:{}", Digest::of(&bytes).hex());
    let config = WasmConfig::for_component(info, layer_digest);
    let config = Config::new(
        serde_json::to_vec(&config).context("cannot write the config")?,
        CONFIG_MEDIA_TYPE.to_owned(),
        None,
    );
    let layers = vec![ImageLayer::new(bytes, LAYER_MEDIA_TYPE.to_owned(), None)];
    let mut manifest = OciImageManifest::build(&layers, &config, None);
    manifest.media_type = Some(MANIFEST_MEDIA_TYPE.to_owned());
    let registries = RegistryConfig {
        insecure: if args.insecure {
            vec![image.registry().to_owned()]
        } else {
            Vec::new()
        },
        ..RegistryConfig::new(kubewasm::sources::DEFAULT_MAX_MODULE_BYTES)
    };
    let client = registries.client()?;
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let digest = rt.block_on(async {
        tokio::time::timeout(PUSH_TIMEOUT, async {
            client
                .push(reference, &layers, config, &auth, Some(manifest))
                .await
                .with_context(|| match args.insecure {
                    true => format!("cannot push to {}", args.reference),
                    false => format!(
                        "cannot push to {} over HTTPS (a registry that speaks plain HTTP needs --insecure)",
                        args.reference
                    ),
                })?;
            // What the registry stores, as it says it.
            client
                .fetch_manifest_digest(reference, &auth)
                .await
                .with_context(|| {
                    format!("pushed, but cannot read the digest of {}", args.reference)
                })
        })
        .await
        .unwrap_or_else(|_| {
            bail!(
                "pushing to {} took more than {}s",
                args.reference,
                PUSH_TIMEOUT.as_secs()
            )
        })
    })?;
    println!("{}@{digest}", args.reference);
    Ok(())
}

/// `--username` and the password on stdin, else the docker config's entry, else anonymous.
fn credentials(args: &Args, registry: &str) -> anyhow::Result<RegistryAuth> {
    if let Some(user) = &args.username {
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
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(RegistryAuth::Anonymous),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    Ok(docker_config_auth(&json, registry)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        .unwrap_or(RegistryAuth::Anonymous))
}
