//! RFC 3339 timestamps in UTC with microseconds, without a date library.

use std::time::{SystemTime, UNIX_EPOCH};

/// The current time, e.g. `2026-11-30T08:21:26.967279Z`.
pub fn now_rfc3339() -> String {
    let (secs, micros) = match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_micros(),
        ),
        // A clock before 1970: count backwards so the output stays well formed.
        Err(e) => {
            let d = e.duration();
            let mut secs = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            let mut micros = d.subsec_micros();
            if micros > 0 {
                secs -= 1;
                micros = 1_000_000 - micros;
            }
            (secs, micros)
        }
    };
    format_rfc3339(secs, micros)
}

/// Formats seconds since the Unix epoch plus microseconds (`< 1_000_000`) as
/// `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
pub fn format_rfc3339(unix_secs: i64, micros: u32) -> String {
    let days = unix_secs.div_euclid(86_400);
    let rem = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        micros.min(999_999)
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day)
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(format_rfc3339(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            format_rfc3339(951_782_400, 5),
            "2000-02-29T00:00:00.000005Z"
        );
        assert_eq!(
            format_rfc3339(1_796_026_886, 967_279),
            "2026-11-30T08:21:26.967279Z"
        );
        assert_eq!(
            format_rfc3339(4_102_444_799, 999_999),
            "2099-12-31T23:59:59.999999Z"
        );
        assert_eq!(format_rfc3339(-1, 0), "1969-12-31T23:59:59.000000Z");
    }

    #[test]
    fn every_day_round_trips() {
        // Walk 1970..2100 day by day and check the calendar never skips or repeats.
        let mut prev = civil_from_days(-1);
        for day in 0..47_482 {
            let cur = civil_from_days(day);
            let next_in_month = (prev.0, prev.1, prev.2 + 1);
            let next_month = if prev.1 == 12 {
                (prev.0 + 1, 1, 1)
            } else {
                (prev.0, prev.1 + 1, 1)
            };
            assert!(
                cur == next_in_month || cur == next_month,
                "{prev:?} -> {cur:?}"
            );
            prev = cur;
        }
    }
}
