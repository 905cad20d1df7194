//! Compiles in a child process (`kubewasm compile-module`), as the runtime compiles every new
//! module: the module runs as one compiled in process would, is kept in the compiled cache
//! for the next start (which needs no child), and what a module makes the compiler do past its
//! limits ends the child with a typed error naming the limit, while this process goes on.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kubewasm::sandbox::{
    ChildCompiler, CompiledCache, Limits, LoadError, NoReads, Request, Sandbox, SandboxConfig,
};
use serde_json::json;

use super::common;

fn compiler(memory: u64, cpu_seconds: u64) -> ChildCompiler {
    ChildCompiler {
        program: env!("CARGO_BIN_EXE_kubewasm").into(),
        max_memory_bytes: memory,
        max_cpu: Duration::from_secs(cpu_seconds),
    }
}

fn sandbox(compiler: ChildCompiler, cache: Option<&Path>) -> Sandbox {
    Sandbox::new(SandboxConfig {
        compiler: Some(compiler),
        compiled_cache: cache.map(|dir| CompiledCache {
            dir: dir.to_owned(),
            max_bytes: 256 << 20,
        }),
        max_instances: 2,
        ..SandboxConfig::default()
    })
    .expect("the sandbox starts")
}

fn hello(sandbox: &Sandbox) -> Result<Arc<kubewasm::sandbox::GuestPre>, LoadError> {
    sandbox.load(&std::fs::read(common::guest("hello_world")).expect("reading the guest"))
}

/// The files of the compiled cache, at any depth.
fn files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("listing").flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files(&path));
        } else {
            found.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    found
}

#[test]
fn a_module_compiled_in_a_child_runs_and_is_kept_for_the_next_start() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let first = sandbox(compiler(640 << 20, 60), Some(dir.path()));
    let guest = hello(&first).expect("hello_world compiles in a child");
    assert_eq!(first.compilations().compiled(), 1);
    let outcome = guest
        .call(
            Request::for_object(json!({"apiVersion": "example.com/v1", "kind": "HelloWorld",
                "metadata": {"name": "child", "namespace": "ns"}, "spec": {"who": "Child"}}))
            .expect("a request"),
            Arc::new(NoReads),
            &Limits::default(),
        )
        .expect("the module compiled by the child runs");
    let actions = serde_json::to_string(&outcome.response.actions).unwrap_or_default();
    assert!(actions.contains("Hello, Child!"), "{actions}");
    let kept = files(dir.path());
    assert_eq!(kept.len(), 1, "one entry, no temporary file left: {kept:?}");
    assert!(kept[0].ends_with(".cwasm"), "{kept:?}");

    // The next start maps the entry: no compile, so no child (this one cannot start).
    let mut absent = compiler(640 << 20, 60);
    absent.program = dir.path().join("no-such-program");
    let restarted = sandbox(absent.clone(), Some(dir.path()));
    hello(&restarted).expect("hello_world from the compiled cache");
    assert_eq!(
        (
            restarted.compilations().compiled(),
            restarted.compilations().cached()
        ),
        (0, 1)
    );
    // Without the entry it must compile, and says why it could not.
    let empty = tempfile::tempdir().expect("a temp dir");
    let err = hello(&sandbox(absent, Some(empty.path()))).expect_err("no compiler");
    assert!(
        matches!(&err, LoadError::Engine(_)) && err.to_string().contains("no-such-program"),
        "{err}"
    );
}

/// The Python guest's compile needs about 380 MiB; at 64 MiB an allocation fails in the
/// child, which ends; the runtime's process (this test's) goes on and compiles the next
/// module.
#[test]
fn a_compile_past_its_memory_limit_ends_the_child_and_names_the_limit() {
    let wasm = std::fs::read(common::guest("python_hello_world")).expect("the Python guest");
    let before = rss_kib();
    let small = sandbox(compiler(64 << 20, 120), None);
    let err = small.load(&wasm).expect_err("past the memory limit");
    let grew = rss_kib().saturating_sub(before);
    println!("compile at a 64 MiB limit: {err}; this process grew {grew} KiB");
    assert!(
        matches!(&err, LoadError::CompileCrashed { why } if why.contains("64 MiB") && why.contains("--compile-memory")),
        "{err}"
    );
    hello(&small).expect("the next module compiles");
}

#[test]
fn a_compile_past_its_cpu_limit_ends_the_child_and_names_the_limit() {
    let wasm = std::fs::read(common::guest("python_hello_world")).expect("the Python guest");
    let err = sandbox(compiler(1 << 30, 1), None)
        .load(&wasm)
        .expect_err("past the CPU limit");
    println!("compile at a 1 s CPU limit: {err}");
    assert!(
        matches!(&err, LoadError::CompileCrashed { why } if why.contains("1 s of CPU") && why.contains("--compile-cpu-seconds")),
        "{err}"
    );
}

/// A component the compiler refuses is invalid, as in process (the compiler's words), not a
/// crash: it is not quarantined.
#[test]
fn a_module_the_compiler_refuses_is_invalid_not_a_crash() {
    // A component header and then a section that does not parse.
    let bytes = [0, b'a', b's', b'm', 0x0d, 0, 1, 0, 0xff, 0x05, 1, 2, 3];
    let err = sandbox(compiler(640 << 20, 60), None)
        .load(&bytes)
        .expect_err("not a valid component");
    assert!(matches!(&err, LoadError::Compile(_)), "{err:?}");
    assert!(!err.to_string().is_empty());
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// A compiler process ends with what started it: the thread that spawned it ends while the
/// child still waits for its module (stdin kept open), and the kernel kills the child
/// (`PR_SET_PDEATHSIG`) instead of leaving it to compile on.
#[test]
fn a_compiler_process_ends_with_the_thread_that_started_it() {
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::{Command, Stdio};
    let out = tempfile::tempdir().expect("a temp dir");
    let path = out.path().join("never.cwasm");
    let (mut child, stdin) = std::thread::spawn(move || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kubewasm"))
            .args(["compile-module", "--out"])
            .arg(&path)
            .args(["--max-memory-bytes=268435456", "--max-cpu-seconds=60"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the compiler");
        let stdin = child.stdin.take();
        // Time for the child to set its death signal before this thread ends.
        std::thread::sleep(Duration::from_millis(500));
        (child, stdin)
    })
    .join()
    .expect("the spawning thread");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the compiler outlived the thread that started it");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    assert_eq!(status.signal(), Some(9), "{status:?}");
}
