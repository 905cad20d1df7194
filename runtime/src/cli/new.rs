//! `kubewasm new`: writes a guest crate that builds anywhere — its own workspace and release
//! profile, a native test on YAML fixtures, the WasmController and RBAC that run it, a Makefile.
//!
//! The files are templates under `new/template/`, rendered by replacing `{{name}}`,
//! `{{crate}}`, `{{namespace}}`, `{{sdk}}`, `{{version}}` and `{{kubewasm}}`; nothing else is
//! generated. The guest SDK is not on crates.io, so the crate gets a copy of it (the sources
//! this binary was built from, in `kubewasm-guest-sdk/`) and builds wherever it is moved;
//! `--sdk PATH` depends on a checkout's `guest-sdk/` instead.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// Arguments of `kubewasm new`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The controller's name: the crate, the WasmController, its ServiceAccount and the label
    /// it acts on (`NAME=yes`). A DNS-1123 label that is also a crate name, e.g. `summariser`.
    name: String,
    /// The directory to write (default: ./NAME); it must not exist or be empty.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Depend on the `guest-sdk/` directory of a kubewasm checkout by path instead of a copy
    /// of the SDK in the crate (`kubewasm-guest-sdk/`, the default).
    #[arg(long)]
    sdk: Option<PathBuf>,
    /// The namespace the manifests deploy into (default: NAME).
    #[arg(long)]
    namespace: Option<String>,
}

/// Where the crate's copy of the SDK goes, and the path its Cargo.toml depends on.
const VENDORED_SDK: &str = "kubewasm-guest-sdk";

/// The guest SDK's sources as this binary was built, by their path in `guest-sdk/`: what
/// `kubewasm new` copies into `kubewasm-guest-sdk/` (a unit test checks none is missing).
macro_rules! sdk_sources {
    ($($path:literal),* $(,)?) => {
        &[$(($path, include_str!(concat!("../../../guest-sdk/", $path)))),*]
    };
}
const SDK_SOURCES: &[(&str, &str)] = sdk_sources!(
    "src/cluster.rs",
    "src/conditions.rs",
    "src/error.rs",
    "src/guest.rs",
    "src/lib.rs",
    "src/object.rs",
    "src/query.rs",
    "src/request.rs",
    "src/response.rs",
    "src/selector/mod.rs",
    "src/selector/parse.rs",
    "src/testing.rs",
    "src/time.rs",
    "src/wire.rs",
    "wit/kubewasm.wit",
    "alloc/src/lib.rs",
    "alloc/src/tail.rs",
);

/// The copied SDK's manifests: its workspace's settings and versions written out, since the
/// copy has no kubewasm workspace around it.
const SDK_MANIFESTS: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("new/template/sdk/Cargo.toml.tmpl"),
    ),
    (
        "alloc/Cargo.toml",
        include_str!("new/template/sdk/alloc.Cargo.toml.tmpl"),
    ),
];

/// Every file of a new guest crate: its path in the crate and its template.
const TEMPLATES: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("new/template/Cargo.toml.tmpl")),
    // The toolchain kubewasm is built and tested with, and its wasm targets.
    (
        "rust-toolchain.toml",
        include_str!("../../../rust-toolchain.toml"),
    ),
    // How the module is linked without WASI: the toolchain's component linker.
    (
        ".cargo/config.toml",
        include_str!("new/template/cargo-config.toml.tmpl"),
    ),
    (".gitignore", include_str!("new/template/gitignore.tmpl")),
    ("README.md", include_str!("new/template/README.md.tmpl")),
    ("Makefile", include_str!("new/template/Makefile.tmpl")),
    ("src/lib.rs", include_str!("new/template/lib.rs.tmpl")),
    (
        "tests/reconcile.rs",
        include_str!("new/template/reconcile_test.rs.tmpl"),
    ),
    (
        "tests/fixtures/example.yaml",
        include_str!("new/template/example.yaml.tmpl"),
    ),
    (
        "tests/fixtures/empty.yaml",
        include_str!("new/template/empty.yaml.tmpl"),
    ),
    (
        "deploy/controller.yaml",
        include_str!("new/template/controller.yaml.tmpl"),
    ),
    (
        "deploy/rbac.yaml",
        include_str!("new/template/rbac.yaml.tmpl"),
    ),
];

