//! Compiles outside the runtime: each new module is compiled by a child process of its own
//! (`kubewasm compile-module`), under limits of memory and CPU time, so that what a tenant's
//! module makes the compiler do — a crash, memory past any budget, a compile that never ends —
//! ends that child, never the runtime, and is known to be that module's doing.
//!
//! The child reads the module on stdin, compiles it with the runtime's code-generation
//! settings ([`codegen_config`]) and writes wasmtime's precompiled form to the file it is
//! given; the runtime maps that file ([`super::compiled`]) and links it as before. Limits:
//! - memory: `RLIMIT_DATA` (the private writable memory it may map: heap, thread stacks) at
//!   [`ChildCompiler::max_memory_bytes`]; past it an allocation fails and the child aborts;
//! - CPU time: `RLIMIT_CPU` at [`ChildCompiler::max_cpu`] (all its threads together); past it
//!   the kernel ends it (`SIGXCPU`), and the runtime kills it at a wall-clock deadline besides
//!   (a child that sleeps uses no CPU);
//! - it is the first process the kernel's OOM killer takes (`oom_score_adj` 1000): in the
//!   container's cgroup a compile at its limit costs the compile, not the runtime;
//! - no environment, nothing inherited but the three pipes, its stderr read to 4 KiB;
//! - it ends when the runtime does (`PR_SET_PDEATHSIG`).
//!
//! The child sets the two limits on itself first thing (safe calls; the runtime forbids
//! `unsafe`, which setting them between fork and exec would take), before it reads a byte of
//! the module, and compiles nothing when it cannot.
//!
//! How the child ended says whose doing it was ([`Ended`]): a module the compiler refuses is
//! invalid (an error, as before); a child that crashed or met a limit is the module's doing
//! ([`LoadError::CompileCrashed`], which the manager quarantines); a child that could not run
//! (no program, no disk) is the runtime's ([`LoadError::Engine`], tried again later).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use wasmtime::{Config, Engine};

use super::error::LoadError;

/// The settings that decide the compiled code (and so the compatibility of a precompiled
/// module): the runtime's engine is these plus its instance allocator, the child's these alone.
pub(super) fn codegen_config(epoch_interruption: bool) -> Config {
    let mut cfg = Config::new();
    cfg.wasm_component_model(true)
        .epoch_interruption(epoch_interruption);
    cfg
}

/// Where and within what modules are compiled out of process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildCompiler {
    /// The kubewasm binary, run as `<program> compile-module` (the runtime's own executable).
    pub program: PathBuf,
    /// Private writable memory the compile may map (`RLIMIT_DATA`).
    pub max_memory_bytes: u64,
    /// CPU time of the compile, all its threads together (`RLIMIT_CPU`).
    pub max_cpu: Duration,
}

impl ChildCompiler {
    /// Default memory of one compile: the largest guest we build (the 19 MB Python component)
    /// peaks near 440 MiB compiling.
    pub const DEFAULT_MAX_MEMORY_BYTES: u64 = 640 << 20;
    /// Default CPU time of one compile: the Python component takes about 30 s of CPU.
    pub const DEFAULT_MAX_CPU: Duration = Duration::from_secs(120);

    /// The compiler of the running executable, with the default limits.
    pub fn this_program() -> std::io::Result<ChildCompiler> {
        Ok(ChildCompiler {
            program: std::env::current_exe()?,
            max_memory_bytes: Self::DEFAULT_MAX_MEMORY_BYTES,
            max_cpu: Self::DEFAULT_MAX_CPU,
        })
    }

    /// The wall-clock time a compile may take before it is killed: its CPU time, and as much
    /// again for a machine busy with other work.
    fn deadline(&self) -> Duration {
        self.max_cpu * 2 + Duration::from_secs(10)
    }

