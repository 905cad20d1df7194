//! `kubewasm run` as a child process, the way a user runs it: one per test, hosting only the
//! test's namespace, its log in a file whose end is printed when the test fails.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::cluster::WAIT;
use crate::eventually;

/// How long `kubewasm run` may take to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// Lines of the log shown when a test fails.
const TAIL_LINES: usize = 80;

/// Names another `kubewasm` binary to run than the one cargo built with the tests (e.g. a
/// release build under a bench whose own code need not be optimised).
pub const BIN_ENV: &str = "KUBEWASM_RUN_BIN";

/// The `kubewasm` binary under test: [`BIN_ENV`] if set, else cargo's.
pub fn kubewasm_bin() -> PathBuf {
    std::env::var_os(BIN_ENV)
        .filter(|p| !p.is_empty())
        .map_or_else(|| crate::profile_dir().join("kubewasm"), PathBuf::from)
}

/// `RUST_LOG` of the runtime under test: debug lines of kubewasm, which some tests read.
pub const TEST_LOG_FILTER: &str = "info,kubewasm=debug,kubewasm_sandbox=debug";

/// A running `kubewasm run --namespace <ns>`; killed when dropped.
pub struct RuntimeProcess {
    namespace: String,
    kubeconfig: PathBuf,
    /// Holds the log; kept on disk (and named) when a test fails.
    dir: Option<tempfile::TempDir>,
    log: PathBuf,
    child: Option<Child>,
    /// More arguments of `kubewasm run`.
    args: Vec<String>,
    /// Its `RUST_LOG`.
    log_filter: String,
}

impl RuntimeProcess {
    /// Starts `kubewasm run --namespace <namespace>` with `kubeconfig`: the runtime's own
    /// identity ([`crate::ControlPlane::runtime_kubeconfig`]), never the admin's, so
    /// that a rule missing from `deploy/runtime/rbac.yaml` fails the test.
    pub fn start(kubeconfig: &Path, namespace: &str) -> RuntimeProcess {
        Self::start_with_args(kubeconfig, namespace, &[])
    }

    /// Starts `kubewasm run [--namespace <namespace>] <args>` (`""`: every namespace).
    pub fn start_with_args(kubeconfig: &Path, namespace: &str, args: &[&str]) -> RuntimeProcess {
        Self::start_with_log_filter(kubeconfig, namespace, args, TEST_LOG_FILTER)
    }

    /// Like [`Self::start_with_args`], with `RUST_LOG=<log_filter>` (a benchmark runs it at
    /// `info`, as deployed, instead of [`TEST_LOG_FILTER`]).
    pub fn start_with_log_filter(
        kubeconfig: &Path,
        namespace: &str,
        args: &[&str],
        log_filter: &str,
    ) -> RuntimeProcess {
        let root = crate::target_tmp().join("live-runtime-logs");
        std::fs::create_dir_all(&root).expect("creating the directory for runtime logs");
        let dir = tempfile::Builder::new()
            .prefix(&format!(
                "{}-",
                if namespace.is_empty() {
                    "cluster"
                } else {
                    namespace
                }
            ))
            .tempdir_in(&root)
            .expect("creating a temporary directory for the runtime log");
        let log = dir.path().join("kubewasm-run.log");
        let mut runtime = RuntimeProcess {
            namespace: namespace.to_owned(),
            kubeconfig: kubeconfig.to_owned(),
            dir: Some(dir),
            log,
            child: None,
            args: args.iter().map(|a| a.to_string()).collect(),
            log_filter: log_filter.to_owned(),
        };
        runtime.start_again();
        runtime
    }

