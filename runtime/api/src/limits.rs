//! Every limit a spec may ask for (`spec.limits`), defined once: its field, its default, the
//! operator's flag that caps it and that cap's default, and how a value above the cap is
//! clamped and said. The CLI's `--max-*` flags ([`LimitCaps`] as `clap::Args`), the clamp,
//! the CRD's description of `spec.limits` and the rows of docs/07-reference.md are all made
//! from [`SPEC_LIMITS`]: a limit added there has its flag, its cap and its documentation, or the
//! drift tests fail.

use std::time::Duration;

use super::{ControllerLimits, parse_bytes};

/// The limits of one reconcile call that a spec sets; the sandbox's `Limits` takes these from
/// it and holds the runtime's own beside them. The defaults are the sandbox's (the runtime's
/// tests check that they agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// Largest linear memory a guest may grow to, in bytes.
    pub memory_bytes: usize,
    /// Wall-clock time one reconcile may take.
    pub timeout: Duration,
    /// Most actions in one response.
    pub actions: usize,
    /// Largest response document, in bytes.
    pub response_bytes: usize,
    /// Bytes of log lines kept per call.
    pub log_bytes: usize,
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            memory_bytes: 64 << 20,
            timeout: Duration::from_secs(1),
            actions: 1000,
            response_bytes: 1 << 20,
            log_bytes: 64 << 10,
        }
    }
}

/// How a limit's values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A Kubernetes quantity of bytes (`64Mi`).
    Bytes,
    /// Milliseconds.
    Millis,
    /// A plain number.
    Count,
}

impl Unit {
    /// A value as a flag or a spec writes it.
    pub fn show(self, value: u64) -> String {
        match self {
            Unit::Bytes => quantity(value),
            Unit::Millis | Unit::Count => value.to_string(),
        }
    }
}

