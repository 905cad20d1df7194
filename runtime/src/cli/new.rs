//! `kubewasm new`: writes a guest crate that builds anywhere — its own workspace and release
//! profile, a native test on YAML fixtures, the WasmController and RBAC that run it, a Makefile.
//!
//! The files are templates under `new/template/`, rendered by replacing `{{name}}`,
//! `{{crate}}`, `{{namespace}}`, `{{sdk}}` and `{{kubewasm}}`; nothing else is generated.

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
    /// The `guest-sdk/` directory of a kubewasm checkout to depend on (default: the one this
    /// kubewasm was built from).
    #[arg(long)]
    sdk: Option<PathBuf>,
    /// The namespace the manifests deploy into (default: NAME).
    #[arg(long)]
    namespace: Option<String>,
}

/// The guest SDK this binary was built with, if its source is still there.
const BUILT_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk");

/// Every file of a new guest crate: its path in the crate and its template.
const TEMPLATES: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("new/template/Cargo.toml.tmpl")),
    // The toolchain kubewasm is built and tested with, and the wasm32-wasip2 target.
    (
        "rust-toolchain.toml",
        include_str!("../../../rust-toolchain.toml"),
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
    let sdk = find_sdk(args.sdk.as_deref())?;
    let dir = args.dir.unwrap_or_else(|| PathBuf::from(&args.name));
    ensure_empty(&dir)?;
    let kubewasm = std::env::current_exe().context("the path of this kubewasm binary")?;
    let values = Values {
        name: &args.name,
        crate_name: &args.name.replace('-', "_"),
        namespace,
        sdk: &sdk.display().to_string(),
        kubewasm: &kubewasm.display().to_string(),
    };
    for (path, template) in TEMPLATES {
        write_new(&dir.join(path), &values.render(template))?;
    }
    let shown = dir.display();
    println!(
        "created {name} in {shown} (kubewasm-guest-sdk from {sdk})\n\n  cd {shown}\n  make test     # native tests on tests/fixtures/\n  make build    # the wasm module, checked\n  make run      # one reconcile offline\n  make deploy   # into namespace {namespace} of $KUBECONFIG's cluster, then waits for the verdict\n  make update   # after an edit\n\nmake deploy works as a user who is only `admin` of namespace {namespace}, once a cluster admin has made it\nand let it use the kubewasm runtime:\n\n  kubectl create namespace {namespace}\n  kubectl label namespace {namespace} kubewasm.dev/tenant=enabled\n",
        name = args.name,
        sdk = sdk.display(),
    );
    Ok(())
}

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

/// The guest SDK directory, absolute: `--sdk`, else the one this binary was built from.
fn find_sdk(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let (dir, hint) = match given {
        Some(dir) => (dir.to_path_buf(), "--sdk"),
        None if Path::new(BUILT_SDK).is_dir() => (PathBuf::from(BUILT_SDK), "the built-in path"),
        None => bail!(
            "the kubewasm-guest-sdk this kubewasm was built from ({BUILT_SDK}) is not there; pass --sdk PATH, the guest-sdk/ directory of a kubewasm checkout"
        ),
    };
    let manifest = dir.join("Cargo.toml");
    let is_sdk = std::fs::read_to_string(&manifest)
        .is_ok_and(|text| text.contains("name = \"kubewasm-guest-sdk\""));
    if !is_sdk {
        bail!(
            "{hint} `{}` is not the kubewasm-guest-sdk crate (no Cargo.toml naming it); pass --sdk PATH, the guest-sdk/ directory of a kubewasm checkout",
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
