//! PostgreSQL's input forms of dates, times, timestamps and intervals: what `'...'::date`,
//! `'...'::timestamptz` and `'...'::interval` accept (ISO 8601 with a space or `T`, minutes
//! without seconds, fractions, `Z` / `+02` / `+05:30` / zone names, `March 5, 2026`,
//! `1 day 02:03:04`, `1.5 hours`, `P1DT2H`, `@ 1 day ago`).
//!
//! Errors are PostgreSQL's: 22007 for text that is no date, 22008 for a field out of range.

use chrono::{Datelike, NaiveDate, NaiveDateTime, NaiveTime, TimeZone as _};
use eddy_common::{Error, Result, SqlState};

use super::text::{TimeZone, parse_time_zone};

pub const MICROS_PER_SECOND: i64 = 1_000_000;
pub const MICROS_PER_DAY: i64 = 86_400 * MICROS_PER_SECOND;

/// An interval as PostgreSQL keeps it: months, days and microseconds, each with its own sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Interval {
    pub months: i32,
    pub days: i32,
    pub micros: i64,
}

fn syntax(kind: &str, text: &str) -> Error {
    Error::new(
        SqlState::INVALID_DATETIME_FORMAT,
        format!("invalid input syntax for type {kind}: \"{text}\""),
    )
}

fn out_of_range(text: &str) -> Error {
    Error::new(
        SqlState::DATETIME_FIELD_OVERFLOW,
        format!("date/time field value out of range: \"{text}\""),
    )
}

/// The zone written after a timestamp: a fixed offset or a named zone.
#[derive(Debug, Clone, Copy)]
pub enum Zone {
    Offset(i32),
    Named(TimeZone),
}

/// A timestamp as written: local date and time, and the zone if one was given.
#[derive(Debug, Clone, Copy)]
pub struct WrittenTimestamp {
    pub local: NaiveDateTime,
    pub zone: Option<Zone>,
}

impl WrittenTimestamp {
    /// The UTC instant, taking a timestamp without a zone to be in `session` time.
    pub fn utc_micros(&self, session: TimeZone) -> Option<i64> {
        let zone = match self.zone {
            Some(Zone::Offset(seconds)) => {
                return Some(
                    self.local.and_utc().timestamp_micros()
                        - i64::from(seconds) * MICROS_PER_SECOND,
                );
            }
            Some(Zone::Named(zone)) => zone,
            None => session,
        };
        let local = match zone {
            TimeZone::Named(tz) => tz
                .from_local_datetime(&self.local)
                .earliest()
                .map(|t| t.naive_utc()),
            TimeZone::Fixed(fixed) => fixed
                .from_local_datetime(&self.local)
                .earliest()
                .map(|t| t.naive_utc()),
        };
        let utc = local.or_else(|| self.utc_after_gap(zone))?;
        Some(utc.and_utc().timestamp_micros())
    }

    /// A local time in a daylight-saving gap is read with the offset before the jump, as
    /// PostgreSQL does (02:30 on a spring-forward night is 03:30 of the new offset).
    fn utc_after_gap(&self, zone: TimeZone) -> Option<NaiveDateTime> {
        let later = self.local + chrono::Duration::hours(1);
        match zone {
            TimeZone::Named(tz) => tz
                .from_local_datetime(&later)
                .earliest()
                .map(|t| t.naive_utc()),
            TimeZone::Fixed(_) => None,
        }
    }
}

const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// The month a name or its abbreviation (three letters or more) stands for, 1-based.
fn month_named(word: &str) -> Option<u32> {
    let w = word.to_ascii_lowercase();
    if w.len() < 3 {
        return None;
    }
    let w = if w == "sept" { "sep".to_owned() } else { w };
    MONTHS
        .iter()
        .position(|m| m.starts_with(&w))
        .map(|i| i as u32 + 1)
}