    /// Starts the process again after [`Self::stop`]; its output is appended to the same log.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "kubewasm run is already running");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("opening the runtime log");
        let err = log.try_clone().expect("cloning the log file handle");
        let child = Command::new(kubewasm_bin())
            .arg("run")
            .args(match self.namespace.as_str() {
                "" => vec![],
                ns => vec!["--namespace", ns],
            })
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", &self.log_filter)
            .env("NO_COLOR", "1")
            .env_remove("KUBEWASM_LOG_FORMAT")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("starting `kubewasm run`");
        self.note(&format!(
            "=== test: started kubewasm run (pid {})",
            child.id()
        ));
        self.child = Some(child);
    }

    /// Stops the process as Kubernetes would (SIGTERM) and waits until it has exited.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            bail!("kubewasm run is not running");
        };
        let pid = child.id();
        let sent = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        if !sent.success() {
            let _ = child.kill();
        }
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                self.note(&format!(
                    "=== test: kubewasm run (pid {pid}) exited: {status}"
                ));
                return Ok(());
            }
            if started.elapsed() > STOP_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                bail!("kubewasm run (pid {pid}) did not exit within {STOP_TIMEOUT:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the process with SIGKILL (no chance to finish anything) and waits for it.
    pub fn kill(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            bail!("kubewasm run is not running");
        };
        let pid = child.id();
        child.kill()?;
        let status = child.wait()?;
        self.note(&format!(
            "=== test: kubewasm run (pid {pid}) killed with SIGKILL: {status}"
        ));
        Ok(())
    }

    /// The pid of the running process.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .expect("kubewasm run is not running")
            .id()
    }

    /// Waits until the process exits by itself and returns how it ended.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let started = Instant::now();
        let child = self.child.as_mut().expect("kubewasm run was stopped");
        let pid = child.id();
        loop {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                self.note(&format!(
                    "=== test: kubewasm run (pid {pid}) exited: {status}"
                ));
                return Ok(status);
            }
            if started.elapsed() > timeout {
                bail!("kubewasm run (pid {pid}) did not exit within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Fails when the process has exited (it must run until the test stops it).
    pub fn ensure_running(&mut self) -> Result<()> {
        let child = self.child.as_mut().expect("kubewasm run was stopped");
        if let Some(status) = child.try_wait()? {
            bail!("kubewasm run exited by itself: {status}");
        }
        Ok(())
    }

    /// The log so far.
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// Size of the log now: lines after this offset were written later.
    pub fn log_len(&self) -> usize {
        std::fs::metadata(&self.log).map_or(0, |m| m.len() as usize)
    }

    /// The lines written after `offset` (from [`Self::log_len`]).
    pub fn log_since(&self, offset: usize) -> String {
        let log = std::fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(log.get(offset..).unwrap_or_default()).into_owned()
    }

    /// Waits until the log shows, after `offset` (from [`Self::log_len`]), a finished
    /// reconcile of `object` (`namespace/name`) whose line contains `expect` (e.g.
    /// `actions=0`: the guest asked for nothing).
    pub async fn wait_reconciled(
        &self,
        offset: usize,
        object: &str,
        expect: &str,
    ) -> Result<String> {
        let span = format!("object={object}}}");
        eventually(
            &format!("the runtime logs a reconcile of {object} with {expect}"),
            WAIT,
            || async {
                let log = self.log_since(offset);
                let line = log.lines().find(|l| {
                    l.contains(&span) && l.contains(" reconciled ") && l.contains(expect)
                });
                Ok(line.map(str::to_owned))
            },
        )
        .await
    }

    /// `GET path` on the runtime's metrics/health server (its address is in the log):
    /// the status code and the body.
    pub async fn http_get(&self, path: &str) -> Result<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        const MARK: &str = "serving /metrics, /healthz and /readyz on http://";
        let log = self.log();
        let Some(line) = log.lines().rev().find(|l| l.contains(MARK)) else {
            bail!("the runtime log does not say where it serves metrics");
        };
        let addr = line[line.find(MARK).unwrap_or(0) + MARK.len()..]
            .trim()
            .to_owned();
        let mut stream = tokio::net::TcpStream::connect(&addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        let status = response.split_whitespace().nth(1).unwrap_or("0").parse()?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        Ok((status, body))
    }

    /// Keeps the log file on disk after the process is gone; returns its path.
    pub fn keep_log(&mut self) -> PathBuf {
        if let Some(dir) = self.dir.take() {
            let kept = dir.keep();
            self.log = kept.join("kubewasm-run.log");
        }
        self.log.clone()
    }

    /// Prints the end of the log and keeps the log file on disk.
    pub fn report_failure(&mut self) {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
        self.keep_log();
        eprintln!(
            "---- last {TAIL_LINES} lines of `kubewasm run --namespace {}` (full log: {}) ----\n{tail}\n---- end of runtime log ----",
            self.namespace,
            self.log.display()
        );
    }

    fn note(&self, line: &str) {
        if let Ok(mut file) = OpenOptions::new().append(true).open(&self.log) {
            let _ = writeln!(file, "{line}");
        }
    }
}

impl Drop for RuntimeProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() && self.dir.is_some() {
            self.report_failure();
        }
    }
}

/// Ends a test: on error, prints the end of every runtime's log and fails with the error.
#[track_caller]
pub fn finish(result: Result<()>, runtimes: &mut [&mut RuntimeProcess]) {
    if let Err(error) = result {
        for runtime in runtimes.iter_mut() {
            runtime.report_failure();
        }
        panic!("{error:#}");
    }
}

/// VmRSS and VmHWM of a process, in KiB.
pub fn memory_kib(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// The CPU time (user and system) process `pid` has used so far, from `/proc/PID/stat` (in
/// clock ticks of 10 ms, as Linux counts them for every architecture it runs these tests on).
pub fn cpu_time(pid: u32) -> Result<std::time::Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces: fields are counted after its `)`.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .with_context(|| format!("/proc/{pid}/stat has no command name"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15: the 12th and 13th after the command name.
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no field {} in /proc/{pid}/stat", i + 3))
    };
    Ok(std::time::Duration::from_millis(
        (ticks(11)? + ticks(12)?) * 10,
    ))
}
