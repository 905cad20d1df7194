//! A team reads its controllers' log lines, and nothing more (issue 39, "Logs by RBAC"), live:
//! the runtime serves `logs.kubewasm.dev` on this machine's address, registered with the
//! control plane's aggregation layer (a control plane of this test's own: the APIService is
//! cluster-wide). As alice, who is only `admin` of team-x, `kubewasm logs` prints the panics
//! of team-x's controller, and `-f` its new lines as they come; the same user is refused
//! team-y's controller (and a controller that does not exist, in the same words), a user
//! without the grant is refused, and a request straight to the runtime's port without the
//! front proxy's client certificate is refused whatever headers it sends. Then as a hostile
//! tenant, for a minute: a controller logging 1 MiB lines at its full rate keeps its ring at its
//! cap and leaves its namespace's other ring alone; of 100 followers at once those past the caps
//! are refused; a reader that never reads is cut off; capsules stay within the namespace's cap;
//! team-y's controller is served throughout and the runtime's memory stays bounded.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kube::Client;
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

use crate::StopOnDrop;
use crate::cluster::{apply, apply_all, guest, module_config_map, prepare};
use crate::isolation::{controller, install_probe_crd, install_tenant, probe};
use crate::runtime::{RuntimeProcess, finish, kubewasm_bin};
use crate::support::{ControlPlane, TeamUser, eventually, free_port, host_address};

/// The runtime's caps in this test.
const RING: usize = 256 << 10;
const PER_NAMESPACE: usize = 384 << 10;
const CAPSULES_PER_NAMESPACE: usize = 512 << 10;

/// How long the hostile tenant floods its log.
const FLOOD_FOR: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_team_reads_its_controllers_logs_and_nothing_more() {
    let control_plane = StopOnDrop::start("live-logs");
    let cp = &control_plane.0;
    let (client, team_x) = prepare(cp, "team-x").await;
    let team_y = cp.namespace("team-y").await.expect("team-y");
    let team_z = cp.namespace("team-z").await.expect("team-z");
    let ip = host_address().expect("this machine's address");
    let port = free_port().expect("a free port");
    let addr = format!("{ip}:{port}");
    let mut runtime = RuntimeProcess::start_with_args(
        &cp.runtime_kubeconfig(),
        "",
        &[
            "--api-addr",
            &addr,
            "--log-ring-bytes",
            "256Ki",
            "--log-ring-bytes-per-namespace",
            "384Ki",
            "--log-max-followers",
            "4",
            "--log-max-followers-per-controller",
            "2",
            "--log-follow-stall-seconds",
            "3",
            "--max-capsule-bytes-per-namespace",
            "512Ki",
            "--max-log-lines-per-second",
            "5000",
            "--log-line-burst",
            "5000",
        ],
    );
    let result = async {
        let teams = Teams::install(cp, &client, &team_x, &team_y, &team_z).await?;
        cp.expose_log_server(ip, port).await?;
        teams.read_own_and_refused(cp, &addr).await?;
        teams.capsules_replayed(cp).await?;
        teams.diffs_by_rbac(cp, &client).await?;
        crate::offline_live::same_request(cp, &client, &teams.x, &teams.alice).await?;
        teams.follow(&client).await?;
        teams.followers_capped().await?;
        teams.hostile_minute(cp, &client, &addr, &runtime).await
    }
    .await;
    finish(result, &mut [&mut runtime]);
}

struct Teams {
    x: String,
    y: String,
    alice: TeamUser,
    mallory: TeamUser,
}

/// The hostile guest's controller over the Probes labelled `role=<name>`.
fn hostile(ns: &str, name: &str) -> serde_json::Value {
    controller(
        ns,
        name,
        json!({"module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
            "parent": {"apiVersion": "isolation.kubewasm.dev/v1", "kind": "Probe",
                "labelSelector": format!("role={name}")}}),
    )
}

/// `kubewasm logs ARGS` as `user`: exit success, stdout, stderr.
async fn logs(user: &TeamUser, args: &[&str]) -> Result<(bool, String, String)> {
    kubewasm_as(user, &[&["logs"], args].concat()).await
}

