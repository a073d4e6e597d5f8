//! PostgreSQL's text forms of values: what its output functions print (`t`, `1.5`, `1e+100`,
//! `2026-03-01 00:00:00+00`, `1 year 2 mons`, `\x0102`, `{1,2}`).
//!
//! The one place Eddy turns a value into PostgreSQL text: the wire encoding (server) and casts to
//! text inside queries and views ([`crate::pg::cast`]) both call [`text_value`], so `x::text`
//! and the value sent to the client always agree.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type,
    Int64Type, IntervalMonthDayNanoType, IntervalUnit, Time64MicrosecondType, TimeUnit, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use chrono::{DateTime, NaiveDate, NaiveDateTime, Offset, TimeZone as _, Timelike};
use eddy_common::{Error, Result};

/// A session time zone: an IANA name (`Europe/Paris`) or a fixed offset (`+02:00`, `-5`).
#[derive(Debug, Clone, Copy)]
pub enum TimeZone {
    Named(chrono_tz::Tz),
    Fixed(chrono::FixedOffset),
}

impl TimeZone {
    pub const UTC: TimeZone = TimeZone::Named(chrono_tz::UTC);

    /// The offset from UTC (seconds east) and the zone's abbreviation at the UTC instant `utc`.
    pub fn offset_at(self, utc: &NaiveDateTime) -> (i32, String) {
        match self {
            TimeZone::Named(zone) => {
                let t = zone.from_utc_datetime(utc);
                let abbreviation = t.format("%Z").to_string();
                (t.offset().fix().local_minus_utc(), abbreviation)
            }
            TimeZone::Fixed(fixed) => (
                fixed.local_minus_utc(),
                offset_text(fixed.local_minus_utc()),
            ),
        }
    }

    /// The zone a session's `datafusion.execution.time_zone` names (UTC when unset or unknown).
    pub fn from_config(value: Option<&str>) -> TimeZone {
        value.and_then(parse_time_zone).unwrap_or(TimeZone::UTC)
    }
}

pub fn parse_time_zone(value: &str) -> Option<TimeZone> {
    if value.eq_ignore_ascii_case("utc") || value.eq_ignore_ascii_case("z") {
        return Some(TimeZone::UTC);
    }
    if let Ok(tz) = value.parse::<chrono_tz::Tz>() {
        return Some(TimeZone::Named(tz));
    }
    let (sign, rest) = match value.as_bytes().first()? {
        b'+' => (1, &value[1..]),
        b'-' => (-1, &value[1..]),
        _ => return None,
    };
    let mut parts = rest.split(':');
    let hours: i32 = parts.next()?.parse().ok()?;
    let minutes: i32 = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    if hours > 15 || minutes > 59 {
        return None;
    }
    chrono::FixedOffset::east_opt(sign * (hours * 3600 + minutes * 60)).map(TimeZone::Fixed)
}

/// How a value becomes text: PostgreSQL's output functions differ from its casts to text in
/// one place only, booleans (`t` on the wire and in `'a' || true`, `true` from `true::text`).
#[derive(Debug, Clone, Copy)]
pub struct TextOptions {
    pub time_zone: TimeZone,
    /// An unconstrained `numeric`: Arrow keeps a fixed scale (10), PostgreSQL prints the
    /// digits the value has, so trailing zeros go.
    pub trim_numeric: bool,
    /// `true`/`false` (a cast to text) rather than `t`/`f` (the output function).
    pub bool_words: bool,
    /// A `character(n)`: Eddy keeps its values without trailing blanks (so comparisons and
    /// `length` ignore them, as PostgreSQL's do) and pads them to n where they are shown.
    pub blank_pad: Option<usize>,
    /// An `int2vector` or `oidvector` (`pg_index.indkey`): its elements separated by spaces,
    /// without braces.
    pub vector: bool,
}

impl TextOptions {
    pub fn output(time_zone: TimeZone) -> Self {
        TextOptions {
            time_zone,
            trim_numeric: false,
            bool_words: false,
            blank_pad: None,
            vector: false,
        }
    }

