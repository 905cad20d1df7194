//! The ConfigMap restarter of the controller tutorials, level-based, as a kubewasm guest.
//!
//! A ConfigMap annotated `magalix.com/podDeleteMatch: "<label selector>"` names the Pods that
//! use it; when its data changes, every Pod in its namespace that matches the selector is
//! deleted (and recreated by its Deployment with the new data).
//!
//! The tutorial reacts to update *events*, so a change made while it is down is lost. This
//! guest is level-based instead: it saves, as its state for the ConfigMap (`setState`, kept by
//! the runtime in a WasmControllerState of its namespace), the digest of the data the Pods were last
//! restarted for, and compares it with the digest of the data it observes now:
//!
//! - no state yet (first sighting): save the digest, restart nothing;
//! - same digest (e.g. a metadata-only change): nothing;
//! - another digest: list the matching Pods (the runtime's cache) and take the *bound* — the
//!   newest `creationTimestamp` among them, or the time the data changed if that is later —
//!   save `pending:<new digest>@<bound>`, delete the matching Pods created no later than the
//!   bound's second, save the new digest, emit `PodsRestarted` (with nothing to bound it by,
//!   a Pod without a creation time, it saves `pending:<new digest>` and deletes every
//!   matching Pod, as the tutorial does);
//! - `pending:<this digest>@<bound>`: an attempt for this data did not finish (a runtime
//!   killed between the deletions and saving the digest, or a delete that failed): delete the
//!   matching Pods created no later than the saved bound's second again — the replacements,
//!   made after the first deletions, are newer and spared — then save the digest and emit
//!   `PodsRestarted`.
//!
//! It needs no write on the ConfigMap: the tutorial's ServiceAccount `joe` (read ConfigMaps;
//! read and delete Pods) is enough. A change made while the runtime was down shows up as a
//! different digest when it comes back. A runtime killed between deleting the Pods and saving
//! the digest finds `pending:` when it returns, and deletes only what existed when the restart
//! began: nothing restarts twice.
//!
//! The bound comes from the Pods themselves (the API server's clock) because the time a
//! ConfigMap's data changed is not recorded reliably: `metadata.managedFields[].time` stays at
//! the first change when the same manager (two `kubectl patch`) changes the data again, on
//! Kubernetes 1.20 at least — it is used only when it is later than every Pod. The API server
//! keeps seconds, so a replacement created in the very second of the newest old Pod would be
//! deleted once more by an unfinished attempt's retry; and a Pod created just before the change
//! but not yet in the runtime's cache when the restart began is kept.
//!
//! An invalid (or empty, which would match every Pod) selector is the ConfigMap author's
//! mistake, not the controller's: the guest emits a `Warning` Event `InvalidSelector` on the
//! ConfigMap, where its author looks (`kubectl describe configmap`), restarts nothing and
//! saves nothing; the controller itself stays healthy. Once the selector is fixed, a data
//! change made in the meantime is acted on as usual.

use std::fmt::Write as _;

use kubewasm_guest_sdk::selector::Selector;
use kubewasm_guest_sdk::{Cluster, Error, EventType, Request, Response, object};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// The annotation that opts a ConfigMap in, holding the selector of the Pods to restart.
pub const SELECTOR_ANNOTATION: &str = "magalix.com/podDeleteMatch";

/// Restart the ConfigMap's Pods once per change of its data.
pub fn reconcile(req: &Request, cluster: &dyn Cluster) -> Result<Response, Error> {
    let Some(config_map) = &req.parent else {
        return Ok(Response::new());
    };
    let Some(selector) = object::annotation(config_map, SELECTOR_ANNOTATION) else {
        return Ok(Response::new());
    };
    if config_map.pointer("/metadata/deletionTimestamp").is_some() {
        return Ok(Response::new());
    }
    let selector = match parse_selector(selector) {
        Ok(selector) => selector,
        Err(why) => {
            return Ok(Response::new().event(EventType::Warning, "InvalidSelector", why));
        }
    };

    let digest = data_digest(config_map);
    let namespace = req.target.namespace.as_deref();
    let selector = selector.to_string();
    let mut response = Response::new();
    let bound = match req.state.as_deref() {
        None => return Ok(response.set_state(digest)),
        Some(saved) if saved == digest => return Ok(response),
        Some(saved) => match pending_bound(saved, &digest) {
            // An unfinished attempt for this very data: the bound it saved.
            Some(bound) => bound.map(str::to_owned),
            None => {
                let pods = cluster.list("v1", "Pod", namespace, Some(&selector))?;
                let bound = restart_bound(&pods, data_changed_at(config_map));
                response = response.set_state(pending_state(&digest, bound.as_deref()));
                bound
            }
        },
    };
    let (response, since) = match bound.as_deref().and_then(next_second) {
        Some(before) => (
            response.delete_all_created_before("v1", "Pod", namespace, &selector, &before),
            format!(", created before {before}"),
        ),
        // Nothing to bound it by (a Pod without a creation time, or no Pod and no time of the
        // change): every matching Pod, as the tutorial does.
        None => (
            response.delete_all_of("v1", "Pod", namespace, &selector),
            String::new(),
        ),
    };
    let message = format!(
        "ConfigMap data changed: deleted the Pods in namespace {} matching {selector:?}{since}",
        namespace.unwrap_or_default(),
    );
    Ok(response
        .set_state(digest)
        .event(EventType::Normal, "PodsRestarted", message))
}