/// `64Mi`, `1Ki`, or plain bytes.
fn quantity(bytes: u64) -> String {
    for (shift, suffix) in [(30, "Gi"), (20, "Mi"), (10, "Ki")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// What a controller runs with: the per-call limits and its concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    /// Per-call limits.
    pub limits: CallLimits,
    /// Reconciles of the controller at once.
    pub concurrency: usize,
}

impl Default for Resolved {
    /// What a spec that asks for nothing gets.
    fn default() -> Self {
        Resolved {
            limits: CallLimits::default(),
            concurrency: 1,
        }
    }
}

/// One limit a spec may ask for.
pub struct SpecLimit {
    /// Its field under `spec.limits`.
    pub field: &'static str,
    /// The `kubewasm run` flag that caps it (without `--`).
    pub flag: &'static str,
    /// How its values are written.
    pub unit: Unit,
    /// What it bounds, for the CLI help, the CRD and the reference (docs/07-reference.md).
    pub what: &'static str,
    /// The cap when the operator gives no flag.
    pub default_cap: u64,
    /// The smallest value a spec may give.
    pub min: u64,
    get: fn(&Resolved) -> u64,
    set: fn(&mut Resolved, u64),
    spec: fn(&ControllerLimits) -> Option<Result<u64, String>>,
}

impl SpecLimit {
    /// What a spec that does not give it gets.
    pub fn default_value(&self) -> u64 {
        (self.get)(&Resolved::default())
    }
}

fn bytes(value: &str) -> Result<u64, String> {
    parse_bytes(value).map(|b| b as u64)
}

fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// Every limit a spec may ask for, in the order the CLI, the CRD and the reference list them.
pub const SPEC_LIMITS: [SpecLimit; 6] = [
    SpecLimit {
        field: "memory",
        flag: "max-memory",
        unit: Unit::Bytes,
        what: "memory per reconcile",
        default_cap: 256 << 20,
        min: 1,
        get: |r| r.limits.memory_bytes as u64,
        set: |r, v| r.limits.memory_bytes = to_usize(v),
        spec: |l| l.memory.as_deref().map(bytes),
    },
    SpecLimit {
        field: "timeoutMillis",
        flag: "max-timeout-millis",
        unit: Unit::Millis,
        what: "time per reconcile",
        default_cap: 10_000,
        min: 1,
        get: |r| u64::try_from(r.limits.timeout.as_millis()).unwrap_or(u64::MAX),
        set: |r, v| r.limits.timeout = Duration::from_millis(v),
        spec: |l| l.timeout_millis.map(|v| Ok(v.into())),
    },
    SpecLimit {
        field: "concurrency",
        flag: "max-concurrency",
        unit: Unit::Count,
        what: "reconciles of one controller at once",
        default_cap: 8,
        min: 1,
        get: |r| r.concurrency as u64,
        set: |r, v| r.concurrency = to_usize(v),
        spec: |l| l.concurrency.map(|v| Ok(v.into())),
    },
    SpecLimit {
        field: "actions",
        flag: "max-actions",
        unit: Unit::Count,
        what: "actions in one response; parsing stops at the first one too many",
        default_cap: 10_000,
        min: 1,
        get: |r| r.limits.actions as u64,
        set: |r, v| r.limits.actions = to_usize(v),
        spec: |l| l.actions.map(|v| Ok(v.into())),
    },
    SpecLimit {
        field: "responseBytes",
        flag: "max-response-bytes",
        unit: Unit::Bytes,
        what: "the response document, checked before a byte of it is copied out of the guest",
        default_cap: 4 << 20,
        min: 0,
        get: |r| r.limits.response_bytes as u64,
        set: |r, v| r.limits.response_bytes = to_usize(v),
        spec: |l| l.response_bytes.as_deref().map(bytes),
    },
    SpecLimit {
        field: "logBytes",
        flag: "max-log-bytes",
        unit: Unit::Bytes,
        what: "host `log` lines kept per reconcile; the rest is counted and dropped",
        default_cap: 1 << 20,
        min: 0,
        get: |r| r.limits.log_bytes as u64,
        set: |r, v| r.limits.log_bytes = to_usize(v),
        spec: |l| l.log_bytes.as_deref().map(bytes),
    },
];

impl ControllerLimits {
    /// What the controller asks for: its values, defaults where unset.
    pub fn resolve(&self) -> Result<Resolved, String> {
        let mut resolved = Resolved::default();
        for limit in &SPEC_LIMITS {
            if let Some(value) = (limit.spec)(self) {
                let value = value.map_err(|e| format!("spec.limits.{}: {e}", limit.field))?;
                if value < limit.min {
                    return Err(format!(
                        "spec.limits.{}: must be at least {}",
                        limit.field, limit.min
                    ));
                }
                (limit.set)(&mut resolved, value);
            }
        }
        Ok(resolved)
    }
}

/// The operator's maxima for what a spec may ask, one per [`SPEC_LIMITS`] entry (the
/// `kubewasm run --max-*` flags): a spec above one is clamped, and its status says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitCaps([u64; SPEC_LIMITS.len()]);

impl Default for LimitCaps {
    fn default() -> Self {
        LimitCaps(SPEC_LIMITS.map(|l| l.default_cap))
    }
}

impl LimitCaps {
    /// The cap of the limit in `spec.limits.<field>`.
    pub fn of(&self, field: &str) -> Option<u64> {
        SPEC_LIMITS
            .iter()
            .position(|l| l.field == field)
            .and_then(|i| self.0.get(i).copied())
    }

    /// The same with the cap of `spec.limits.<field>` set (tests and tools; unknown fields
    /// change nothing).
    #[must_use]
    pub fn with(mut self, field: &str, cap: u64) -> Self {
        if let Some(i) = SPEC_LIMITS.iter().position(|l| l.field == field) {
            self.0[i] = cap;
        }
        self
    }

    /// The most memory a spec may get (what a pool slot reserves).
    pub fn memory_bytes(&self) -> usize {
        to_usize(self.of("memory").unwrap_or(u64::MAX))
    }

    /// What to run with, and a sentence per value that was clamped.
    pub fn apply(&self, mut asked: Resolved) -> (Resolved, Vec<String>) {
        let mut clamped = Vec::new();
        for (limit, &cap) in SPEC_LIMITS.iter().zip(&self.0) {
            let value = (limit.get)(&asked);
            if value > cap {
                clamped.push(format!(
                    "spec.limits.{} {} clamped to the operator's maximum of {} (--{})",
                    limit.field,
                    limit.unit.show(value),
                    limit.unit.show(cap),
                    limit.flag
                ));
                (limit.set)(&mut asked, cap);
            }
        }
        (asked, clamped)
    }
}

impl clap::FromArgMatches for LimitCaps {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut caps = LimitCaps::default();
        caps.update_from_arg_matches(matches)?;
        Ok(caps)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        for (i, limit) in SPEC_LIMITS.iter().enumerate() {
            let Some(text) = matches.get_one::<String>(limit.flag) else {
                continue;
            };
            let value = match limit.unit {
                Unit::Bytes => bytes(text),
                Unit::Millis | Unit::Count => text.parse::<u64>().map_err(|e| e.to_string()),
            }
            .map_err(|e| {
                clap::Error::raw(
                    clap::error::ErrorKind::ValueValidation,
                    format!("--{} {text}: {e}\n", limit.flag),
                )
            })?;
            self.0[i] = value.max(limit.min.max(1));
        }
        Ok(())
    }
}