/// `kubewasm ARGS` as `user`: exit success, stdout, stderr.
pub(crate) async fn kubewasm_as(user: &TeamUser, args: &[&str]) -> Result<(bool, String, String)> {
    let out = Command::new(kubewasm_bin())
        .args(args)
        .env("KUBECONFIG", &user.kubeconfig)
        .stdin(Stdio::null())
        .output()
        .await?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// `kubewasm logs -f ARGS` as `user` when it is refused within 5 s: its error; `None` when it
/// was let follow (it is then stopped).
async fn refused_follow(user: &TeamUser, args: &[&str]) -> Result<Option<String>> {
    let child = Command::new(kubewasm_bin())
        .args(["logs", "-f"])
        .args(args)
        .env("KUBECONFIG", &user.kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    match tokio::time::timeout(Duration::from_secs(5), child.wait_with_output()).await {
        Ok(out) => {
            let out = out?;
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            ensure!(!out.status.success(), "the follow ended by itself: {err}");
            Ok(Some(err))
        }
        Err(_) => Ok(None),
    }
}

/// `kubewasm logs -f ARGS` as `user`, its lines sent to the returned channel.
fn follow(user: &TeamUser, args: &[&str]) -> Result<(Child, tokio::sync::mpsc::Receiver<String>)> {
    let mut child = Command::new(kubewasm_bin())
        .arg("logs")
        .arg("-f")
        .args(args)
        .env("KUBECONFIG", &user.kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (tx, rx) = tokio::sync::mpsc::channel(10_000);
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if tx.send(line).await.is_err() {
                break;
            }
        }
    });
    Ok((child, rx))
}

/// A follower that the runtime let follow: started again while it is refused (a follower
/// stopped a moment ago may still hold its place until the runtime sees its connection close).
async fn held_follow(
    user: &TeamUser,
    args: &[&str],
) -> Result<(Child, tokio::sync::mpsc::Receiver<String>)> {
    let started = std::time::Instant::now();
    loop {
        let (mut child, rx) = follow(user, args)?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        if child.try_wait()?.is_none() {
            return Ok((child, rx));
        }
        ensure!(
            started.elapsed() < WAIT,
            "kubewasm logs -f {args:?} was refused for {WAIT:?}"
        );
    }
}