/// Writes the crate and says what to do next.
pub fn run(args: Args) -> anyhow::Result<()> {
    check_name(&args.name)?;
    let namespace = args.namespace.as_deref().unwrap_or(&args.name);
    check_dns_label(namespace).with_context(|| format!("--namespace `{namespace}`"))?;
    let sdk = match args.sdk.as_deref() {
        Some(given) => Some(find_sdk(given)?),
        None => None,
    };
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(&args.name));
    ensure_empty(&dir)?;
    let kubewasm = std::env::current_exe().context("the path of this kubewasm binary")?;
    let values = Values {
        name: &args.name,
        crate_name: &args.name.replace('-', "_"),
        namespace,
        sdk: &sdk
            .as_ref()
            .map_or_else(|| VENDORED_SDK.to_owned(), |dir| dir.display().to_string()),
        kubewasm: &kubewasm.display().to_string(),
    };
    for (path, template) in TEMPLATES {
        write_new(&dir.join(path), &values.render(template))?;
    }
    if sdk.is_none() {
        let vendored = dir.join(VENDORED_SDK);
        for (path, template) in SDK_MANIFESTS {
            write_new(&vendored.join(path), &values.render(template))?;
        }
        for (path, source) in SDK_SOURCES {
            write_new(&vendored.join(path), source)?;
        }
    }
    let shown = dir.display();
    let sdk = sdk.map_or_else(
        || format!("a copy of kubewasm-guest-sdk {VERSION} in {VENDORED_SDK}/"),
        |dir| format!("kubewasm-guest-sdk from {}", dir.display()),
    );
    println!(
        "created {name} in {shown} ({sdk})\n\n  cd {shown}\n  make test     # native tests on tests/fixtures/\n  make build    # the wasm module, checked\n  make run      # one reconcile offline\n  make deploy   # into namespace {namespace} of $KUBECONFIG's cluster, then waits for the verdict\n  make update   # after an edit\n\nmake deploy works as a user who is only `admin` of namespace {namespace}, once a cluster admin has made it\nand let it use the kubewasm runtime:\n\n  kubectl create namespace {namespace}\n  kubectl label namespace {namespace} kubewasm.dev/tenant=enabled\n",
        name = args.name,
    );
    Ok(())
}

/// This kubewasm's version, which its SDK carries.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What the templates' placeholders become.
struct Values<'a> {
    name: &'a str,
    crate_name: &'a str,
    namespace: &'a str,
    sdk: &'a str,
    kubewasm: &'a str,
}

impl Values<'_> {
    fn render(&self, template: &str) -> String {
        template
            .replace("{{name}}", self.name)
            .replace("{{crate}}", self.crate_name)
            .replace("{{namespace}}", self.namespace)
            // Inside a TOML basic string.
            .replace(
                "{{sdk}}",
                &self.sdk.replace('\\', "\\\\").replace('"', "\\\""),
            )
            .replace("{{kubewasm}}", self.kubewasm)
            .replace("{{version}}", VERSION)
    }
}

/// Refuses a name that is not a DNS-1123 label (it names Kubernetes objects and a label key)
/// or not a crate name Cargo accepts and the guest can use.
fn check_name(name: &str) -> anyhow::Result<()> {
    check_dns_label(name).with_context(|| format!("NAME `{name}`"))?;
    let crate_name = name.replace('-', "_");
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        bail!("NAME `{name}` starts with a digit, which a crate name may not; try `c{name}`");
    }
    if RESERVED.contains(&crate_name.as_str()) {
        bail!(
            "NAME `{name}` is a Rust keyword or the name of a crate the guest uses (as `{crate_name}`); choose another name"
        );
    }
    Ok(())
}

/// Keywords (Cargo refuses them as package names), the standard crates, and the crates a
/// guest depends on (the same library name twice does not compile).
const RESERVED: &[&str] = &[
    "abstract",
    "as",
    "async",
    "await",
    "become",
    "box",
    "break",
    "const",
    "continue",
    "crate",
    "do",
    "dyn",
    "else",
    "enum",
    "extern",
    "false",
    "final",
    "fn",
    "for",
    "gen",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "macro",
    "match",
    "mod",
    "move",
    "mut",
    "override",
    "priv",
    "pub",
    "ref",
    "return",
    "self",
    "static",
    "struct",
    "super",
    "trait",
    "true",
    "try",
    "type",
    "typeof",
    "unsafe",
    "unsized",
    "use",
    "virtual",
    "where",
    "while",
    "yield",
    "alloc",
    "core",
    "proc_macro",
    "std",
    "test",
    "kubewasm_guest_sdk",
    "kubewasm_guest_alloc",
    "serde_json",
    "serde",
];

/// A DNS-1123 label: at most 63 of `a-z`, `0-9` and `-`, starting and ending alphanumeric.
fn check_dns_label(value: &str) -> anyhow::Result<()> {
    let valid = !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if !valid {
        bail!(
            "not a DNS-1123 label: at most 63 characters of a-z, 0-9 and '-', starting and ending with a letter or digit (e.g. `config-summary`)"
        );
    }
    Ok(())
}