impl clap::Args for LimitCaps {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        SPEC_LIMITS.iter().fold(cmd, |cmd, limit| {
            cmd.arg(
                clap::Arg::new(limit.flag)
                    .long(limit.flag)
                    .value_name(match limit.unit {
                        Unit::Bytes => "QUANTITY",
                        Unit::Millis => "MILLIS",
                        Unit::Count => "N",
                    })
                    // Made once per process, when the command line is read.
                    .default_value(&*limit.unit.show(limit.default_cap).leak())
                    .help(format!(
                        "The most a spec may ask for spec.limits.{} ({}; default {}); more is clamped and its status says so",
                        limit.field,
                        limit.what,
                        limit.unit.show(limit.default_value())
                    )),
            )
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// The CRD's description of `spec.limits`, from the table.
pub fn limits_description() -> String {
    let each: Vec<String> = SPEC_LIMITS
        .iter()
        .map(|l| format!("{} (default {})", l.field, l.unit.show(l.default_value())))
        .collect();
    format!(
        "Per-call limits. Unset fields take the runtime's defaults: {}. The operator's `kubewasm run --max-*` flags cap each, and a value above its cap is clamped (the `Ready` condition says so).",
        each.join(", ")
    )
}

/// The rows of the limits table in docs/07-reference.md (it has them verbatim).
pub fn readme_rows() -> Vec<String> {
    SPEC_LIMITS
        .iter()
        .map(|l| {
            format!(
                "| `--{}` | `{}` | {} a spec may ask (`spec.limits.{}`, default {}) |",
                l.flag,
                l.unit.show(l.default_cap),
                l.what,
                l.field,
                l.unit.show(l.default_value())
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_above_a_cap_are_clamped_and_said() {
        let caps = LimitCaps::default();
        let spec: ControllerLimits = serde_json::from_value(serde_json::json!({
            "memory": "4Gi", "timeoutMillis": 3_600_000, "concurrency": 64,
            "actions": 1_000_000, "responseBytes": "1Gi", "logBytes": "1Gi"}))
        .unwrap();
        let (run, clamped) = caps.apply(spec.resolve().unwrap());
        assert_eq!(run.limits.memory_bytes, 256 << 20);
        assert_eq!(run.limits.timeout, Duration::from_secs(10));
        assert_eq!(run.concurrency, 8);
        assert_eq!(run.limits.actions, 10_000);
        assert_eq!(run.limits.response_bytes, 4 << 20);
        assert_eq!(run.limits.log_bytes, 1 << 20);
        assert_eq!(clamped.len(), 6, "{clamped:?}");
        assert!(
            clamped.contains(
                &"spec.limits.responseBytes 1Gi clamped to the operator's maximum of 4Mi (--max-response-bytes)".to_owned()
            ),
            "{clamped:?}"
        );
        assert_eq!(
            clamped[0],
            "spec.limits.memory 4Gi clamped to the operator's maximum of 256Mi (--max-memory)"
        );
        let (run, clamped) = caps.apply(Resolved::default());
        assert_eq!(run, Resolved::default());
        assert!(clamped.is_empty());
    }

    #[test]
    fn a_spec_is_refused_below_a_minimum_or_with_a_bad_quantity() {
        let bad: ControllerLimits =
            serde_json::from_value(serde_json::json!({"timeoutMillis": 0})).unwrap();
        assert_eq!(
            bad.resolve().unwrap_err(),
            "spec.limits.timeoutMillis: must be at least 1"
        );
        let bad: ControllerLimits =
            serde_json::from_value(serde_json::json!({"memory": "lots"})).unwrap();
        assert!(
            bad.resolve()
                .unwrap_err()
                .starts_with("spec.limits.memory: ")
        );
    }

    #[test]
    fn the_flags_come_from_the_table_and_parse_into_caps() {
        use clap::{Args, FromArgMatches};
        let cmd = LimitCaps::augment_args(clap::Command::new("run"));
        let matches = cmd
            .try_get_matches_from(["run", "--max-memory", "64Mi", "--max-concurrency", "4"])
            .unwrap();
        let caps = LimitCaps::from_arg_matches(&matches).unwrap();
        assert_eq!(caps.memory_bytes(), 64 << 20);
        assert_eq!(caps.of("concurrency"), Some(4));
        assert_eq!(caps.of("actions"), Some(10_000), "a default from the table");
        let cmd = LimitCaps::augment_args(clap::Command::new("run"));
        let wrong = cmd
            .try_get_matches_from(["run", "--max-memory", "lots"])
            .unwrap();
        assert!(LimitCaps::from_arg_matches(&wrong).is_err());
    }

    #[test]
    fn the_readme_lists_every_limit_as_the_table_says() {
        let readme = include_str!("../../../docs/07-reference.md");
        for row in readme_rows() {
            assert!(
                readme.contains(&row),
                "docs/07-reference.md's limits table lacks (or differs from) this row; paste it:\n{row}"
            );
        }
    }
}
