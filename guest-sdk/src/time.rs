//! Wall-clock time as Kubernetes writes it: RFC 3339 in UTC, whole seconds.
//!
//! A guest may read the clock: the runtime's WASI context (no files, no env, no network)
//! keeps `wasi:clocks` at wasmtime's default, the host's clocks, so [`SystemTime::now`] works
//! inside the sandbox as on the host (checked with `kubewasm reconcile`). Reconciles stay repeatable as long as a time is only written when
//! something changed (see [`crate::conditions`]).
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use kubewasm_guest_sdk::time::rfc3339;
//!
//! let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_435_200);
//! assert_eq!(rfc3339(t), "2026-11-23T12:00:00Z");
//! ```

use std::time::SystemTime;

const SECS_PER_DAY: u64 = 86_400;

/// `t` as `YYYY-MM-DDThh:mm:ssZ` (UTC, fractions dropped), the format of `metav1.Time`; the
/// text order of two such times is their time order. Times before 1970 are written as
/// `1970-01-01T00:00:00Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (year, month, day) = civil_from_days(secs / SECS_PER_DAY);
    let of_day = secs % SECS_PER_DAY;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// The current time as [`rfc3339`] writes it. Not in guests built without WASI
/// (docs/03-writing-a-controller.md, "Guests without WASI"): they have no clock.
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
pub fn now() -> String {
    rfc3339(SystemTime::now())
}

/// The proleptic Gregorian date `days` days after 1970-01-01, as (year, month, day).
///
/// Howard Hinnant's `civil_from_days` (<https://howardhinnant.github.io/date_algorithms.html>)
/// for non-negative day counts: shift the epoch to 0000-03-01 so that the leap day ends each
/// 400-year era, then split the era into years and the year into months of March-based
/// lengths.
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = z / 146_097;
    let doe = z % 146_097; // day of era, [0, 146096]
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of March-based year, [0, 365]
    let mp = (5 * doy + 2) / 153; // March = 0, [0, 11]
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = era * 400 + yoe + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(secs: u64) -> String {
        rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
    }

    #[test]
    fn known_instants() {
        // Checked with `date -u -d @<secs> +%Y-%m-%dT%H:%M:%SZ`.
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_709_251_199), "2024-02-29T23:59:59Z");
        assert_eq!(at(4_107_542_400), "2100-03-01T00:00:00Z");
        assert_eq!(at(253_402_300_799), "9999-12-31T23:59:59Z");
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH + Duration::from_millis(1_999)),
            "1970-01-01T00:00:01Z",
            "fractions are dropped, not rounded"
        );
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH - Duration::from_secs(1)),
            "1970-01-01T00:00:00Z"
        );
    }

    /// Every day of 1970..2500 against a plain day-by-day calendar walk.
    #[test]
    fn every_day_matches_a_calendar_walk() {
        let leap =
            |y: u64| (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
        let (mut year, mut month, mut day) = (1970, 1, 1);
        for days in 0..193_000 {
            assert_eq!(civil_from_days(days), (year, month, day), "day {days}");
            let length = match month {
                2 if leap(year) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            day += 1;
            if day > length {
                (day, month) = (1, month + 1);
                if month > 12 {
                    (month, year) = (1, year + 1);
                }
            }
        }
    }

    #[test]
    fn text_order_is_time_order() {
        let times = [0, 59, 3_600, 86_399, 86_400, 951_782_400, 4_107_542_400];
        let texts: Vec<String> = times.iter().map(|&s| at(s)).collect();
        assert!(texts.windows(2).all(|w| w[0] < w[1]), "{texts:?}");
    }
}