/// The `--sdk` directory, absolute, once it is known to be the guest SDK.
fn find_sdk(dir: &Path) -> anyhow::Result<PathBuf> {
    let manifest = dir.join("Cargo.toml");
    let is_sdk = std::fs::read_to_string(&manifest)
        .is_ok_and(|text| text.contains("name = \"kubewasm-guest-sdk\""));
    if !is_sdk {
        bail!(
            "--sdk `{}` is not the kubewasm-guest-sdk crate (no Cargo.toml naming it); pass the guest-sdk/ directory of a kubewasm checkout, or leave --sdk out for a copy of the SDK in the crate",
            dir.display()
        );
    }
    dir.canonicalize()
        .with_context(|| format!("resolving `{}`", dir.display()))
}

/// Refuses a directory that holds anything (or a file in its place); creates it otherwise.
fn ensure_empty(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        if !dir.is_dir() {
            bail!("`{}` exists and is not a directory", dir.display());
        }
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("reading `{}`", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "`{}` exists and is not empty; choose another --dir, or remove it",
                dir.display()
            );
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating `{}`", dir.display()))
}

/// Writes a file that must not exist yet.
fn write_new(path: &Path, contents: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating `{}`", parent.display()))?;
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut file| file.write_all(contents.as_bytes()))
        .with_context(|| format!("writing `{}`", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Values<'static> {
        Values {
            name: "my-ctl",
            crate_name: "my_ctl",
            namespace: "team-a",
            sdk: r#"/x/"q"\guest-sdk"#,
            kubewasm: "/bin/kubewasm",
        }
    }

    #[test]
    fn every_placeholder_is_replaced() {
        for (path, template) in TEMPLATES {
            let text = values().render(template);
            assert!(!text.contains("{{"), "{path} keeps a placeholder:\n{text}");
        }
    }

    #[test]
    fn the_sdk_path_is_a_toml_string() {
        let manifest = values().render(TEMPLATES[0].1);
        assert!(
            manifest.contains(r#"path = "/x/\"q\"\\guest-sdk""#),
            "{manifest}"
        );
    }

    /// Every file under the SDK's `src/`, `wit/` and `alloc/src/`, by its path in `guest-sdk/`.
    fn sdk_files(dir: &Path, root: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sdk_files(&path, root, found);
            } else {
                let relative = path.strip_prefix(root).unwrap();
                found.push(relative.to_str().unwrap().to_owned());
            }
        }
    }

    #[test]
    fn the_copied_sdk_is_every_source_of_the_sdk() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk");
        let mut found = Vec::new();
        for dir in ["src", "wit", "alloc/src"] {
            sdk_files(&root.join(dir), &root, &mut found);
        }
        found.sort();
        let mut copied: Vec<String> = SDK_SOURCES.iter().map(|(p, _)| (*p).to_owned()).collect();
        copied.sort();
        assert_eq!(
            found, copied,
            "SDK_SOURCES in cli/new.rs lists the SDK's files"
        );
    }

    /// The copy's manifests name each dependency of the SDK's own manifests, at the version
    /// kubewasm's workspace pins for it.
    #[test]
    fn the_copied_sdk_depends_on_what_the_sdk_depends_on() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let workspace = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
        for (original, (path, template)) in ["guest-sdk/Cargo.toml", "guest-sdk/alloc/Cargo.toml"]
            .iter()
            .zip(SDK_MANIFESTS)
        {
            let manifest = std::fs::read_to_string(root.join(original)).unwrap();
            let copy = values().render(template);
            let dependencies = manifest
                .split("\n[")
                .filter(|table| table.contains("dependencies]") && !table.starts_with("dev-"))
                .flat_map(|table| table.lines().skip(1))
                .filter(|line| !line.starts_with('#') && line.contains('='));
            for line in dependencies {
                let name = line.split([' ', '.', '=']).next().unwrap();
                let pinned = match line.contains("workspace = true") {
                    true => workspace
                        .lines()
                        .find(|l| l.starts_with(&format!("{name} =")))
                        .unwrap_or_else(|| panic!("{name} in [workspace.dependencies]"))
                        .replace("guest-sdk/alloc", "alloc"),
                    false => line.to_owned(),
                };
                assert!(
                    copy.lines().any(|l| l == pinned),
                    "{path} of the copied SDK lacks `{pinned}`:\n{copy}"
                );
            }
            assert!(copy.contains(&format!("version = \"{VERSION}\"")), "{copy}");
        }
    }

    #[test]
    fn names_must_be_dns_labels_and_crate_names() {
        for good in ["a", "my-ctl", "summariser2", &"a".repeat(63)] {
            check_name(good).unwrap_or_else(|e| panic!("{good}: {e:#}"));
        }
        for bad in [
            "",
            "My",
            "my_ctl",
            "-a",
            "a-",
            "a.b",
            &"a".repeat(64),
            "9lives",
            "test",
            "self",
            "serde-json",
        ] {
            let error = check_name(bad).expect_err(bad);
            assert!(format!("{error:#}").contains("NAME"), "{bad}: {error:#}");
        }
    }
}