/// Waits for a line containing `text`.
async fn line_with(rx: &mut tokio::sync::mpsc::Receiver<String>, text: &str) -> Result<String> {
    let found = tokio::time::timeout(WAIT, async {
        while let Some(line) = rx.recv().await {
            if line.contains(text) {
                return Some(line);
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(line)) => Ok(line),
        Ok(None) => bail!("the follow ended before a line with {text:?}"),
        Err(_) => bail!("no line with {text:?} within {WAIT:?}"),
    }
}

/// `curl` straight to the runtime's port (not through the API server): status code and body.
async fn curl(addr: &str, path: &str, extra: &[&str]) -> Result<(String, String)> {
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(extra)
        .arg(format!("https://{addr}{path}"))
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    Ok((code.to_owned(), body.to_owned()))
}

impl Teams {
    async fn install(
        cp: &ControlPlane,
        client: &Client,
        x: &str,
        y: &str,
        z: &str,
    ) -> Result<Teams> {
        install_probe_crd(client).await?;
        for ns in [x, y] {
            install_tenant(client, ns, "secret", "config").await?;
            apply(
                client,
                &module_config_map(ns, "hostile", "hostile.wasm", &guest("hostile")),
            )
            .await?;
        }
        apply_all(
            client,
            &[
                hostile(x, "chatty"),
                hostile(x, "flood"),
                hostile(x, "quiet"),
                hostile(x, "failing"),
                hostile(y, "secret-keeper"),
                probe(x, "x-1", "chatty", json!({"mode": "panic"})),
                probe(y, "y-1", "secret-keeper", json!({"mode": "panic"})),
                controller(y, "steady", json!({})),
                probe(y, "steady", "steady", json!({"echo": "0"})),
            ],
        )
        .await?;
        Ok(Teams {
            x: x.to_owned(),
            y: y.to_owned(),
            alice: cp.namespace_admin(x, "alice").await?,
            mallory: cp.namespace_admin(z, "mallory").await?,
        })
    }

    /// alice fetches chatty's capsules (its reconciles of x-1 panic) and replays one offline to
    /// the same failure; team-y's are refused her, and a viewer of team-x — who reads its logs
    /// but not its Secrets, which a capsule may hold — is refused them, told who grants them.
    async fn capsules_replayed(&self, cp: &ControlPlane) -> Result<()> {
        let (x, y) = (&self.x, &self.y);
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("alice");
        let out_arg = out.to_string_lossy().into_owned();
        let fetched = eventually("alice fetches chatty's capsules", WAIT, || async {
            let (ok, stdout, err) = kubewasm_as(
                &self.alice,
                &["capsules", "-n", x, "chatty", "--out", &out_arg],
            )
            .await?;
            ensure!(ok, "kubewasm capsules failed: {err}");
            Ok(out.join("capsule-1.json").exists().then_some(stdout))
        })
        .await?;
        println!("{fetched}");
        ensure!(
            fetched.contains(&format!("{x}/x-1")) && fetched.contains("(replayable)"),
            "{fetched}"
        );
        let file = out.join("capsule-1.json");
        let capsule: serde_json::Value = serde_json::from_slice(&std::fs::read(&file)?)?;
        ensure!(
            capsule["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("panicked on purpose")),
            "{capsule}"
        );
        let module = crate::support::guests::guest("hostile");
        let (file, module) = (file.to_string_lossy(), module.to_string_lossy());
        let args = ["reconcile", "--capsule", &file, "--module", &module];
        let (ok, stdout, err) = kubewasm_as(&self.alice, &args).await?;
        println!("{stdout}");
        ensure!(
            ok && stdout.contains("the same failure") && stdout.contains("panicked on purpose"),
            "the replay: {stdout}{err}"
        );

        let (ok, stdout, err) =
            kubewasm_as(&self.alice, &["capsules", "-n", y, "secret-keeper"]).await?;
        ensure!(
            !ok && stdout.is_empty()
                && err.contains("forbidden")
                && err.contains("wasmcontrollers/capsules"),
            "alice fetched team-y's capsules: {stdout} {err}"
        );
        let vera = cp.namespace_user(x, "vera", "view").await?;
        let (ok, stdout, err) = logs(&vera, &["-n", x, "chatty"]).await?;
        ensure!(
            ok && stdout.contains("panicked"),
            "a viewer reads the log: {err}"
        );
        let (ok, stdout, err) = kubewasm_as(&vera, &["capsules", "-n", x, "chatty"]).await?;
        ensure!(
            !ok && stdout.is_empty()
                && err.contains("forbidden")
                && err.contains("--clusterrole=edit"),
            "a viewer fetched capsules: {stdout} {err}"
        );
        Ok(())
    }

    /// alice gives a controller of hers a candidate (the intruder guest beside the hostile one)
    /// and reads its differences with `kubewasm rollout diff`, which RBAC gives to `edit` and
    /// `admin`: refused her for team-y's controller, refused a viewer of team-x (what a
    /// candidate would write may hold what it read) — who still reads `kubewasm rollout status`.
    async fn diffs_by_rbac(&self, cp: &ControlPlane, client: &Client) -> Result<()> {
        let (x, y) = (&self.x, &self.y);
        let mut shadowed = hostile(x, "shadowed");
        shadowed["spec"]["candidate"] =
            json!({"configMap": {"name": "intruder", "key": "intruder.wasm"}});
        apply(&self.alice.client().await?, &shadowed).await?;
        apply(client, &probe(x, "x-2", "shadowed", json!({"mode": "ok"}))).await?;
        let shown = eventually("alice reads the candidate's differences", WAIT, || async {
            let (ok, out, err) =
                kubewasm_as(&self.alice, &["rollout", "diff", "-n", x, "shadowed"]).await?;
            ensure!(ok, "kubewasm rollout diff failed: {err}");
            Ok(out.contains(&format!("{x}/x-2 at")).then_some(out))
        })
        .await?;
        println!("{shown}");
        ensure!(shown.contains("only the"), "{shown}");
        let (ok, out, err) = kubewasm_as(
            &self.alice,
            &["rollout", "diff", "-n", x, "shadowed", "--json"],
        )
        .await?;
        ensure!(ok, "{err}");
        let list: serde_json::Value = serde_json::from_str(&out)?;
        ensure!(
            list["kind"] == "ShadowDifferenceList" && list["differing"].as_u64() >= Some(1),
            "{list}"
        );
        let (ok, out, err) =
            kubewasm_as(&self.alice, &["rollout", "diff", "-n", y, "secret-keeper"]).await?;
        ensure!(
            !ok && out.is_empty()
                && err.contains("forbidden")
                && err.contains("wasmcontrollers/diffs"),
            "alice read team-y's differences: {out} {err}"
        );
        let victor = cp.namespace_user(x, "victor", "view").await?;
        let (ok, out, err) =
            kubewasm_as(&victor, &["rollout", "diff", "-n", x, "shadowed"]).await?;
        ensure!(
            !ok && out.is_empty()
                && err.contains("forbidden")
                && err.contains("--clusterrole=edit"),
            "a viewer read the differences: {out} {err}"
        );
        // The status is written on the runtime's next tick (every 2 s); the differences are
        // served as soon as they are found.
        eventually("a viewer reads the rollout's status", WAIT, || async {
            let (ok, out, err) =
                kubewasm_as(&victor, &["rollout", "status", "-n", x, "shadowed"]).await?;
            ensure!(ok, "kubewasm rollout status as a viewer: {err}");
            Ok(out.contains("differing: ").then_some(()))
        })
        .await?;
        Ok(())
    }

    async fn read_own_and_refused(&self, cp: &ControlPlane, addr: &str) -> Result<()> {
        let (x, y) = (&self.x, &self.y);
        let own = eventually(
            "alice reads chatty's panics with kubewasm logs",
            WAIT,
            || async {
                let (ok, out, err) = logs(&self.alice, &["-n", x, "chatty"]).await?;
                ensure!(ok, "kubewasm logs failed: {err}");
                Ok(out.contains("panicked on purpose").then_some(out))
            },
        )
        .await?;
        let first = own.lines().next().unwrap_or_default();
        ensure!(
            first.len() > 25 && first.as_bytes()[10] == b'T' && first.contains("Z "),
            "a line starts with its time: {first}"
        );
        ensure!(own.contains(&format!("object={x}/x-1")), "{own}");
        ensure!(
            !own.contains(y.as_str()),
            "team-y's lines in team-x's log: {own}"
        );

        // Refused team-y's controller, and one that does not exist, in the same words.
        let (ok, out, err) = logs(&self.alice, &["-n", y, "secret-keeper"]).await?;
        ensure!(!ok && out.is_empty(), "alice read team-y's log: {out}");
        ensure!(
            err.contains("forbidden") && err.contains("wasmcontrollers/log"),
            "{err}"
        );
        ensure!(
            err.contains("kubectl create rolebinding"),
            "says who can grant it: {err}"
        );
        let (ok, _, missing) = logs(&self.alice, &["-n", y, "no-such-thing"]).await?;
        ensure!(
            !ok && missing.replace("no-such-thing", "secret-keeper") == err,
            "a missing controller is refused as an existing one:\n{missing}\n{err}"
        );
        let (ok, out, err) = logs(&self.mallory, &["-n", x, "chatty"]).await?;
        ensure!(
            !ok && out.is_empty() && err.contains("forbidden"),
            "mallory: {out} {err}"
        );

        // A connection that never says anything is closed (the TLS handshake's deadline).
        let mut silent = tokio::net::TcpStream::connect(addr).await?;
        let mut byte = [0u8; 1];
        let closed = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::io::AsyncReadExt::read(&mut silent, &mut byte),
        )
        .await;
        ensure!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "a silent connection is still open after 20 s: {closed:?}"
        );
        // Straight to the runtime: no front proxy certificate, whatever the headers say.
        let path =
            format!("/apis/logs.kubewasm.dev/v1alpha1/namespaces/{x}/wasmcontrollers/chatty/log");
        let forged = [
            "-H",
            "X-Remote-User: admin",
            "-H",
            "X-Remote-Group: system:masters",
        ];
        let (code, body) = curl(addr, &path, &forged).await?;
        ensure!(code == "401" && !body.contains("panicked"), "{code} {body}");
        let (code, _) = curl(addr, "/apis/logs.kubewasm.dev/v1alpha1", &[]).await?;
        ensure!(code == "401", "discovery without the front proxy: {code}");
        // A certificate of another CA (the API server's serving one) is no better.
        let pki = cp.state_dir().context("no state dir")?.join("pki");
        let (cert, key) = (pki.join("apiserver.crt"), pki.join("apiserver.key"));
        let other = [
            "--cert",
            cert.to_str().unwrap_or_default(),
            "--key",
            key.to_str().unwrap_or_default(),
        ];
        let (code, body) = curl(addr, &path, &[&other[..], &forged[..]].concat()).await?;
        ensure!(
            code != "200" && !body.contains("panicked"),
            "another CA: {code} {body}"
        );
        // With the front proxy's certificate, RBAC still decides for the user it names.
        let (cert, key) = cp
            .front_proxy_client()
            .context("no front proxy certificate")?;
        let proxy = [
            "--cert",
            cert.to_str().unwrap_or_default(),
            "--key",
            key.to_str().unwrap_or_default(),
        ];
        let as_alice = [
            "-H",
            "X-Remote-User: alice",
            "-H",
            "X-Remote-Group: system:authenticated",
        ];
        let (code, body) = curl(addr, &path, &[&proxy[..], &as_alice[..]].concat()).await?;
        ensure!(
            code == "200" && body.contains("panicked"),
            "alice via the proxy: {code} {body}"
        );
        let theirs = path
            .replace(x.as_str(), y)
            .replace("chatty", "secret-keeper");
        let (code, body) = curl(addr, &theirs, &[&proxy[..], &as_alice[..]].concat()).await?;
        ensure!(code == "403" && !body.contains("panicked"), "{code} {body}");
        Ok(())
    }

    async fn follow(&self, client: &Client) -> Result<()> {
        let x = &self.x;
        let (mut child, mut rx) = follow(&self.alice, &["-n", x, "chatty", "--tail", "1"])?;
        line_with(&mut rx, "panicked on purpose").await?;
        apply(client, &probe(x, "x-2", "chatty", json!({"mode": "panic"}))).await?;
        line_with(&mut rx, &format!("object={x}/x-2")).await?;
        child.kill().await?;
        Ok(())
    }

    async fn followers_capped(&self) -> Result<()> {
        let x = self.x.as_str();
        let mut held = Vec::new();
        for name in ["chatty", "chatty", "flood", "quiet"] {
            let (child, rx) = held_follow(&self.alice, &["-n", x, name]).await?;
            held.push((child, rx));
        }
        // Each is connected once the runtime counts it: wait until a fifth is refused.
        let refused = eventually("a fifth follower is refused", WAIT, || async {
            refused_follow(&self.alice, &["-n", x, "quiet"]).await
        })
        .await;
        let refused = match refused {
            Ok(refused) => refused,
            Err(e) => {
                let mut states = Vec::new();
                for (child, _) in &mut held {
                    states.push(format!("{:?}", child.try_wait()));
                }
                let mut err = String::new();
                if let Some(mut stderr) = held[0].0.stderr.take() {
                    use tokio::io::AsyncReadExt as _;
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        stderr.read_to_string(&mut err),
                    )
                    .await;
                }
                bail!("{e:#}; the four followers: {states:?}; the first's stderr: {err}");
            }
        };
        ensure!(
            refused.contains("already follow logs on this runtime") && refused.contains("(429)"),
            "{refused}"
        );
        for (child, _) in &mut held {
            child.kill().await?;
        }
        drop(held);
        // A third of one controller is refused for that controller's cap.
        let (mut a, _ra) = held_follow(&self.alice, &["-n", x, "chatty"]).await?;
        let (mut b, _rb) = held_follow(&self.alice, &["-n", x, "chatty"]).await?;
        let refused = eventually("a third follower of chatty is refused", WAIT, || async {
            refused_follow(&self.alice, &["-n", x, "chatty"]).await
        })
        .await?;
        ensure!(
            refused.contains("--log-max-followers-per-controller") && refused.contains("stop one"),
            "{refused}"
        );
        a.kill().await?;
        b.kill().await?;
        Ok(())
    }

    /// A minute of a hostile tenant, all at once: `flood` logging 1 MiB lines (cut to 4 KiB)
    /// at the full rate for 60 s, 100 followers asking for its log at once, a reader that
    /// never reads, and `failing`'s capsules filling the namespace's cap. Throughout, flood's
    /// ring stays at its cap, the quiet ring of the same namespace keeps its lines, team-y's
    /// controller is served, and the runtime's memory stays bounded.
    async fn hostile_minute(
        &self,
        cp: &ControlPlane,
        client: &Client,
        addr: &str,
        runtime: &RuntimeProcess,
    ) -> Result<()> {
        let (x, y) = (self.x.as_str(), self.y.as_str());
        let started = Instant::now();
        let flood: Vec<_> = (0..10)
            .map(|i| {
                probe(
                    x,
                    &format!("f-{i:02}"),
                    "flood",
                    json!({"mode": "log-loop"}),
                )
            })
            .collect();
        apply_all(client, &flood).await?;
        // Each failing reconcile's capsule carries its request: a Probe of ~128 KiB.
        let pad = "p".repeat(128 << 10);
        let failing: Vec<_> = (0..8)
            .map(|i| {
                let spec = json!({"mode": "huge-error", "pad": pad});
                probe(x, &format!("e-{i:02}"), "failing", spec)
            })
            .collect();
        apply_all(client, &failing).await?;

        let full = eventually("flood's ring fills", WAIT, || async {
            let (ok, out, err) = logs(&self.alice, &["-n", x, "flood"]).await?;
            ensure!(ok, "{err}");
            Ok((out.len() > RING / 2).then_some(()))
        })
        .await;
        full?;
        let followers = self.hundred_followers(cp, addr).await?;
        eprintln!("100 followers of flood at once: {followers}");
        self.stalled_reader_cut(cp, addr, runtime).await?;

        // The rest of the minute: team-y served, the rings at their caps, memory sampled.
        let mut peak = 0;
        let mut served = Vec::new();
        let mut echo = 0;
        while started.elapsed() < FLOOD_FOR {
            echo += 1;
            let asked = Instant::now();
            crate::isolation::probes(client, y)
                .patch(
                    "steady",
                    &Default::default(),
                    &kube::api::Patch::Merge(json!({"spec": {"echo": echo.to_string()}})),
                )
                .await?;
            crate::isolation::wait_echo(client, y, "steady", &echo.to_string()).await?;
            served.push(asked.elapsed());
            let (ok, flood, err) = logs(&self.alice, &["-n", x, "flood"]).await?;
            ensure!(ok, "{err}");
            ensure!(
                flood.len() <= RING,
                "flood's ring holds {} bytes, over its cap {RING}",
                flood.len()
            );
            let (_, chatty, _) = logs(&self.alice, &["-n", x, "chatty"]).await?;
            ensure!(
                chatty.contains("panicked on purpose"),
                "chatty's lines were pushed out: {chatty}"
            );
            ensure!(
                flood.len() + chatty.len() <= PER_NAMESPACE,
                "team-x holds more than its cap"
            );
            peak = peak.max(crate::runtime::memory_kib(runtime.pid())?.0);
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let (rss, high) = crate::runtime::memory_kib(runtime.pid())?;
        eprintln!(
            "after {:.0?} of flood: team-y's patches served in {served:.1?}; runtime VmRSS sampled up to {peak} KiB, now {rss} KiB, peak {high} KiB",
            started.elapsed()
        );
        // Some 40–60 MiB here: neither the flood nor its followers are buffered for.
        ensure!(high < 256 << 10, "the runtime peaked at {high} KiB");
        self.capsules_at_their_cap().await?;
        // The flood ends with its Probes; two followers of flood are served again.
        for i in 0..10 {
            let _ = crate::isolation::probes(client, x)
                .delete(&format!("f-{i:02}"), &Default::default())
                .await;
        }
        let (mut a, _ra) = held_follow(&self.alice, &["-n", x, "flood", "--tail", "1"]).await?;
        let (mut b, _rb) = held_follow(&self.alice, &["-n", x, "flood", "--tail", "1"]).await?;
        a.kill().await?;
        b.kill().await?;
        Ok(())
    }

    /// 100 followers of flood at once, straight to the runtime as alice (through the front
    /// proxy's certificate, as the API server would): at most the per-controller cap are
    /// served, the rest refused at once with the cap's words. What they were answered.
    async fn hundred_followers(&self, cp: &ControlPlane, addr: &str) -> Result<String> {
        let mut asked = Vec::new();
        for _ in 0..100 {
            let child = self
                .follow_flood_as_alice(cp, addr, &["--max-time", "10", "-w", "%{http_code}"])?
                .stdout(Stdio::piped())
                .spawn()?;
            asked.push(child.wait_with_output());
        }
        let mut codes = std::collections::BTreeMap::<String, usize>::new();
        for answer in futures::future::join_all(asked).await {
            let code = String::from_utf8_lossy(&answer?.stdout).into_owned();
            *codes.entry(code).or_default() += 1;
        }
        let served = codes.get("200").copied().unwrap_or_default();
        let refused = codes.get("429").copied().unwrap_or_default();
        ensure!(
            served <= 2 && served + refused == 100,
            "100 followers of one controller under --log-max-followers-per-controller 2: {codes:?}"
        );
        Ok(format!("{codes:?} (HTTP status: followers)"))
    }

    /// `curl` following flood's log straight at the runtime as alice, through the front proxy's
    /// certificate (as the API server would), with `extra` options; its body is thrown away.
    fn follow_flood_as_alice(
        &self,
        cp: &ControlPlane,
        addr: &str,
        extra: &[&str],
    ) -> Result<Command> {
        let (cert, key) = cp
            .front_proxy_client()
            .context("no front proxy certificate")?;
        let mut curl = Command::new("curl");
        curl.args(["-sk", "-o", "/dev/null"])
            .args(extra)
            .arg("--cert")
            .arg(&cert)
            .arg("--key")
            .arg(&key)
            .args([
                "-H",
                "X-Remote-User: alice",
                "-H",
                "X-Remote-Group: system:authenticated",
            ])
            .arg(format!(
                "https://{addr}/apis/logs.kubewasm.dev/v1alpha1/namespaces/{}/wasmcontrollers/flood/log?follow=true",
                self.x
            ))
            .kill_on_drop(true);
        Ok(curl)
    }

    /// A follower that never reads while the flood goes on is cut off.
    async fn stalled_reader_cut(
        &self,
        cp: &ControlPlane,
        addr: &str,
        runtime: &RuntimeProcess,
    ) -> Result<()> {
        let before = runtime.log_len();
        let mut reader = self
            .follow_flood_as_alice(cp, addr, &["--limit-rate", "1"])?
            .spawn()?;
        eventually(
            "the runtime cuts the reader that does not read",
            WAIT,
            || async {
                Ok(runtime
                    .log_since(before)
                    .contains("its connection was cut")
                    .then_some(()))
            },
        )
        .await?;
        reader.kill().await?;
        Ok(())
    }

    /// `failing`'s reconciles all fail, each capsule ~128 KiB: its capsules stay within the
    /// namespace's cap and chatty's are still there.
    async fn capsules_at_their_cap(&self) -> Result<()> {
        let x = self.x.as_str();
        let dir = tempfile::tempdir()?;
        let fetch = |name: &'static str| {
            let out = dir.path().join(name);
            async move {
                let out_arg = out.to_string_lossy().into_owned();
                let (ok, _, err) =
                    kubewasm_as(&self.alice, &["capsules", "-n", x, name, "--out", &out_arg])
                        .await?;
                ensure!(ok, "kubewasm capsules {name}: {err}");
                let mut sizes = Vec::new();
                for entry in std::fs::read_dir(&out)? {
                    sizes.push(entry?.metadata()?.len());
                }
                Ok(sizes)
            }
        };
        let failing = eventually("failing's capsules are kept", WAIT, || async {
            let sizes = fetch("failing").await?;
            Ok((sizes.len() >= 2).then_some(sizes))
        })
        .await?;
        let total: u64 = failing.iter().sum();
        eprintln!("failing's capsules: {failing:?} bytes, {total} in all");
        ensure!(
            failing.len() <= 5 && total <= CAPSULES_PER_NAMESPACE as u64,
            "failing keeps {} capsules, {total} bytes (cap {CAPSULES_PER_NAMESPACE})",
            failing.len()
        );
        let chatty = fetch("chatty").await?;
        ensure!(!chatty.is_empty(), "chatty's capsules were pushed out");
        Ok(())
    }
}

