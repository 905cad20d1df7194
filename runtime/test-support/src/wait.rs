//! Waiting for the cluster to get somewhere, with a deadline and a message that says what did
//! not happen.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

/// How often [`eventually`] checks again.
const POLL: Duration = Duration::from_millis(200);

/// Calls `check` until it returns `Ok(Some(value))`, for at most `timeout`.
///
/// `Ok(None)` and `Err(_)` both mean "not yet": a check says what it saw by returning an
/// error (`bail!("2 pods, want 3")`), and the last one is in the timeout message, after
/// `what` — the thing that should have happened (e.g. "the Deployment has 2 Pods").
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let started = Instant::now();
    let deadline = started + timeout;
    let mut last = String::from("never checked");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, check()).await {
            Ok(Ok(Some(value))) => return Ok(value),
            Ok(Ok(None)) => last = "not yet".to_owned(),
            Ok(Err(error)) => last = format!("{error:#}"),
            Err(_) => last = format!("the last check itself was still running ({last})"),
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?}: {what} did not happen (last check: {last})");
        }
        tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

/// Fails unless `pod` runs `echo <greeting>`, is not being deleted and, with `replaces`, is
/// another Pod than that uid: what the HelloWorld guest makes, checked by the live and the
/// end-to-end tests alike.
pub fn ensure_greeting_pod(
    pod: &k8s_openapi::api::core::v1::Pod,
    greeting: &str,
    replaces: Option<&str>,
) -> Result<()> {
    use kube::ResourceExt as _;
    let name = pod.name_any();
    let uid = pod.uid().unwrap_or_default();
    if replaces == Some(uid.as_str()) {
        bail!("still the old Pod {name} (uid {uid})");
    }
    if pod.metadata.deletion_timestamp.is_some() {
        bail!("Pod {name} is being deleted");
    }
    let command = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.command.clone())
        .unwrap_or_default();
    if command != ["echo", greeting] {
        bail!("Pod {name} runs {command:?}, want [\"echo\", {greeting:?}]");
    }
    Ok(())
}