fn number(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 9 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A calendar date from year, month and day; `None` when the fields are out of range.
fn ymd(year: i32, month: u32, day: u32) -> Option<NaiveDate> {
    NaiveDate::from_ymd_opt(year, month, day)
}

/// Splits a date's text into its fields: numbers and words, separators dropped.
fn date_fields(text: &str) -> Vec<&str> {
    text.split(['-', '/', ' ', ',', '.'])
        .filter(|f| !f.is_empty())
        .collect()
}

/// The date part of a date or timestamp. Accepts `2026-03-05`, `20260305`, `03/05/2026`
/// (month first, DateStyle MDY), `March 5, 2026`, `5 March 2026`, `2026-Mar-05`.
fn parse_date_part(text: &str, kind: &str, whole: &str) -> Result<NaiveDate> {
    let fields = date_fields(text);
    let bad = || syntax(kind, whole);
    let year_of = |s: &str| -> Result<i32> {
        let y = number(s).ok_or_else(bad)? as i32;
        // Two-digit years: PostgreSQL picks the year nearest 2020.
        Ok(if s.len() <= 2 {
            if y < 70 { 2000 + y } else { 1900 + y }
        } else {
            y
        })
    };
    let (year, month, day) = match fields.as_slice() {
        [compact] if compact.len() == 8 && number(compact).is_some() => (
            year_of(&compact[..4])?,
            number(&compact[4..6]).ok_or_else(bad)?,
            number(&compact[6..]).ok_or_else(bad)?,
        ),
        [a, b, c] => {
            if let Some(m) = month_named(a) {
                (year_of(c)?, m, number(b).ok_or_else(bad)?)
            } else if let Some(m) = month_named(b) {
                if a.len() >= 3 {
                    (year_of(a)?, m, number(c).ok_or_else(bad)?)
                } else {
                    (year_of(c)?, m, number(a).ok_or_else(bad)?)
                }
            } else if a.len() >= 3 {
                (
                    year_of(a)?,
                    number(b).ok_or_else(bad)?,
                    number(c).ok_or_else(bad)?,
                )
            } else {
                (
                    year_of(c)?,
                    number(a).ok_or_else(bad)?,
                    number(b).ok_or_else(bad)?,
                )
            }
        }
        _ => return Err(bad()),
    };
    ymd(year, month, day).ok_or_else(|| out_of_range(whole))
}

/// `HH:MM[:SS[.ffffff]]` with an optional `AM`/`PM`; hour 24 is allowed only as 24:00:00.
/// Returns microseconds since midnight (up to a whole day).
fn parse_time_part(text: &str, kind: &str, whole: &str) -> Result<i64> {
    let bad = || syntax(kind, whole);
    let lower = text.trim().to_ascii_lowercase();
    let (clock, meridiem) = match lower
        .strip_suffix("am")
        .or_else(|| lower.strip_suffix("a.m."))
    {
        Some(c) => (c.trim_end().to_owned(), Some(false)),
        None => match lower
            .strip_suffix("pm")
            .or_else(|| lower.strip_suffix("p.m."))
        {
            Some(c) => (c.trim_end().to_owned(), Some(true)),
            None => (lower.clone(), None),
        },
    };
    let mut parts = clock.split(':');
    let hour = parts.next().and_then(number).ok_or_else(bad)? as i64;
    let minute = parts.next().and_then(number).ok_or_else(bad)? as i64;
    let (second, micros) = match parts.next() {
        None => (0, 0),
        Some(s) => seconds_and_micros(s).ok_or_else(bad)?,
    };
    if parts.next().is_some() {
        return Err(bad());
    }
    let hour = match meridiem {
        Some(pm) if (1..=12).contains(&hour) => hour % 12 + if pm { 12 } else { 0 },
        Some(_) => return Err(out_of_range(whole)),
        None => hour,
    };
    if minute > 59
        || second > 60
        || hour > 24
        || (hour == 24 && (minute, second, micros) != (0, 0, 0))
    {
        return Err(out_of_range(whole));
    }
    Ok(((hour * 60 + minute) * 60 + second) * MICROS_PER_SECOND + micros)
}

/// `SS[.ffffff]`, the fraction rounded to microseconds.
fn seconds_and_micros(s: &str) -> Option<(i64, i64)> {
    let (whole, fraction) = s.split_once('.').unwrap_or((s, ""));
    let seconds = number(whole)? as i64;
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((seconds, fraction_micros(fraction)))
}

/// The digits after a decimal point as microseconds, rounded half up at the seventh digit.
fn fraction_micros(digits: &str) -> i64 {
    let mut padded: String = digits.chars().take(7).collect();
    while padded.len() < 7 {
        padded.push('0');
    }
    let seven: i64 = padded.parse().unwrap_or(0);
    (seven + 5) / 10
}

/// Splits a zone off the end of a timestamp: `Z`, `+02`, `-05:30`, `+0530`, ` UTC`,
/// ` Europe/Paris`. Returns the rest and the zone.
fn split_zone(text: &str) -> Result<(&str, Option<Zone>)> {
    let t = text.trim_end();
    if let Some(rest) = t.strip_suffix('Z').or_else(|| t.strip_suffix('z'))
        && rest.ends_with(|c: char| c.is_ascii_digit())
    {
        return Ok((rest, Some(Zone::Offset(0))));
    }
    // A sign after the time's digits starts an offset.
    if let Some(at) = t.rfind(['+', '-']) {
        let (head, offset) = t.split_at(at);
        let head_is_time = head.contains(':')
            || head.trim_end().ends_with(|c: char| c.is_ascii_digit()) && head.contains(' ');
        if head_is_time
            && offset.len() > 1
            && offset[1..].bytes().all(|b| b.is_ascii_digit() || b == b':')
        {
            let sign = if offset.starts_with('-') { -1 } else { 1 };
            let digits = &offset[1..];
            let (h, m, s) = match digits.split(':').collect::<Vec<_>>().as_slice() {
                [h] if h.len() == 4 => (number(&h[..2]), number(&h[2..]), Some(0)),
                [h] => (number(h), Some(0), Some(0)),
                [h, m] => (number(h), number(m), Some(0)),
                [h, m, s] => (number(h), number(m), number(s)),
                _ => (None, None, None),
            };
            let (Some(h), Some(m), Some(s)) = (h, m, s) else {
                return Ok((t, None));
            };
            if h > 15 || m > 59 || s > 59 {
                return Err(out_of_range(text));
            }
            return Ok((
                head.trim_end(),
                Some(Zone::Offset(sign * (h * 3600 + m * 60 + s) as i32)),
            ));
        }
    }
    if let Some((head, word)) = t.rsplit_once(' ')
        && word.starts_with(|c: char| c.is_ascii_alphabetic())
        && month_named(word).is_none()
        && !matches!(
            word.to_ascii_lowercase().as_str(),
            "am" | "pm" | "a.m." | "p.m."
        )
    {
        let zone = parse_time_zone(word).ok_or_else(|| {
            Error::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("time zone \"{word}\" not recognized"),
            )
        })?;
        return Ok((head.trim_end(), Some(Zone::Named(zone))));
    }
    Ok((t, None))
}