    /// The output form of a column's values: what the wire and COPY send.
    pub fn output_of(field: &arrow::datatypes::Field, time_zone: TimeZone) -> Self {
        let declared = field.metadata().get(crate::types::PG_TYPE_KEY);
        let blank_pad = declared.and_then(|t| {
            t.strip_prefix("character(")?
                .strip_suffix(')')?
                .parse()
                .ok()
        });
        TextOptions {
            trim_numeric: is_unconstrained_numeric(field),
            blank_pad,
            vector: declared.is_some_and(|t| t == "int2vector" || t == "oidvector"),
            ..TextOptions::output(time_zone)
        }
    }
}

/// Whether a column holds unconstrained `numeric`s, which print without Arrow's trailing zeros:
/// declared so (its PostgreSQL type is `numeric`), or computed from them (no declared type and
/// at least the unconstrained scale, 10: sums, products and remainders of them keep it or more).
pub fn is_unconstrained_numeric(field: &arrow::datatypes::Field) -> bool {
    match field.metadata().get(crate::types::PG_TYPE_KEY) {
        Some(declared) => declared == "numeric" || declared == "numeric[]",
        None => match field.data_type() {
            DataType::Decimal128(_, s) => *s >= crate::types::NUMERIC_DEFAULT_SCALE,
            DataType::List(element) | DataType::LargeList(element) => {
                is_unconstrained_numeric(element)
            }
            _ => false,
        },
    }
}

/// A computed numeric whose scale is its digits (a quotient, an average): printed with all of
/// them, as PostgreSQL prints such results, even where its scale would pass for unconstrained.
pub fn numeric_field_at_scale(scale: i8) -> arrow::datatypes::Field {
    arrow::datatypes::Field::new("", DataType::Decimal128(38, scale), true).with_metadata(
        [(
            crate::types::PG_TYPE_KEY.to_owned(),
            format!("numeric(38,{scale})"),
        )]
        .into(),
    )
}

/// Whether row `i` is NULL (a `Null`-typed column has no validity buffer: every row is).
pub fn is_null(column: &dyn Array, i: usize) -> bool {
    column.is_null(i) || column.data_type() == &DataType::Null
}

fn unsupported_type(dt: &DataType) -> Error {
    Error::unsupported(format!("values of type {dt} cannot be shown as text yet"))
}

/// PostgreSQL's text form of the (non-NULL) value at row `i`.
pub fn text_value(column: &ArrayRef, i: usize, options: TextOptions) -> Result<String> {
    let s = match column.data_type() {
        DataType::Boolean => {
            let v = column.as_boolean().value(i);
            (match (v, options.bool_words) {
                (true, true) => "true",
                (false, true) => "false",
                (true, false) => "t",
                (false, false) => "f",
            })
            .to_owned()
        }
        DataType::Int8 => column.as_primitive::<Int8Type>().value(i).to_string(),
        DataType::Int16 => column.as_primitive::<Int16Type>().value(i).to_string(),
        DataType::Int32 => column.as_primitive::<Int32Type>().value(i).to_string(),
        DataType::Int64 => column.as_primitive::<Int64Type>().value(i).to_string(),
        DataType::UInt8 => column.as_primitive::<UInt8Type>().value(i).to_string(),
        DataType::UInt16 => column.as_primitive::<UInt16Type>().value(i).to_string(),
        DataType::UInt32 => column.as_primitive::<UInt32Type>().value(i).to_string(),
        DataType::UInt64 => column.as_primitive::<UInt64Type>().value(i).to_string(),
        DataType::Float32 => float_text(
            f64::from(column.as_primitive::<Float32Type>().value(i)),
            true,
        ),
        DataType::Float64 => float_text(column.as_primitive::<Float64Type>().value(i), false),
        DataType::Decimal128(_, scale) => {
            let text = decimal_text(column.as_primitive::<Decimal128Type>().value(i), *scale);
            if options.trim_numeric {
                trim_decimal(text)
            } else {
                text
            }
        }
        DataType::Utf8 => match options.blank_pad {
            Some(n) => format!("{:<n$}", column.as_string::<i32>().value(i)),
            None => column.as_string::<i32>().value(i).to_owned(),
        },
        DataType::LargeUtf8 => column.as_string::<i64>().value(i).to_owned(),
        DataType::Utf8View => column.as_string_view().value(i).to_owned(),
        DataType::Binary => bytea_text(column.as_binary::<i32>().value(i)),
        DataType::LargeBinary => bytea_text(column.as_binary::<i64>().value(i)),
        DataType::BinaryView => bytea_text(column.as_binary_view().value(i)),
        DataType::Date32 => date_text(column.as_primitive::<Date32Type>().value(i)),
        DataType::Time64(TimeUnit::Microsecond) => {
            time_text(column.as_primitive::<Time64MicrosecondType>().value(i))
        }
        DataType::Timestamp(unit, zone) => {
            let us = timestamp_us(column, i, *unit);
            if zone.is_some() {
                timestamptz_text(us, options.time_zone)
            } else {
                timestamp_text(us)
            }
        }
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            let v = column.as_primitive::<IntervalMonthDayNanoType>().value(i);
            interval_text(v.months, v.days, v.nanoseconds / 1000)
        }
        DataType::List(_)
        | DataType::LargeList(_)
        | DataType::FixedSizeList(..)
        | DataType::ListView(_) => array_text(column, i, options)?,
        DataType::Null => String::new(),
        other => {
            // Other units and widths: converted to a type rendered above.
            let target = match other {
                DataType::Date64 => DataType::Date32,
                DataType::Time32(_) | DataType::Time64(_) => {
                    DataType::Time64(TimeUnit::Microsecond)
                }
                DataType::Interval(_) | DataType::Duration(_) => {
                    DataType::Interval(IntervalUnit::MonthDayNano)
                }
                DataType::Float16 => DataType::Float32,
                DataType::Decimal32(p, s) | DataType::Decimal64(p, s) => {
                    DataType::Decimal128(*p, *s)
                }
                DataType::Decimal256(p, s) if *p <= 38 => DataType::Decimal128(*p, *s),
                DataType::Dictionary(_, value) => value.as_ref().clone(),
                _ => {
                    return arrow::util::display::array_value_to_string(column, i)
                        .map_err(|_| unsupported_type(other));
                }
            };
            let one = column.slice(i, 1);
            let cast = arrow::compute::cast(&one, &target).map_err(|_| unsupported_type(other))?;
            return text_value(&cast, 0, options);
        }
    };
    Ok(s)
}