    /// Compiles `bytes` in a child into `out` (a file the child creates). `Ok` once the file is
    /// whole.
    pub(super) fn compile(
        &self,
        bytes: &[u8],
        out: &Path,
        epoch_interruption: bool,
    ) -> Result<(), LoadError> {
        let started = Instant::now();
        let mut command = Command::new(&self.program);
        command
            .arg("compile-module")
            .arg("--out")
            .arg(out)
            .arg(format!("--epoch-interruption={epoch_interruption}"))
            .arg(format!("--max-memory-bytes={}", self.max_memory_bytes))
            .arg(format!(
                "--max-cpu-seconds={}",
                self.max_cpu.as_secs().max(1)
            ))
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().map_err(|e| {
            LoadError::Engine(wasmtime::Error::msg(format!(
                "cannot start the compiler process {}: {e}",
                self.program.display()
            )))
        })?;
        let (stdin, stderr) = (child.stdin.take(), child.stderr.take());
        let (status, said) = std::thread::scope(|scope| {
            // The module in; a child that ends early closes the pipe (its error is the child's
            // status, below).
            scope.spawn(move || {
                if let Some(mut stdin) = stdin {
                    let _ = stdin.write_all(bytes);
                }
            });
            let said = scope.spawn(move || {
                let mut said = Vec::new();
                if let Some(stderr) = stderr {
                    let _ = stderr.take(MAX_STDERR_BYTES).read_to_end(&mut said);
                }
                said
            });
            let status = wait_until(&mut child, started + self.deadline());
            (status, said.join().unwrap_or_default())
        });
        let said = String::from_utf8_lossy(&said).trim().to_owned();
        let ended = match status {
            Ok(Some(status)) => Ended::of(status, &said),
            Ok(None) => Ended::Deadline,
            Err(e) => Ended::Unknown(e.to_string()),
        };
        tracing::debug!(elapsed = ?started.elapsed(), ?ended, "compiler process ended");
        ended.into_result(self, said)
    }
}

/// The CPU time (user and system) of the compiler processes that ended so far: the runtime's
/// waited-for children (`cutime` + `cstime` of `/proc/self/stat`, what
/// `getrusage(RUSAGE_CHILDREN)` answers), which are its compilers alone. Compiles run one at
/// a time, so the difference around one is that compile's. `None` where `/proc` cannot say.
pub fn compilers_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    children_cpu_of(&stat, rustix::param::clock_ticks_per_second())
}

/// `cutime` + `cstime` (fields 16 and 17) of a `/proc/<pid>/stat` line, in seconds. The
/// fields are counted after the command name, which is in parentheses and may hold spaces.
fn children_cpu_of(stat: &str, ticks_per_second: u64) -> Option<Duration> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 3 (the state) is the first after the name: fields 16 and 17 are the 14th and 15th.
    let mut fields = after_name.split_whitespace().skip(13);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    let ticks = user.checked_add(system)?;
    Some(Duration::from_secs_f64(
        ticks as f64 / ticks_per_second.max(1) as f64,
    ))
}

/// Bytes of the child's stderr kept (the compiler's error message).
const MAX_STDERR_BYTES: u64 = 4096;

/// The child's exit code for a module the compiler refuses (its error on stderr).
const EXIT_INVALID: u8 = 3;

/// The child's exit code when it could not do its work for reasons of its own (stdin, the
/// output file): not the module's doing.
const EXIT_SETUP: u8 = 4;

/// The limits the child sets on itself before it reads the module: memory (`RLIMIT_DATA`) and
/// CPU seconds (`RLIMIT_CPU`; the soft limit sends SIGXCPU, the hard one a second later
/// SIGKILL). A child that cannot set them compiles nothing.
fn limit_self(memory: u64, cpu_seconds: u64) -> std::io::Result<()> {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let limit = |soft: u64, hard: u64| Rlimit {
        current: Some(soft),
        maximum: Some(hard),
    };
    setrlimit(Resource::Data, limit(memory, memory))?;
    setrlimit(Resource::Cpu, limit(cpu_seconds, cpu_seconds + 1))?;
    // Ended with the runtime (its thread that waits for it), instead of compiling on to its
    // CPU limit. In a container the runtime is the namespace's init, whose end ends all.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    Ok(())
}

