//! `kubewasm logs`: a controller's log lines, read through the Kubernetes API with the user's
//! own kubeconfig (`GET /apis/logs.kubewasm.dev/v1alpha1/.../wasmcontrollers/NAME/log`), as
//! `kubectl logs` reads a Pod's. A follow that loses its connection (the runtime restarted,
//! the controller moved to another replica) reconnects from the time of the last line it
//! printed, skipping the lines it already printed.

use std::collections::HashSet;
use std::io::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use futures::{AsyncBufReadExt as _, TryStreamExt as _};

/// How long a follow keeps trying to reconnect before it gives up.
pub const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// Which controller a team asks the log server about (`kubewasm logs`, `kubewasm capsules`).
#[derive(Debug, clap::Args)]
pub struct Controller {
    /// The WasmController (or, with --cluster, the ClusterWasmController).
    name: String,
    /// Its namespace; default: the kubeconfig's.
    #[arg(short, long)]
    namespace: Option<String>,
    /// A ClusterWasmController.
    #[arg(long, conflicts_with = "namespace")]
    cluster: bool,
}

impl Controller {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its namespace (the kubeconfig's when not given); `None`: a ClusterWasmController.
    pub fn namespace_in(&self, client: &kube::Client) -> Option<String> {
        (!self.cluster).then(|| {
            self.namespace
                .clone()
                .unwrap_or_else(|| client.default_namespace().to_owned())
        })
    }

    /// The path of its subresource `sub` of `logs.kubewasm.dev`.
    pub fn path(&self, client: &kube::Client, sub: &str) -> String {
        match (&self.namespace, self.cluster) {
            (_, true) => format!(
                "/apis/logs.kubewasm.dev/v1alpha1/clusterwasmcontrollers/{}/{sub}",
                self.name
            ),
            (namespace, false) => format!(
                "/apis/logs.kubewasm.dev/v1alpha1/namespaces/{}/wasmcontrollers/{}/{sub}",
                namespace.as_deref().unwrap_or(client.default_namespace()),
                self.name
            ),
        }
    }
}

/// A client with the user's kubeconfig that says a refusal at once (a 429 is not retried for
/// minutes).
pub async fn user_client() -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::infer().await.context(
        "cannot find a Kubernetes configuration: set KUBECONFIG or use a default kubeconfig",
    )?;
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// Arguments of `kubewasm logs`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    controller: Controller,
    /// Keep printing new lines as they come.
    #[arg(short, long)]
    follow: bool,
    /// Only lines newer than this, e.g. 30s, 5m, 2h.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    since: Option<Duration>,
    /// Only the last N lines (then, with --follow, the new ones).
    #[arg(long, value_name = "N")]
    tail: Option<u64>,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: give a duration such as 30s, 5m or 2h"))?;
    let seconds = match unit {
        "s" | "" => number,
        "m" => number.saturating_mul(60),
        "h" => number.saturating_mul(3600),
        _ => return Err(format!("{text:?}: give a duration such as 30s, 5m or 2h")),
    };
    if seconds == 0 {
        return Err(format!("{text:?}: give a duration above 0"));
    }
    Ok(Duration::from_secs(seconds))
}

/// Where the lines were read to: the last line's time and the lines printed at that time.
#[derive(Default)]
struct Place {
    time: Option<String>,
    printed_at_time: HashSet<String>,
}

impl Place {
    /// Whether `line` is new (not printed before a reconnect); notes it.
    fn take(&mut self, line: &str) -> bool {
        let time = line.split(' ').next().unwrap_or_default();
        if self.time.as_deref() == Some(time) {
            return self.printed_at_time.insert(line.to_owned());
        }
        self.time = Some(time.to_owned());
        self.printed_at_time.clear();
        self.printed_at_time.insert(line.to_owned());
        true
    }
}

