//! The CPU time the local control plane (its API server and etcd) used during one run, beside
//! the runtime's: on this 2-core machine all three share the cores, so a run whose processes
//! together kept both cores busy was bound by CPU, not by how many requests were in flight.

use std::time::Duration;

use kubewasm_test_support as support;

/// The processes measured, by their `/proc/PID/comm`.
const PROCESSES: [&str; 2] = ["kube-apiserver", "etcd"];

/// CPU time (user and system) of each of [`PROCESSES`], every process of that name summed.
#[derive(Debug, Default, Clone, Copy)]
pub struct ControlPlaneCpu([Duration; 2]);

impl ControlPlaneCpu {
    /// Now. A process that cannot be read (it ended meanwhile) counts nothing.
    pub fn read() -> ControlPlaneCpu {
        let mut used = [Duration::ZERO; 2];
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return ControlPlaneCpu(used);
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else {
                continue;
            };
            if let Some(i) = PROCESSES.iter().position(|p| *p == comm.trim()) {
                used[i] += support::runtime::cpu_time(pid).unwrap_or_default();
            }
        }
        ControlPlaneCpu(used)
    }

    /// What was used since `before`.
    pub fn since(&self, before: &ControlPlaneCpu) -> ControlPlaneCpu {
        ControlPlaneCpu([0, 1].map(|i| self.0[i].saturating_sub(before.0[i])))
    }

    /// One line: each process's CPU time, and how many cores they and the client (`who`, its
    /// `own` CPU time) kept busy on average over `wall`.
    pub fn print(&self, what: &str, (who, own): (&str, Option<Duration>), wall: Duration) {
        let total = self.0.iter().sum::<Duration>() + own.unwrap_or_default();
        eprintln!(
            "    CPU during {what}: {} {:.1} s, {} {:.1} s{}; {:.2} cores busy on average ({} available)",
            PROCESSES[0],
            self.0[0].as_secs_f64(),
            PROCESSES[1],
            self.0[1].as_secs_f64(),
            own.map(|o| format!(", {who} {:.1} s", o.as_secs_f64()))
                .unwrap_or_default(),
            total.as_secs_f64() / wall.as_secs_f64().max(1e-9),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
        );
    }
}

/// With `KUBEWASM_DENSITY_APISERVER_PROFILE=<seconds>` (and `KUBEWASM_APISERVER_PROFILING=true`,
/// read by `deploy/dev/local/cluster.sh`, so that the API server serves it): a CPU profile of the API
/// server over the first `<seconds>` of a run, written to `to` (read it with
/// `go tool pprof -top -cum <file>`). Asked now; the task ends when the profile is written.
pub fn profile_api_server(
    client: &kube::Client,
    to: std::path::PathBuf,
) -> Option<tokio::task::JoinHandle<()>> {
    let seconds: u32 = std::env::var("KUBEWASM_DENSITY_APISERVER_PROFILE")
        .ok()?
        .parse()
        .ok()?;
    let client = client.clone();
    Some(tokio::spawn(async move {
        let read = async {
            use futures::AsyncReadExt as _;
            let request = http::Request::get(format!("/debug/pprof/profile?seconds={seconds}"))
                .body(Vec::new())?;
            let mut body = Vec::new();
            client
                .request_stream(request)
                .await?
                .read_to_end(&mut body)
                .await?;
            std::fs::write(&to, body)?;
            anyhow::Ok(())
        };
        match read.await {
            Ok(()) => eprintln!("    the API server's CPU profile: {}", to.display()),
            Err(e) => eprintln!(
                "    no profile of the API server (is KUBEWASM_APISERVER_PROFILING=true?): {e}"
            ),
        }
    }))
}