/// Waits for the child until `deadline`; past it the child is killed and `Ok(None)`.
fn wait_until(
    child: &mut std::process::Child,
    deadline: Instant,
) -> std::io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Linux's signal numbers (the same on every architecture Kubernetes runs on).
const SIGKILL: i32 = 9;
/// The CPU limit's soft end.
const SIGXCPU: i32 = 24;
#[cfg(test)]
const SIGABRT: i32 = 6;
#[cfg(test)]
const SIGSEGV: i32 = 11;

/// How a compiler process ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// The module compiled.
    Compiled,
    /// The compiler refused the module (its message on stderr).
    Invalid,
    /// The child could not do its work (its message on stderr).
    Setup,
    /// An allocation failed: the memory limit.
    OutOfMemory,
    /// `SIGXCPU`, or `SIGKILL` at the hard limit after it: the CPU limit.
    OutOfCpu,
    /// Killed at the wall-clock deadline.
    Deadline,
    /// Any other end: a panic (exit 101), a signal.
    Crashed(String),
    /// Waiting for it failed.
    Unknown(String),
}

impl Ended {
    fn of(status: ExitStatus, said: &str) -> Ended {
        use std::os::unix::process::ExitStatusExt as _;
        match (status.code(), status.signal()) {
            (Some(0), _) => Ended::Compiled,
            (Some(c), _) if c == i32::from(EXIT_INVALID) => Ended::Invalid,
            (Some(c), _) if c == i32::from(EXIT_SETUP) => Ended::Setup,
            // Rust's allocation-failure handler says so, then aborts.
            _ if said.contains("memory allocation of") => Ended::OutOfMemory,
            (_, Some(SIGXCPU)) => Ended::OutOfCpu,
            (Some(c), _) => Ended::Crashed(format!("exited with code {c}")),
            (None, Some(SIGKILL)) => Ended::Crashed(
                "was killed (SIGKILL: the container's memory limit, or the CPU limit's hard end)"
                    .to_owned(),
            ),
            (None, Some(s)) => Ended::Crashed(format!("was ended by signal {s}")),
            (None, None) => Ended::Crashed("ended without a status".to_owned()),
        }
    }

    fn into_result(self, c: &ChildCompiler, said: String) -> Result<(), LoadError> {
        let crashed = |why: String| Err(LoadError::CompileCrashed { why });
        match self {
            Ended::Compiled => Ok(()),
            Ended::Invalid => Err(LoadError::Compile(wasmtime::Error::msg(said))),
            Ended::Setup | Ended::Unknown(_) => Err(LoadError::Engine(wasmtime::Error::msg(
                format!("the compiler process failed ({self:?}): {said}"),
            ))),
            Ended::OutOfMemory => crashed(format!(
                "needed more than the {} MiB a compile may use (`kubewasm run --compile-memory`)",
                c.max_memory_bytes >> 20
            )),
            Ended::OutOfCpu => crashed(format!(
                "used more than the {} s of CPU a compile may use (`kubewasm run --compile-cpu-seconds`)",
                c.max_cpu.as_secs()
            )),
            Ended::Deadline => crashed(format!(
                "took longer than {} s and was stopped (twice its CPU limit, `kubewasm run --compile-cpu-seconds`, and 10 s)",
                c.deadline().as_secs()
            )),
            Ended::Crashed(how) => crashed(format!(
                "crashed the compiler: it {how}{}",
                match said.is_empty() {
                    true => String::new(),
                    false => format!(": {}", last_line(&said)),
                }
            )),
        }
    }
}

/// The last line of what the child said (a panic's message is its last).
fn last_line(said: &str) -> &str {
    said.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(said)
}