/// Words that stand for a date PostgreSQL computes from the clock, which a stored value or a
/// view must not depend on.
fn refuse_special(text: &str, kind: &str) -> Result<()> {
    let lower = text.trim().to_ascii_lowercase();
    if matches!(
        lower.as_str(),
        "now" | "today" | "tomorrow" | "yesterday" | "infinity" | "-infinity" | "+infinity"
    ) {
        return Err(Error::unsupported(format!(
            "{kind} input \"{}\" is not supported: write the value, or use now() / current_date",
            text.trim()
        )));
    }
    Ok(())
}

/// A `date` from text.
pub fn parse_date(text: &str) -> Result<NaiveDate> {
    refuse_special(text, "date")?;
    let t = text.trim();
    if t.eq_ignore_ascii_case("epoch") {
        return Ok(NaiveDate::default());
    }
    // A time after the date is accepted and ignored, as PostgreSQL does.
    let date_text = match t
        .find(['T', 't', ' '])
        .filter(|&i| t[..i].contains(['-', '/']) || i == 8)
    {
        Some(i) if t[i + 1..].contains(':') => &t[..i],
        _ => t,
    };
    parse_date_part(date_text, "date", t)
}

/// A `timestamp` or `timestamptz` from text, with its zone if one was written.
pub fn parse_timestamp(text: &str, kind: &str) -> Result<WrittenTimestamp> {
    refuse_special(text, kind)?;
    let t = text.trim();
    if t.eq_ignore_ascii_case("epoch") {
        return Ok(WrittenTimestamp {
            local: NaiveDateTime::default(),
            zone: Some(Zone::Offset(0)),
        });
    }
    let (rest, zone) = split_zone(t)?;
    // The time starts at the first field holding a colon; the date is everything before it.
    let (date_text, time_text) = match rest.find(':') {
        Some(colon) => {
            let start = rest[..colon].rfind([' ', 'T', 't']).map_or(0, |i| i + 1);
            (
                rest[..start].trim_end_matches(['T', 't', ' ']),
                &rest[start..],
            )
        }
        None => (rest, ""),
    };
    let date = parse_date_part(date_text, kind, t)?;
    let micros = if time_text.is_empty() {
        0
    } else {
        parse_time_part(time_text, kind, t)?
    };
    let local = date.and_time(NaiveTime::MIN) + chrono::Duration::microseconds(micros);
    Ok(WrittenTimestamp { local, zone })
}