/// `{1,2,NULL}`, `{"a b",c}`: elements in their text forms, quoted where PostgreSQL quotes them.
fn array_text(column: &ArrayRef, i: usize, options: TextOptions) -> Result<String> {
    let values = match column.data_type() {
        DataType::List(_) => column.as_list::<i32>().value(i),
        DataType::LargeList(_) => column.as_list::<i64>().value(i),
        DataType::FixedSizeList(..) => column.as_fixed_size_list().value(i),
        other => return Err(unsupported_type(other)),
    };
    if options.vector {
        let mut out = String::new();
        for k in 0..values.len() {
            if k > 0 {
                out.push(' ');
            }
            out.push_str(&text_value(
                &values,
                k,
                TextOptions {
                    vector: false,
                    ..options
                },
            )?);
        }
        return Ok(out);
    }
    let mut out = String::from("{");
    for k in 0..values.len() {
        if k > 0 {
            out.push(',');
        }
        if is_null(&values, k) {
            out.push_str("NULL");
            continue;
        }
        let element = text_value(&values, k, options)?;
        let quote = element.is_empty()
            || element.eq_ignore_ascii_case("null")
            || element
                .chars()
                .any(|c| matches!(c, '{' | '}' | ',' | '"' | '\\') || c.is_whitespace());
        if quote
            && !matches!(
                values.data_type(),
                DataType::List(_) | DataType::LargeList(_)
            )
        {
            out.push('"');
            for c in element.chars() {
                if c == '"' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
            out.push('"');
        } else {
            out.push_str(&element);
        }
    }
    out.push('}');
    Ok(out)
}

/// The value at row `i` of a timestamp column, in microseconds since 1970 (UTC for timestamptz).
pub fn timestamp_us(column: &ArrayRef, i: usize, unit: TimeUnit) -> i64 {
    use arrow::datatypes::{
        TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
        TimestampSecondType,
    };
    match unit {
        TimeUnit::Second => column
            .as_primitive::<TimestampSecondType>()
            .value(i)
            .saturating_mul(1_000_000),
        TimeUnit::Millisecond => column
            .as_primitive::<TimestampMillisecondType>()
            .value(i)
            .saturating_mul(1000),
        TimeUnit::Microsecond => column.as_primitive::<TimestampMicrosecondType>().value(i),
        TimeUnit::Nanosecond => column
            .as_primitive::<TimestampNanosecondType>()
            .value(i)
            .div_euclid(1000),
    }
}

/// Shortest round-trip digits, in PostgreSQL's notation (`1e+100`, `1.5e-05`, `Infinity`, `-0`).
pub fn float_text(v: f64, single: bool) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    // PostgreSQL switches to exponent form when the exponent is below -4 or at least the
    // type's precision (15 digits for double, 6 for real), as printf's %g does.
    let s = if single {
        format!("{:e}", v as f32)
    } else {
        format!("{v:e}")
    };
    let Some((mantissa, exp)) = s.split_once('e') else {
        return s;
    };
    let exponent: i32 = exp.parse().unwrap_or(0);
    let precision = if single { 6 } else { 15 };
    if v != 0.0 && (exponent < -4 || exponent >= precision) {
        let (sign, magnitude) = if exponent < 0 {
            ('-', -exponent)
        } else {
            ('+', exponent)
        };
        return format!("{mantissa}e{sign}{magnitude:02}");
    }
    if single {
        format!("{}", v as f32)
    } else {
        format!("{v}")
    }
}

