//! What the API server was asked during one run, by verb and resource: its own counters
//! (`apiserver_request_total`, `apiserver_request_duration_seconds_sum` from `/metrics`) read
//! before and after. The time is the sum of the requests' latencies as the API server saw
//! them (with requests in flight at once, more than the run lasted); watches are counted but
//! their time is left out (a watch lasts as long as it is open).

use std::collections::HashMap;

use anyhow::{Context, Result};
use kube::Client;

/// Counts and summed latency (seconds) per `VERB group/resource/subresource`.
#[derive(Debug, Default, Clone)]
pub struct Requests(HashMap<String, (f64, f64)>);

/// How long the API server must have been asked no write to be taken as quiet.
const QUIET: std::time::Duration = std::time::Duration::from_secs(3);

/// Rows printed per run, the costliest first.
const ROWS: usize = 8;

impl Requests {
    /// The API server's counters now.
    pub async fn read(client: &Client) -> Result<Requests> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .context("a request for /metrics")?;
        let text = client
            .request_text(request)
            .await
            .context("reading the API server's /metrics")?;
        Ok(Requests::parse(&text))
    }

    fn parse(text: &str) -> Requests {
        let mut by = HashMap::<String, (f64, f64)>::new();
        for line in text.lines() {
            let (is_count, rest) = if let Some(r) = line.strip_prefix("apiserver_request_total{") {
                (true, r)
            } else if let Some(r) = line.strip_prefix("apiserver_request_duration_seconds_sum{") {
                (false, r)
            } else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let label = |name: &str| {
                let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
                labels[start..].split('"').next()
            };
            let verb = label("verb").unwrap_or("?");
            let what = [label("group"), label("resource"), label("subresource")]
                .into_iter()
                .flatten()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join("/");
            let entry = by.entry(format!("{verb} {what}")).or_default();
            if is_count {
                entry.0 += value;
            } else if verb != "WATCH" {
                entry.1 += value;
            }
        }
        Requests(by)
    }

    /// What was asked between `before` and `self`.
    pub fn since(&self, before: &Requests) -> Requests {
        let by = self
            .0
            .iter()
            .map(|(k, &(count, secs))| {
                let (c0, s0) = before.0.get(k).copied().unwrap_or_default();
                (k.clone(), (count - c0, secs - s0))
            })
            .filter(|(_, (count, _))| *count > 0.0)
            .collect();
        Requests(by)
    }

    /// Waits until the API server has been asked no write for [`QUIET`] (what the namespaces
    /// just created set off: kube-controller-manager adds each one's ServiceAccount, token
    /// Secret and root CA ConfigMap for minutes after 10,000 were created), at most `limit`;
    /// how long it waited.
    pub async fn quiet(client: &Client, limit: std::time::Duration) -> Result<std::time::Duration> {
        let started = std::time::Instant::now();
        let mut before = Requests::read(client).await?;
        while started.elapsed() < limit {
            tokio::time::sleep(QUIET).await;
            let now = Requests::read(client).await?;
            let writes: f64 = now
                .since(&before)
                .0
                .iter()
                .filter(|(what, _)| {
                    ["POST ", "PUT ", "PATCH ", "DELETE "]
                        .iter()
                        .any(|v| what.starts_with(v))
                })
                .map(|(_, &(count, _))| count)
                .sum();
            if writes == 0.0 {
                break;
            }
            before = now;
        }
        Ok(started.elapsed())
    }

    /// How many `VERB group/resource/subresource` were asked (all codes).
    pub fn count(&self, what: &str) -> f64 {
        self.0.get(what).map_or(0.0, |&(count, _)| count)
    }

    /// One line of totals and the costliest rows, per controller of `n`.
    pub fn print(&self, title: &str, n: usize) {
        let (count, secs) = self
            .0
            .values()
            .fold((0.0, 0.0), |(c, s), &(c1, s1)| (c + c1, s + s1));
        eprintln!(
            "  API requests, {title}: {count:.0} ({:.2} per controller), their latencies summed {secs:.1} s",
            count / n.max(1) as f64
        );
        let mut rows: Vec<_> = self.0.iter().collect();
        rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1).then(b.1.0.total_cmp(&a.1.0)));
        for (what, (count, secs)) in rows.into_iter().take(ROWS) {
            eprintln!(
                "    {what}: {count:.0} ({:.2} per controller), {secs:.1} s",
                count / n.max(1) as f64
            );
        }
    }
}