/// A follow survives the controller moving to another replica: two `kubewasm run
/// --leader-elect --shards 1` replicas serve logs, the APIService reaches the one that holds
/// the shard, which is then stopped; the APIService is pointed at the other, which takes the
/// shard over. The same `kubewasm logs -f` prints the lines the new replica logs.
#[tokio::test]
async fn a_follow_continues_when_the_controller_moves_to_another_replica() {
    let control_plane = StopOnDrop::start("live-logs-failover");
    let cp = &control_plane.0;
    let (client, x) = prepare(cp, "team-x").await;
    let ip = host_address().expect("this machine's address");
    let (port_a, port_b) = (
        free_port().expect("a free port"),
        free_port().expect("a free port"),
    );
    let replica = |port: u16| {
        let addr = format!("{ip}:{port}");
        RuntimeProcess::start_with_args(
            &cp.runtime_kubeconfig(),
            "",
            &[
                "--leader-elect",
                "--shards",
                "1",
                "--leader-election-namespace",
                crate::support::RUNTIME_NAMESPACE,
                "--leader-election-id",
                &x,
                "--lease-duration-seconds",
                "3",
                "--api-addr",
                &addr,
            ],
        )
    };
    let mut a = replica(port_a);
    let result = async {
        install_probe_crd(&client).await?;
        install_tenant(&client, &x, "secret", "config").await?;
        apply(
            &client,
            &module_config_map(&x, "hostile", "hostile.wasm", &guest("hostile")),
        )
        .await?;
        apply_all(
            &client,
            &[
                hostile(&x, "chatty"),
                probe(&x, "x-1", "chatty", json!({"mode": "panic"})),
            ],
        )
        .await?;
        let alice = cp.namespace_admin(&x, "alice").await?;
        cp.expose_log_server(ip, port_a).await?;
        // Once RBAC has aggregated the grant into `admin` and the guest has panicked.
        eventually("alice reads chatty's panics", WAIT, || async {
            let (ok, out, err) = logs(&alice, &["-n", &x, "chatty"]).await?;
            ensure!(ok, "kubewasm logs failed: {err}");
            Ok(out.contains("panicked on purpose").then_some(()))
        })
        .await?;
        let (mut follower, mut rx) = follow(&alice, &["-n", &x, "chatty"])?;
        line_with(&mut rx, "panicked on purpose").await?;
        // The second replica waits for the shard; the first leaves.
        let b = replica(port_b);
        tokio::time::sleep(Duration::from_secs(2)).await;
        a.stop()?;
        let left = format!("{:.3}", k8s_openapi::jiff::Timestamp::now());
        cp.expose_log_server(ip, port_b).await?;
        let moved = tokio::time::timeout(WAIT, async {
            while let Some(line) = rx.recv().await {
                let time = line.split(' ').next().unwrap_or_default();
                if time > left.as_str() && line.contains("panicked on purpose") {
                    return Some(line);
                }
            }
            None
        })
        .await;
        ensure!(
            matches!(moved, Ok(Some(_))),
            "the follow printed no line of the new replica after {left}: {moved:?}"
        );
        follower.kill().await?;
        anyhow::Ok(b)
    }
    .await;
    match result {
        Ok(mut b) => finish(Ok(()), &mut [&mut a, &mut b]),
        Err(e) => finish(Err(e), &mut [&mut a]),
    }
}