/// Runs `kubewasm logs`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    rt.block_on(async move {
        // A refusal (too many followers: 429) is said at once; a follow reconnects by itself
        // below.
        let client = user_client().await?;
        let base = args.controller.path(&client, "log");
        let mut place = Place::default();
        let mut query = Vec::new();
        if args.follow {
            query.push("follow=true".to_owned());
        }
        if let Some(since) = args.since {
            query.push(format!("sinceSeconds={}", since.as_secs()));
        }
        if let Some(tail) = args.tail {
            query.push(format!("tailLines={tail}"));
        }
        let mut lost_since: Option<std::time::Instant> = None;
        loop {
            let path = format!("{base}?{}", query.join("&"));
            match read(&client, &path, &mut place).await {
                Ok(()) if !args.follow => return Ok(()),
                Ok(()) => lost_since = None,
                Err(e) if !reconnectable(&e, args.follow) => {
                    return Err(explain(e, &args.controller, "log"));
                }
                Err(e) => {
                    let since = *lost_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() > RECONNECT_FOR {
                        return Err(explain(e, &args.controller, "log"))
                            .context(format!("gave up reconnecting after {RECONNECT_FOR:?}"));
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            // Reconnect from the last line printed (its time, lines already printed skipped).
            if let Some(time) = &place.time {
                query.retain(|q| q == "follow=true");
                query.push(format!("sinceTime={}", time.replace(':', "%3A")));
            }
        }
    })
}

async fn read(client: &kube::Client, path: &str, place: &mut Place) -> Result<(), kube::Error> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let body = client.request_stream(request).await?;
    let mut lines = body.lines();
    let mut stdout = std::io::stdout();
    while let Some(line) = lines
        .try_next()
        .await
        .map_err(|e| kube::Error::Service(e.into()))?
    {
        if place.take(&line) {
            // A closed stdout (`| head`) ends the command quietly.
            if writeln!(stdout, "{line}")
                .and_then(|()| stdout.flush())
                .is_err()
            {
                std::process::exit(0);
            }
        }
    }
    Ok(())
}

/// Whether to try again: the server was briefly away or the request reached a replica that
/// does not run the controller (503), or a follow's connection broke; not a refusal.
pub fn reconnectable(error: &kube::Error, follow: bool) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 503 || status.code == 502,
        _ => follow,
    }
}

/// What a refusal of subresource `sub` (`log`, `capsules`) means, and who acts.
pub fn explain(error: kube::Error, controller: &Controller, sub: &str) -> anyhow::Error {
    let kube::Error::Api(status) = &error else {
        return anyhow::Error::new(error).context(format!(
            "reading wasmcontrollers/{sub} through the Kubernetes API"
        ));
    };
    let namespace = controller
        .namespace
        .as_deref()
        .unwrap_or("<your namespace>");
    // Capsules hold what the controller read, Secrets included: edit and admin only.
    let (role, roles) = match sub {
        "log" => (
            "view",
            "the built-in view, edit and admin roles include wasmcontrollers/log".to_owned(),
        ),
        _ => (
            "edit",
            format!(
                "the built-in edit and admin roles include wasmcontrollers/{sub}; view does not, as it reads no Secret"
            ),
        ),
    };
    let help = match status.code {
        404 if !status.message.contains("wasmcontrollers") => {
            "this cluster does not serve logs.kubewasm.dev: a cluster admin installs the log server with `kubectl apply -k deploy/` (deploy/runtime/logs.yaml: the APIService, its Service and RBAC) and runs the runtime with --api-addr".to_owned()
        }
        503 if status.message.contains("another replica") => String::new(),
        503 => "the log server (APIService v1alpha1.logs.kubewasm.dev) is not available: `kubectl get apiservice v1alpha1.logs.kubewasm.dev` says why; a cluster admin checks that the runtime runs with --api-addr and that deploy/runtime/logs.yaml is installed".to_owned(),
        403 => format!(
            "an admin of namespace {namespace} can let you read it: `kubectl create rolebinding {sub}-reader --clusterrole={role} --user=<you> -n {namespace}` ({roles})"
        ),
        _ => String::new(),
    };
    let message = format!("{} ({})", status.message, status.code);
    if help.is_empty() {
        anyhow::anyhow!(message)
    } else {
        anyhow::anyhow!("{message}\n{help}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_read_or_refused() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("0s").unwrap_err().contains("above 0"));
        assert!(
            parse_duration("5 days")
                .unwrap_err()
                .contains("30s, 5m or 2h")
        );
    }

    #[test]
    fn a_reconnect_skips_the_lines_printed_at_the_last_time() {
        let mut place = Place::default();
        assert!(place.take("2026-11-28T03:00:00.000Z INFO a"));
        assert!(place.take("2026-11-28T03:00:01.000Z INFO b"));
        assert!(place.take("2026-11-28T03:00:01.000Z INFO c"));
        // Reconnected from 03:00:01: b and c again, then d.
        assert!(!place.take("2026-11-28T03:00:01.000Z INFO b"));
        assert!(!place.take("2026-11-28T03:00:01.000Z INFO c"));
        assert!(place.take("2026-11-28T03:00:02.000Z INFO d"));
    }
}
