//! Restarting the kube-apiserver of a control plane that `cluster.sh up` started, the way an
//! upgrade or a crash would: same command, same etcd, same port, new process.
//!
//! `cluster.sh` keeps each component's pid in `<state>/pids/<name>.pid` and its log in
//! `<state>/logs/<name>.log`; the new pid is written there too, so `cluster.sh down` and the
//! watchdog still stop it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

/// Alive and not a zombie (whoever reaps orphans here may not do so promptly).
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split(' ').next());
    state.is_some_and(|s| s != "Z")
}

/// Stops the running kube-apiserver (SIGTERM) and starts the same command again, detached.
/// Returns the new pid. The caller waits for it to be ready.
pub fn restart(state_dir: &Path) -> Result<u32> {
    let physical = state_dir.canonicalize()?;
    let pid_file = state_dir.join("pids/kube-apiserver.pid");
    let log_file = state_dir.join("logs/kube-apiserver.log");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .with_context(|| format!("reading {}", pid_file.display()))?
        .trim()
        .parse()
        .context("kube-apiserver.pid holds no pid")?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .with_context(|| format!("kube-apiserver (pid {pid}) does not run"))?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    ensure!(
        args.first().is_some_and(|a| a.ends_with("kube-apiserver"))
            && args
                .iter()
                .any(|a| a.contains(&*physical.to_string_lossy())),
        "pid {pid} is not this control plane's kube-apiserver: {args:?}"
    );

    // Like `cluster.sh down`: SIGTERM, and SIGKILL after 15 s. kube-apiserver 1.20 stops
    // listening at once but then waits for open connections (the runtime's watches) to go
    // idle, which they do not: it would take a minute to exit by itself.
    signal("TERM", pid)?;
    let deadline = Instant::now() + Duration::from_secs(15);
    while alive(pid) {
        if Instant::now() > deadline {
            signal("KILL", pid)?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while alive(pid) {
                ensure!(
                    Instant::now() < deadline,
                    "kube-apiserver (pid {pid}) survives SIGKILL"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // As cluster.sh starts it: own session, every stream redirected (appending to its log),
    // not our child (the shell that starts it exits at once).
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#"log=$1; shift; setsid "$@" >>"$log" 2>&1 </dev/null & echo $!"#)
        .arg("bash")
        .arg(&log_file)
        .args(&args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("starting kube-apiserver again")?;
    let new_pid: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("no pid from starting kube-apiserver again")?;
    std::fs::write(&pid_file, format!("{new_pid}\n"))
        .with_context(|| format!("writing {}", pid_file.display()))?;
    Ok(new_pid)
}

fn signal(name: &str, pid: u32) -> Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()?;
    ensure!(status.success(), "kill -{name} {pid} failed");
    Ok(())
}