/// A `time` from text: microseconds since midnight.
pub fn parse_time(text: &str) -> Result<i64> {
    let t = text.trim();
    let (rest, _) = split_zone(t)?;
    let micros = parse_time_part(rest, "time", t)?;
    Ok(micros)
}

/// The unit an interval field names, as (months, days, microseconds) per one of it.
fn interval_unit(word: &str) -> Option<(f64, f64, f64)> {
    let second = MICROS_PER_SECOND as f64;
    Some(match word.to_ascii_lowercase().as_str() {
        "microsecond" | "microseconds" | "us" | "usec" | "usecs" | "useconds" => (0.0, 0.0, 1.0),
        "millisecond" | "milliseconds" | "ms" | "msec" | "msecs" | "mseconds" => (0.0, 0.0, 1000.0),
        "second" | "seconds" | "s" | "sec" | "secs" => (0.0, 0.0, second),
        "minute" | "minutes" | "m" | "min" | "mins" => (0.0, 0.0, 60.0 * second),
        "hour" | "hours" | "h" | "hr" | "hrs" => (0.0, 0.0, 3600.0 * second),
        "day" | "days" | "d" => (0.0, 1.0, 0.0),
        "week" | "weeks" | "w" => (0.0, 7.0, 0.0),
        "month" | "months" | "mon" | "mons" => (1.0, 0.0, 0.0),
        "year" | "years" | "y" | "yr" | "yrs" => (12.0, 0.0, 0.0),
        "decade" | "decades" => (120.0, 0.0, 0.0),
        "century" | "centuries" => (1200.0, 0.0, 0.0),
        "millennium" | "millennia" | "millenniums" => (12000.0, 0.0, 0.0),
        _ => return None,
    })
}

/// Adds `amount` of a unit, cascading fractions down as PostgreSQL does: a fraction of a
/// month becomes days of 30, a fraction of a day becomes time of 24 hours.
fn add_amount(acc: &mut (f64, f64, f64), amount: f64, unit: (f64, f64, f64)) {
    let months = amount * unit.0;
    let whole_months = months.trunc();
    let days = amount * unit.1 + (months - whole_months) * 30.0;
    let whole_days = days.trunc();
    acc.0 += whole_months;
    acc.1 += whole_days;
    acc.2 += amount * unit.2 + (days - whole_days) * MICROS_PER_DAY as f64;
}

/// `[+-]HH:MM[:SS[.f]]` (or `MM:SS.f`) in an interval, as microseconds.
fn interval_clock(token: &str) -> Option<i64> {
    let (sign, body) = match token.as_bytes().first()? {
        b'-' => (-1, &token[1..]),
        b'+' => (1, &token[1..]),
        _ => (1, token),
    };
    let parts: Vec<&str> = body.split(':').collect();
    let micros = match parts.as_slice() {
        [m, s] if s.contains('.') => {
            let (secs, frac) = seconds_and_micros(s)?;
            (i64::from(number(m)?) * 60 + secs) * MICROS_PER_SECOND + frac
        }
        [h, m] => (i64::from(number(h)?) * 60 + i64::from(number(m)?)) * 60 * MICROS_PER_SECOND,
        [h, m, s] => {
            let (secs, frac) = seconds_and_micros(s)?;
            ((i64::from(number(h)?) * 60 + i64::from(number(m)?)) * 60 + secs) * MICROS_PER_SECOND
                + frac
        }
        _ => return None,
    };
    Some(sign * micros)
}