/// A decimal's digits with its scale: `decimal_text(12345, 2)` is `123.45`.
pub fn decimal_text(value: i128, scale: i8) -> String {
    let negative = value < 0;
    let digits = value.unsigned_abs().to_string();
    let body = if scale < 0 {
        format!("{digits}{}", "0".repeat(scale.unsigned_abs() as usize))
    } else {
        let scale = scale as usize;
        if scale == 0 {
            digits
        } else if digits.len() > scale {
            format!(
                "{}.{}",
                &digits[..digits.len() - scale],
                &digits[digits.len() - scale..]
            )
        } else {
            format!("0.{}{}", "0".repeat(scale - digits.len()), digits)
        }
    };
    if negative && value != 0 {
        format!("-{body}")
    } else {
        body
    }
}

/// Drops trailing fractional zeros (and the point): `1.5000` is `1.5`, `2.000` is `2`.
pub fn trim_decimal(text: String) -> String {
    if !text.contains('.') {
        return text;
    }
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

pub fn bytea_text(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(2 + bytes.len() * 2);
    s.push_str("\\x");
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

pub fn date_from_days(days: i32) -> Option<NaiveDate> {
    NaiveDate::from_ymd_opt(1970, 1, 1)?.checked_add_signed(chrono::Duration::days(i64::from(days)))
}

pub fn date_text(days: i32) -> String {
    date_from_days(days).map_or_else(|| days.to_string(), |d| d.format("%Y-%m-%d").to_string())
}

/// `.5`, `.123456`: the fraction of a second with trailing zeros dropped, empty when whole.
fn fraction(us: u32) -> String {
    if us == 0 {
        String::new()
    } else {
        format!(".{us:06}").trim_end_matches('0').to_owned()
    }
}

pub fn time_text(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000) as u32;
    format!(
        "{:02}:{:02}:{:02}{}",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60,
        fraction(micros)
    )
}

pub fn naive_from_us(us: i64) -> Option<NaiveDateTime> {
    DateTime::from_timestamp_micros(us).map(|d| d.naive_utc())
}

pub fn timestamp_text(us: i64) -> String {
    match naive_from_us(us) {
        Some(t) => format!(
            "{}{}",
            t.format("%Y-%m-%d %H:%M:%S"),
            fraction(t.nanosecond() / 1000)
        ),
        None => us.to_string(),
    }
}

/// `+00`, `+05:30`, `-03:30:15`: an offset from UTC as PostgreSQL prints it.
pub fn offset_text(seconds: i32) -> String {
    let sign = if seconds < 0 { '-' } else { '+' };
    let s = seconds.abs();
    let (h, m, sec) = (s / 3600, (s / 60) % 60, s % 60);
    match (m, sec) {
        (0, 0) => format!("{sign}{h:02}"),
        (_, 0) => format!("{sign}{h:02}:{m:02}"),
        _ => format!("{sign}{h:02}:{m:02}:{sec:02}"),
    }
}

/// The local time of a UTC instant in a zone, with the zone's offset (seconds east of UTC).
pub fn local_time(us: i64, tz: TimeZone) -> Option<(NaiveDateTime, i32)> {
    let utc = naive_from_us(us)?;
    let (offset, _) = tz.offset_at(&utc);
    Some((utc + chrono::Duration::seconds(i64::from(offset)), offset))
}

/// A timestamptz rendered in the session's time zone with its offset, as PostgreSQL does.
pub fn timestamptz_text(us: i64, tz: TimeZone) -> String {
    let Some((local, offset)) = local_time(us, tz) else {
        return us.to_string();
    };
    format!(
        "{}{}{}",
        local.format("%Y-%m-%d %H:%M:%S"),
        fraction(local.nanosecond() / 1000),
        offset_text(offset)
    )
}

/// PostgreSQL's `postgres` IntervalStyle: `1 year 2 mons 3 days 04:05:06.5`, `-1 days -00:00:01`.
pub fn interval_text(months: i32, days: i32, us: i64) -> String {
    let mut parts = Vec::new();
    let (years, mons) = (months / 12, months % 12);
    let plural = |n: i64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    if years != 0 {
        parts.push(plural(i64::from(years), "year", "years"));
    }
    if mons != 0 {
        parts.push(plural(i64::from(mons), "mon", "mons"));
    }
    if days != 0 {
        parts.push(plural(i64::from(days), "day", "days"));
    }
    if us != 0 || parts.is_empty() {
        // The time part carries its own sign when it is negative, or when an earlier field
        // was negative and this one is not ("-1 days +00:00:01"), as PostgreSQL prints it.
        let earlier_negative = months < 0 || days < 0;
        let sign = if us < 0 {
            "-"
        } else if earlier_negative && us > 0 {
            "+"
        } else {
            ""
        };
        let abs = us.unsigned_abs();
        let secs = abs / 1_000_000;
        let micros = (abs % 1_000_000) as u32;
        parts.push(format!(
            "{sign}{:02}:{:02}:{:02}{}",
            secs / 3600,
            (secs / 60) % 60,
            secs % 60,
            fraction(micros)
        ));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_render_like_postgres() {
        assert_eq!(float_text(1.0, false), "1");
        assert_eq!(float_text(1024.0, false), "1024");
        assert_eq!(float_text(0.1, false), "0.1");
        assert_eq!(float_text(1e100, false), "1e+100");
        assert_eq!(float_text(1e15, false), "1e+15");
        assert_eq!(
            float_text(123456789012345680.0, false),
            "1.2345678901234568e+17"
        );
        assert_eq!(float_text(1.5e10, false), "15000000000");
        assert_eq!(float_text(1.5e-5, false), "1.5e-05");
        assert_eq!(float_text(0.0001, false), "0.0001");
        assert_eq!(float_text(-0.0, false), "-0");
        assert_eq!(float_text(f64::NAN, false), "NaN");
        assert_eq!(float_text(f64::from(0.1f32), true), "0.1");
        assert_eq!(float_text(1e10, true), "1e+10");
    }

    #[test]
    fn decimals_and_intervals() {
        assert_eq!(decimal_text(12345, 2), "123.45");
        assert_eq!(decimal_text(-5, 3), "-0.005");
        assert_eq!(trim_decimal(decimal_text(15_000_000_000, 10)), "1.5");
        assert_eq!(
            interval_text(14, 3, 3_723_500_000),
            "1 year 2 mons 3 days 01:02:03.5"
        );
        assert_eq!(interval_text(0, 0, 0), "00:00:00");
        assert_eq!(interval_text(0, -1, 0), "-1 days");
        assert_eq!(interval_text(0, -1, -1_000_000), "-1 days -00:00:01");
        assert_eq!(interval_text(0, 1, -1_000_000), "1 day -00:00:01");
        assert_eq!(interval_text(0, -1, 1_000_000), "-1 days +00:00:01");
    }

    #[test]
    fn timestamptz_in_session_zone() {
        let us = 1_700_000_000_000_000;
        assert_eq!(
            timestamptz_text(us, TimeZone::UTC),
            "2023-11-14 22:13:20+00"
        );
        assert_eq!(
            timestamptz_text(us, TimeZone::Named(chrono_tz::Asia::Kolkata)),
            "2023-11-15 03:43:20+05:30"
        );
    }
}
