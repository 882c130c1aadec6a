//! Times as people read them (pure): the server's RFC 3339 UTC times
//! (`2026-12-01T17:12:41.123Z`, what `lap-server` writes) to milliseconds since the epoch, and
//! an age such as `4m ago`.

/// Milliseconds since the Unix epoch of `YYYY-MM-DDTHH:MM:SS[.fff]Z`; `None` for anything else
/// (offsets other than `Z` included: the server only writes UTC).
pub(crate) fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-');
    let (y, m, day): (i64, i64, i64) = (
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
        d.next()?.parse().ok()?,
    );
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':');
    let (hh, mm, ss): (i64, i64, i64) = (
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
        t.next()?.parse().ok()?,
    );
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let millis: i64 = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().chain("000".chars()).take(3).collect();
        digits.parse().ok()?
    };
    let days = days_from_civil(y, m, day);
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1000) + millis)
}

/// Howard Hinnant's civil-to-days algorithm (days since 1970-01-01).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// How long before `now_ms` `then_ms` was: `just now`, `42s ago`, `5m ago`, `3h ago`, `2d ago`
/// (a time in the future, from clock skew, reads `just now`).
pub(crate) fn ago(then_ms: i64, now_ms: i64) -> String {
    let secs = (now_ms - then_ms) / 1000;
    match secs {
        s if s < 1 => "just now".to_owned(),
        s if s < 60 => format!("{s}s ago"),
        s if s < 3600 => format!("{}m ago", s / 60),
        s if s < 86_400 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86_400),
    }
}

/// [`ago`] of a server time, or the text itself when it does not parse (`-` for none).
pub(crate) fn ago_text(rfc3339: Option<&str>, now_ms: i64) -> String {
    match rfc3339 {
        None => "-".to_owned(),
        Some(t) => parse_rfc3339_ms(t).map_or_else(|| t.to_owned(), |ms| ago(ms, now_ms)),
    }
}

/// Now, in milliseconds since the epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_times_parse() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(parse_rfc3339_ms("2000-03-01T00:00:00.5Z"), Some(951_868_800_500));
        // 2026-12-01T17:12:41.123Z, checked with `date -u -d … +%s`.
        assert_eq!(parse_rfc3339_ms("2026-12-01T17:12:41.123Z"), Some(1_796_145_161_123));
        for bad in [
            "",
            "2026-12-01",
            "2026-12-01T17:12:41+01:00",
            "2026-13-01T00:00:00Z",
            "x-y-zTa:b:cZ",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn ages_read_naturally() {
        let now = 10_000_000_000;
        assert_eq!(ago(now, now), "just now");
        assert_eq!(ago(now + 5000, now), "just now");
        assert_eq!(ago(now - 42_000, now), "42s ago");
        assert_eq!(ago(now - 5 * 60_000 - 1, now), "5m ago");
        assert_eq!(ago(now - 3 * 3_600_000, now), "3h ago");
        assert_eq!(ago(now - 2 * 86_400_000, now), "2d ago");
        assert_eq!(ago_text(None, now), "-");
        assert_eq!(ago_text(Some("soon"), now), "soon");
    }
}