/// An `interval` from text: `1 day 02:03:04`, `1.5 hours`, `-1 mon +2 days`, `90 minutes`,
/// `@ 1 day ago`, `P1Y2M3DT4H5M6S`, a bare number of seconds.
pub fn parse_interval(text: &str) -> Result<Interval> {
    let t = text.trim();
    let bad = || syntax("interval", text);
    if let Some(iso) = t.strip_prefix('P').or_else(|| t.strip_prefix('p')) {
        return parse_iso_interval(iso).ok_or_else(bad);
    }
    let lower = t.to_ascii_lowercase();
    let body = lower.strip_prefix('@').unwrap_or(&lower).trim();
    let (body, ago) = match body.strip_suffix("ago") {
        Some(b) => (b.trim_end(), true),
        None => (body, false),
    };
    let mut acc = (0.0, 0.0, 0.0);
    let mut tokens = body.split_whitespace().peekable();
    let mut any = false;
    while let Some(token) = tokens.next() {
        any = true;
        if token.contains(':') {
            acc.2 += interval_clock(token).ok_or_else(bad)? as f64;
            continue;
        }
        // A number may be written apart from its unit (`1 day`) or against it (`1day`).
        let split = token
            .find(|c: char| c.is_ascii_alphabetic())
            .unwrap_or(token.len());
        let (number_text, attached) = token.split_at(split);
        let amount: f64 = number_text.parse().map_err(|_| bad())?;
        let unit_word = if attached.is_empty() {
            tokens.next_if(|w| interval_unit(w).is_some())
        } else {
            Some(attached)
        };
        match unit_word {
            Some(word) => add_amount(&mut acc, amount, interval_unit(word).ok_or_else(bad)?),
            // A bare number is seconds.
            None => add_amount(&mut acc, amount, (0.0, 0.0, MICROS_PER_SECOND as f64)),
        }
    }
    if !any {
        return Err(bad());
    }
    let sign = if ago { -1.0 } else { 1.0 };
    finish_interval(acc, sign).ok_or_else(|| {
        Error::new(
            SqlState::DATETIME_FIELD_OVERFLOW,
            format!("interval out of range: \"{text}\""),
        )
    })
}

fn finish_interval(acc: (f64, f64, f64), sign: f64) -> Option<Interval> {
    let months = (acc.0 * sign).round();
    let days = (acc.1 * sign).round();
    let micros = (acc.2 * sign).round();
    let fits = |v: f64, max: f64| v.is_finite() && v.abs() <= max;
    if !fits(months, f64::from(i32::MAX))
        || !fits(days, f64::from(i32::MAX))
        || !fits(micros, 9.2e18)
    {
        return None;
    }
    Some(Interval {
        months: months as i32,
        days: days as i32,
        micros: micros as i64,
    })
}

/// ISO 8601 durations after the `P`: `1Y2M3DT4H5M6.5S`, `T1H`, `2W`.
fn parse_iso_interval(text: &str) -> Option<Interval> {
    let mut acc = (0.0, 0.0, 0.0);
    let mut in_time = false;
    let mut number = String::new();
    for c in text.chars() {
        match c {
            'T' | 't' => in_time = true,
            '0'..='9' | '.' | '-' => number.push(c),
            unit => {
                let amount: f64 = number.parse().ok()?;
                number.clear();
                let second = MICROS_PER_SECOND as f64;
                let per = match (unit.to_ascii_uppercase(), in_time) {
                    ('Y', false) => (12.0, 0.0, 0.0),
                    ('M', false) => (1.0, 0.0, 0.0),
                    ('W', false) => (0.0, 7.0, 0.0),
                    ('D', false) => (0.0, 1.0, 0.0),
                    ('H', true) => (0.0, 0.0, 3600.0 * second),
                    ('M', true) => (0.0, 0.0, 60.0 * second),
                    ('S', true) => (0.0, 0.0, second),
                    _ => return None,
                };
                add_amount(&mut acc, amount, per);
            }
        }
    }
    if !number.is_empty() {
        return None;
    }
    finish_interval(acc, 1.0)
}