/// The state saved while a restart for `digest` is under way: `pending:<digest>@<bound>`, or
/// `pending:<digest>` when it is not bounded (every matching Pod goes).
pub fn pending_state(digest: &str, bound: Option<&str>) -> String {
    match bound {
        Some(bound) => format!("{PENDING}{digest}@{bound}"),
        None => format!("{PENDING}{digest}"),
    }
}

/// The bound of an unfinished restart for `digest` saved as `saved` (`Some(None)`: not
/// bounded); `None` when `saved` is not one for this digest.
pub fn pending_bound<'a>(saved: &'a str, digest: &str) -> Option<Option<&'a str>> {
    let rest = saved.strip_prefix(PENDING)?.strip_prefix(digest)?;
    match rest {
        "" => Some(None),
        _ => rest.strip_prefix('@').map(Some),
    }
}

/// The newest `creationTimestamp` of `pods`, or `changed_at` when that is later. `None` (not
/// bounded) when a Pod has no usable creation time, or when there is no Pod and no
/// `changed_at`.
pub fn restart_bound(pods: &[Value], changed_at: Option<&str>) -> Option<String> {
    let mut newest: Option<&str> = changed_at.filter(|t| next_second(t).is_some());
    for pod in pods {
        let created = pod
            .pointer("/metadata/creationTimestamp")
            .and_then(Value::as_str)
            .filter(|t| next_second(t).is_some())?;
        // RFC 3339 in UTC with a fixed format (`2026-11-23T12:00:00Z`): text order is time order.
        newest = newest.max(Some(created));
    }
    newest.map(str::to_owned)
}

/// The prefix of the state saved while a restart is under way: `pending:<digest>@<bound>`.
pub const PENDING: &str = "pending:";

/// The second after `time` (`YYYY-MM-DDTHH:MM:SSZ`, as the API server writes times), in the
/// same form; `None` for anything else.
pub fn next_second(time: &str) -> Option<String> {
    let b = time.as_bytes();
    if b.len() != 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
        || b[19] != b'Z'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| time.get(r)?.parse::<i64>().ok();
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let seconds =
        days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second + 1;
    let (days, rest) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    Some(format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    ))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let doy = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day count since 1970-01-01 (the inverse of [`days_from_civil`]).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// When `data` or `binaryData` last changed, as the API server recorded it: the latest
/// `time` of a `managedFields` entry that owns either. `None` when no entry says.
pub fn data_changed_at(config_map: &Value) -> Option<&str> {
    config_map
        .pointer("/metadata/managedFields")?
        .as_array()?
        .iter()
        .filter(|entry| {
            let fields = entry.get("fieldsV1");
            ["f:data", "f:binaryData"]
                .iter()
                .any(|f| fields.and_then(|v| v.get(f)).is_some())
        })
        .filter_map(|entry| entry.get("time").and_then(Value::as_str))
        // RFC 3339 in UTC with a fixed format (`2026-11-23T12:00:00Z`): text order is time order.
        .max()
}

/// A selector the guest is willing to delete by: valid, and not empty (which would select
/// every Pod in the namespace).
/// A build with `CONFIGMAP_RESTARTER_WIDEN` set at build time keeps only the selector's first
/// requirement, so it restarts more Pods than the annotation names: the risky change a shadow
/// rollout is for (its live test and `docs/`'s walk-through compare it with this guest as
/// built normally). Never set for the tutorial's module.
pub const WIDEN: bool = option_env!("CONFIGMAP_RESTARTER_WIDEN").is_some();

fn parse_selector(selector: &str) -> Result<Selector, String> {
    let selector = match WIDEN {
        true => selector.split(',').next().unwrap_or(selector),
        false => selector,
    };
    let parsed = Selector::parse(selector).map_err(|e| {
        format!(
            "annotation {SELECTOR_ANNOTATION}: {e}; no Pods will be restarted until it is fixed"
        )
    })?;
    if parsed.is_empty() {
        return Err(format!(
            "annotation {SELECTOR_ANNOTATION} is empty, which would select every Pod in the namespace; no Pods will be restarted"
        ));
    }
    Ok(parsed)
}

/// `sha256:<hex>` over a canonical form of `data` and `binaryData`: every entry as
/// `[section, key, value]`, sorted, serialised as JSON. Independent of key order in the
/// object and of serde_json's map implementation.
pub fn data_digest(config_map: &Value) -> String {
    let mut entries: Vec<(&str, &str, &Value)> = ["data", "binaryData"]
        .into_iter()
        .flat_map(|section| {
            config_map
                .get(section)
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(move |(key, value)| (section, key.as_str(), value))
        })
        .collect();
    entries.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let canonical = serde_json::to_vec(&entries).expect("strings and JSON values serialise");
    let hash = Sha256::digest(&canonical);
    let mut digest = String::from("sha256:");
    for byte in hash {
        let _ = write!(digest, "{byte:02x}");
    }
    digest
}

kubewasm_guest_sdk::export_reconciler!(reconcile);