/// The child: `kubewasm compile-module --out FILE`. Reads the module on stdin (the runtime
/// sends one it checked against its size bound), compiles it and writes the precompiled form
/// to `out`, a file it creates.
pub fn child_main(
    out: &Path,
    epoch_interruption: bool,
    max_memory_bytes: u64,
    max_cpu_seconds: u64,
) -> ExitCode {
    if let Err(e) = limit_self(max_memory_bytes, max_cpu_seconds) {
        eprintln!("setting the compile's limits: {e}");
        return ExitCode::from(EXIT_SETUP);
    }
    // The first process the OOM killer takes. Raising one's own score needs no privilege; a
    // failure leaves the child only as likely as the runtime to be taken.
    let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut bytes) {
        eprintln!("reading the module from stdin: {e}");
        return ExitCode::from(EXIT_SETUP);
    }
    let compiled = Engine::new(&codegen_config(epoch_interruption))
        .and_then(|engine| engine.precompile_component(&bytes));
    let compiled = match compiled {
        Ok(compiled) => compiled,
        Err(e) => {
            eprintln!("{e:#}");
            return ExitCode::from(EXIT_INVALID);
        }
    };
    drop(bytes);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .and_then(|mut f| f.write_all(&compiled).and_then(|()| f.sync_data()));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("writing {}: {e}", out.display());
            ExitCode::from(EXIT_SETUP)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    fn signalled(signal: i32) -> ExitStatus {
        ExitStatus::from_raw(signal)
    }

    fn exited(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    #[test]
    fn the_children_cpu_time_is_read_after_the_command_name() {
        // pid (comm) state ppid ... utime(14) stime(15) cutime(16) cstime(17) ...
        let stat = "42 (kube wasm) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 250 130 20 0 9 0";
        assert_eq!(
            children_cpu_of(stat, 100),
            Some(Duration::from_millis(3800))
        );
        assert_eq!(children_cpu_of("42 (x", 100), None);
        assert!(compilers_cpu().is_some(), "this process's /proc/self/stat");
    }

    #[test]
    fn how_a_child_ended_says_whose_doing_it_was() {
        assert_eq!(Ended::of(exited(0), ""), Ended::Compiled);
        assert_eq!(Ended::of(exited(3), "bad"), Ended::Invalid);
        assert_eq!(Ended::of(exited(4), "disk"), Ended::Setup);
        assert_eq!(
            Ended::of(
                signalled(SIGABRT),
                "memory allocation of 1048576 bytes failed"
            ),
            Ended::OutOfMemory
        );
        assert_eq!(Ended::of(signalled(SIGXCPU), ""), Ended::OutOfCpu);
        assert_eq!(
            Ended::of(exited(101), "thread panicked at x.rs:1:1:\nboom"),
            Ended::Crashed("exited with code 101".to_owned())
        );
        assert!(matches!(
            Ended::of(signalled(SIGSEGV), ""),
            Ended::Crashed(_)
        ));
    }

    #[test]
    fn a_crash_is_the_modules_doing_and_a_setup_failure_is_not() {
        let c = ChildCompiler {
            program: "kubewasm".into(),
            max_memory_bytes: 64 << 20,
            max_cpu: Duration::from_secs(5),
        };
        let memory = Ended::OutOfMemory.into_result(&c, String::new());
        assert!(
            matches!(&memory, Err(LoadError::CompileCrashed { why }) if why.contains("64 MiB") && why.contains("--compile-memory")),
            "{memory:?}"
        );
        let panic = Ended::Crashed("exited with code 101".into())
            .into_result(&c, "thread panicked at x.rs:1:1:\nboom\n".into());
        assert!(
            matches!(&panic, Err(LoadError::CompileCrashed { why }) if why.ends_with("code 101: boom")),
            "{panic:?}"
        );
        let setup = Ended::Setup.into_result(&c, "writing /x: read-only".into());
        assert!(matches!(setup, Err(LoadError::Engine(_))), "{setup:?}");
        let invalid = Ended::Invalid.into_result(&c, "bad section".into());
        assert!(matches!(invalid, Err(LoadError::Compile(_))), "{invalid:?}");
    }
}