/// The day number of a date (days since 1970-01-01), as Arrow's Date32 holds it.
pub fn days_since_epoch(date: NaiveDate) -> i32 {
    date.num_days_from_ce() - NaiveDate::default().num_days_from_ce()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(text: &str) -> String {
        let w = parse_timestamp(text, "timestamp").unwrap();
        format!(
            "{} {:?}",
            w.local,
            w.zone.map(|z| match z {
                Zone::Offset(s) => s,
                Zone::Named(_) => 9999,
            })
        )
    }

    #[test]
    fn timestamps() {
        assert_eq!(ts("2026-03-01 12:00"), "2026-03-01 12:00:00 None");
        assert_eq!(ts("2026-03-01T12:00:00.5"), "2026-03-01 12:00:00.500 None");
        assert_eq!(ts("2026-03-01"), "2026-03-01 00:00:00 None");
        assert_eq!(ts("2026-03-01 12:00+02"), "2026-03-01 12:00:00 Some(7200)");
        assert_eq!(
            ts("2026-03-01 12:00:00-05:30"),
            "2026-03-01 12:00:00 Some(-19800)"
        );
        assert_eq!(ts("2026-03-01 12:00:00Z"), "2026-03-01 12:00:00 Some(0)");
        assert_eq!(
            ts("2026-03-01 12:00:00 UTC"),
            "2026-03-01 12:00:00 Some(9999)"
        );
        assert_eq!(ts("March 5, 2026 2:07 PM"), "2026-03-05 14:07:00 None");
        assert_eq!(ts("03/05/2026"), "2026-03-05 00:00:00 None");
        assert_eq!(ts("2026-03-01 24:00"), "2026-03-02 00:00:00 None");
        assert_eq!(
            parse_timestamp("2026-03-01 25:00", "timestamp")
                .unwrap_err()
                .state,
            SqlState::DATETIME_FIELD_OVERFLOW
        );
        assert_eq!(
            parse_timestamp("garbage", "timestamp").unwrap_err().state,
            SqlState::INVALID_DATETIME_FORMAT
        );
        assert_eq!(
            parse_date("2026-02-30").unwrap_err().state,
            SqlState::DATETIME_FIELD_OVERFLOW
        );
        assert_eq!(
            parse_date("20260305").unwrap(),
            NaiveDate::from_ymd_opt(2026, 3, 5).unwrap()
        );
    }

    #[test]
    fn intervals() {
        let iv = |t: &str| {
            let i = parse_interval(t).unwrap();
            (i.months, i.days, i.micros)
        };
        assert_eq!(iv("1 day 02:03:04"), (0, 1, 7_384_000_000));
        assert_eq!(iv("3 days 04:05:06.789"), (0, 3, 14_706_789_000));
        assert_eq!(iv("1.5 days"), (0, 1, 43_200_000_000));
        assert_eq!(iv("1.5 months"), (1, 15, 0));
        assert_eq!(iv("1 year 2 mons"), (14, 0, 0));
        assert_eq!(iv("-1 second"), (0, 0, -1_000_000));
        assert_eq!(iv("1 day -00:00:01"), (0, 1, -1_000_000));
        assert_eq!(iv("@ 1 day ago"), (0, -1, 0));
        assert_eq!(iv("90 minutes"), (0, 0, 5_400_000_000));
        assert_eq!(iv("P1Y2M3DT4H5M6S"), (14, 3, 14_706_000_000));
        assert_eq!(iv("5"), (0, 0, 5_000_000));
        assert_eq!(iv("1 week"), (0, 7, 0));
        assert!(parse_interval("abc").is_err());
    }
}
