//! `to_char` with PostgreSQL's templates, for timestamps, timestamptz (in the session's zone),
//! dates, intervals and numbers ([`super::to_char_numeric`]). Replaces DataFusion's `to_char`,
//! which expects chrono patterns and echoes PostgreSQL's back.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use arrow::datatypes::{
    DataType, IntervalMonthDayNanoType, IntervalUnit, TimeUnit, TimestampMicrosecondType,
};
use chrono::{Datelike, NaiveDateTime, Timelike};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, Signature};
use eddy_common::SqlState;

use super::cast::session_zone;
use super::datetime_in::MICROS_PER_SECOND;
use super::template::{self, DAY_NAMES, MONTH_NAMES, Node, ROMAN_MONTHS, cased, ordinal_suffix};
use super::text::{local_time, naive_from_us, offset_text};
use super::udf::{IMMUTABLE, PgFunction, Result, arrays, error, no_such_function};

/// The fields a template reads, from a date-time or an interval.
#[derive(Debug, Clone, Default)]
pub struct Fields {
    pub year: i64,
    /// 1-12 for dates; for intervals the months past whole years (0-11).
    pub month: i64,
    pub day: i64,
    /// 0-23 for dates; for intervals every whole hour of the time part.
    pub hour: i64,
    pub minute: i64,
    pub second: i64,
    pub micros: i64,
    pub day_of_year: i64,
    /// 0 = Sunday.
    pub weekday: i64,
    pub iso_year: i64,
    pub iso_week: i64,
    pub julian: i64,
    /// Seconds east of UTC and the zone's abbreviation, for timestamptz.
    pub zone: Option<(i32, String)>,
    pub interval: bool,
}

impl Fields {
    pub fn from_datetime(t: NaiveDateTime, zone: Option<(i32, String)>) -> Fields {
        let iso = t.iso_week();
        Fields {
            year: i64::from(t.year()),
            month: i64::from(t.month()),
            day: i64::from(t.day()),
            hour: i64::from(t.hour()),
            minute: i64::from(t.minute()),
            second: i64::from(t.second()),
            micros: i64::from(t.nanosecond() / 1000),
            day_of_year: i64::from(t.ordinal()),
            weekday: i64::from(t.weekday().num_days_from_sunday()),
            iso_year: i64::from(iso.year()),
            iso_week: i64::from(iso.week()),
            julian: i64::from(t.date().num_days_from_ce()) + 1_721_425,
            zone,
            interval: false,
        }
    }

    /// An interval's fields, and the calendar fields PostgreSQL derives from them as if they
    /// were a date (`DDD` approximates the span in days; `J`, `IW`, `IYYY` read the fields as
    /// year, month and day).
    pub fn from_interval(months: i32, days: i32, micros: i64) -> Fields {
        let seconds = micros / MICROS_PER_SECOND;
        let (year, month, day) = (
            i64::from(months / 12),
            i64::from(months % 12),
            i64::from(days),
        );
        let julian = julian_day(year, month, day);
        let as_date = chrono::NaiveDate::from_num_days_from_ce_opt(
            i32::try_from(julian - 1_721_425).unwrap_or(1),
        );
        let (iso_year, iso_week, weekday) = as_date.map_or((0, 0, 0), |d| {
            (
                i64::from(d.iso_week().year()),
                i64::from(d.iso_week().week()),
                i64::from(d.weekday().num_days_from_sunday()),
            )
        });
        Fields {
            year,
            month,
            day,
            hour: seconds / 3600,
            minute: seconds / 60 % 60,
            second: seconds % 60,
            micros: micros % MICROS_PER_SECOND,
            day_of_year: (year * 12 + month) * 30 + day,
            weekday,
            iso_year,
            iso_week,
            julian,
            zone: None,
            interval: true,
        }
    }
}

/// PostgreSQL's date2j: the Julian day of year, month and day, for any integers.
fn julian_day(year: i64, month: i64, day: i64) -> i64 {
    let (y, m) = if month > 2 {
        (year + 4800, month + 1)
    } else {
        (year + 4799, month + 13)
    };
    let century = y / 100;
    y * 365 - 32167 + y / 4 - century + century / 4 + 7834 * m / 256 + day
}

fn not_for_interval() -> datafusion::common::DataFusionError {
    error(
        SqlState::INVALID_DATETIME_FORMAT,
        "invalid format specification for an interval value",
    )
}

/// A number zero-padded to `width` (unless in fill mode), with the ordinal suffix if asked.
fn number(value: i64, width: usize, fill_mode: bool, ordinal: Option<bool>) -> String {
    // printf's "%0*d": a negative value's sign takes one of the places.
    let mut s = if fill_mode {
        value.to_string()
    } else {
        format!("{value:0width$}")
    };
    if let Some(upper) = ordinal {
        let suffix = ordinal_suffix(&s, upper);
        s.push_str(suffix);
    }
    s
}

/// A name padded with blanks to `width` unless in fill mode.
fn name(text: String, width: usize, fill_mode: bool) -> String {
    if fill_mode {
        text
    } else {
        format!("{text:<width$}")
    }
}

/// ISO 8601 day of the year: days since the Monday of ISO week 1.
fn iso_day_of_year(f: &Fields) -> i64 {
    (f.iso_week - 1) * 7 + (f.weekday + 6) % 7 + 1
}

/// Renders a time-of-day keyword (`HH24`, `MI`, `US`, `AM`, ...); `None` for the others.
fn clock_keyword(
    f: &Fields,
    keyword: &'static str,
    fill_mode: bool,
    ordinal: Option<bool>,
) -> Option<String> {
    let n = |v: i64, width: usize| Some(number(v, width, fill_mode, ordinal));
    // Clock fields of a negative interval get one more place for the sign, as PostgreSQL's.
    let clock = |v: i64| Some(number(v, if v < 0 { 3 } else { 2 }, fill_mode, ordinal));
    let pm = f.hour % 24 >= 12;
    match keyword {
        "HH" | "HH12" | "hh" | "hh12" => clock(if f.hour % 12 == 0 { 12 } else { f.hour % 12 }),
        "HH24" | "hh24" => clock(f.hour),
        "MI" | "mi" => clock(f.minute),
        "SS" | "ss" => clock(f.second),
        "MS" | "ms" => n(f.micros / 1000, 3),
        "US" | "us" => n(f.micros, 6),
        k if k.len() == 3 && k[..2].eq_ignore_ascii_case("FF") => {
            let digits = usize::from(k.as_bytes()[2] - b'0');
            n(f.micros / 10i64.pow(6 - digits as u32), digits)
        }
        "SSSS" | "SSSSS" | "ssss" | "sssss" => n(f.hour * 3600 + f.minute * 60 + f.second, 0),
        "AM" | "PM" | "am" | "pm" => Some(cased(if pm { "PM" } else { "AM" }, keyword)),
        "A.M." | "P.M." | "a.m." | "p.m." => Some(cased(if pm { "P.M." } else { "A.M." }, keyword)),
        _ => None,
    }
}

/// Renders one keyword.
fn keyword(
    f: &Fields,
    keyword: &'static str,
    fill_mode: bool,
    ordinal: Option<bool>,
) -> Result<String> {
    if let Some(text) = clock_keyword(f, keyword, fill_mode, ordinal) {
        return Ok(text);
    }
    let n = |v: i64, width: usize| Ok(number(v, width, fill_mode, ordinal));
    let dates_only = || {
        if f.interval {
            Err(not_for_interval())
        } else {
            Ok(())
        }
    };
    let upper = keyword
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_uppercase());
    match keyword {
        "Y,YYY" | "y,yyy" => {
            let s = format!("{},{:03}", f.year / 1000, f.year % 1000);
            Ok(match ordinal {
                Some(upper) => format!("{s}{}", ordinal_suffix(&s, upper)),
                None => s,
            })
        }
        "YYYY" | "yyyy" => n(f.year, 4),
        "YYY" | "yyy" => n(f.year % 1000, 3),
        "YY" | "yy" => n(f.year % 100, 2),
        "Y" | "y" => n(f.year % 10, 1),
        "IYYY" | "iyyy" => n(f.iso_year, 4),
        "IYY" | "iyy" => n(f.iso_year % 1000, 3),
        "IY" | "iy" => n(f.iso_year % 100, 2),
        "I" | "i" => n(f.iso_year % 10, 1),
        "BC" | "AD" | "bc" | "ad" => {
            dates_only().map(|()| cased(if f.year <= 0 { "BC" } else { "AD" }, keyword))
        }
        "B.C." | "A.D." | "b.c." | "a.d." => {
            dates_only().map(|()| cased(if f.year <= 0 { "B.C." } else { "A.D." }, keyword))
        }
        "MONTH" | "Month" | "month" => {
            dates_only()?;
            Ok(name(
                cased(MONTH_NAMES[(f.month as usize).clamp(1, 12) - 1], keyword),
                9,
                fill_mode,
            ))
        }
        "MON" | "Mon" | "mon" => {
            dates_only()?;
            Ok(cased(
                &MONTH_NAMES[(f.month as usize).clamp(1, 12) - 1][..3],
                keyword,
            ))
        }
        "MM" | "mm" => n(f.month, 2),
        "DAY" | "Day" | "day" => {
            dates_only()?;
            Ok(name(
                cased(DAY_NAMES[f.weekday as usize % 7], keyword),
                9,
                fill_mode,
            ))
        }
        "DY" | "Dy" | "dy" => {
            dates_only()?;
            Ok(cased(&DAY_NAMES[f.weekday as usize % 7][..3], keyword))
        }
        "DDD" | "ddd" => n(f.day_of_year, 3),
        "IDDD" | "iddd" => n(iso_day_of_year(f), 3),
        "DD" | "dd" => n(f.day, 2),
        "D" | "d" => dates_only().and_then(|()| n(f.weekday + 1, 1)),
        "ID" | "id" => dates_only().and_then(|()| n((f.weekday + 6) % 7 + 1, 1)),
        "W" | "w" => n((f.day - 1) / 7 + 1, 1),
        "WW" | "ww" => n((f.day_of_year - 1) / 7 + 1, 2),
        "IW" | "iw" => n(f.iso_week, 2),
        "CC" | "cc" => {
            let century = if f.interval {
                f.year / 100
            } else if f.year > 0 {
                (f.year + 99) / 100
            } else {
                -((99 - (f.year - 1)) / 100)
            };
            n(century, 2)
        }
        "J" | "j" => n(f.julian, 0),
        // An interval of no months has no quarter and no roman month.
        "Q" | "q" if f.month == 0 => Ok(String::new()),
        "Q" | "q" => n((f.month - 1) / 3 + 1, 1),
        "RM" | "rm" if f.month == 0 => Ok(String::new()),
        "RM" | "rm" => {
            let roman = ROMAN_MONTHS
                .get((f.month - 1).clamp(0, 11) as usize)
                .copied()
                .unwrap_or("I");
            let roman = if upper {
                roman.to_owned()
            } else {
                roman.to_lowercase()
            };
            Ok(name(roman, 4, fill_mode))
        }
        "TZ" | "tz" => {
            dates_only()?;
            Ok(f.zone
                .as_ref()
                .map(|(_, abbreviation)| {
                    if upper {
                        abbreviation.clone()
                    } else {
                        abbreviation.to_lowercase()
                    }
                })
                .unwrap_or_default())
        }
        "OF" | "of" => {
            dates_only()?;
            Ok(f.zone
                .as_ref()
                .map_or_else(|| "+00".to_owned(), |(offset, _)| offset_text(*offset)))
        }
        "TZH" | "TZM" if f.interval => Err(not_for_interval()),
        "TZH" => Ok(f.zone.as_ref().map_or_else(
            || "+00".to_owned(),
            |(offset, _)| {
                format!(
                    "{}{:02}",
                    if *offset < 0 { '-' } else { '+' },
                    offset.abs() / 3600
                )
            },
        )),
        "TZM" => Ok(f.zone.as_ref().map_or_else(
            || "00".to_owned(),
            |(offset, _)| format!("{:02}", offset.abs() / 60 % 60),
        )),
        "FX" | "fx" => Ok(String::new()),
        other => Err(error(
            SqlState::FEATURE_NOT_SUPPORTED,
            format!("to_char template pattern \"{other}\" is not supported"),
        )),
    }
}

/// Renders a parsed template for one value.
pub fn render(nodes: &[Node], fields: &Fields) -> Result<String> {
    let mut out = String::new();
    for node in nodes {
        match node {
            Node::Literal(text) => out.push_str(text),
            Node::Keyword {
                keyword: k,
                fill_mode,
                ordinal,
            } => out.push_str(&keyword(fields, k, *fill_mode, *ordinal)?),
        }
    }
    Ok(out)
}

/// The template of each row, parsed once per distinct text (templates are nearly always
/// constants).
struct Templates {
    last: Option<(String, Vec<Node>)>,
}

impl Templates {
    fn get(&mut self, text: &str) -> &[Node] {
        if self.last.as_ref().is_none_or(|(t, _)| t != text) {
            self.last = Some((text.to_owned(), template::parse(text)));
        }
        self.last
            .as_ref()
            .map_or(&[], |(_, nodes)| nodes.as_slice())
    }
}

fn to_char(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let formats = arrow::compute::cast(&a[1], &DataType::Utf8)?;
    let formats = formats.as_string::<i32>();
    let value_type = a[0].data_type().clone();
    if value_type.is_numeric() {
        return super::to_char_numeric::to_char(&a[0], formats);
    }
    let zone = session_zone(args);
    let n = a[0].len();
    let fields: Box<dyn Fn(usize) -> Result<Option<Fields>>> = match &value_type {
        DataType::Timestamp(_, tz) => {
            let us =
                arrow::compute::cast(&a[0], &DataType::Timestamp(TimeUnit::Microsecond, None))?;
            let zoned = tz.is_some();
            Box::new(move |i| {
                let us = us.as_primitive::<TimestampMicrosecondType>();
                if us.is_null(i) {
                    return Ok(None);
                }
                let v = us.value(i);
                let fields = if zoned {
                    let utc = naive_from_us(v).ok_or_else(out_of_range)?;
                    let (offset, abbreviation) = zone.offset_at(&utc);
                    let (local, _) = local_time(v, zone).ok_or_else(out_of_range)?;
                    Fields::from_datetime(local, Some((offset, abbreviation)))
                } else {
                    Fields::from_datetime(naive_from_us(v).ok_or_else(out_of_range)?, None)
                };
                Ok(Some(fields))
            })
        }
        // A date formats as the timestamptz of its midnight in the session's zone, the type
        // PostgreSQL casts it to (so `TZ` shows the zone).
        DataType::Date32 | DataType::Date64 => {
            let us =
                arrow::compute::cast(&a[0], &DataType::Timestamp(TimeUnit::Microsecond, None))?;
            Box::new(move |i| {
                let us = us.as_primitive::<TimestampMicrosecondType>();
                if us.is_null(i) {
                    return Ok(None);
                }
                let midnight = naive_from_us(us.value(i)).ok_or_else(out_of_range)?;
                let utc = super::datetime_in::WrittenTimestamp {
                    local: midnight,
                    zone: None,
                }
                .utc_micros(zone)
                .and_then(naive_from_us)
                .ok_or_else(out_of_range)?;
                Ok(Some(Fields::from_datetime(
                    midnight,
                    Some(zone.offset_at(&utc)),
                )))
            })
        }
        DataType::Interval(_) => {
            let spans =
                arrow::compute::cast(&a[0], &DataType::Interval(IntervalUnit::MonthDayNano))?;
            Box::new(move |i| {
                let spans = spans.as_primitive::<IntervalMonthDayNanoType>();
                if spans.is_null(i) {
                    return Ok(None);
                }
                let v = spans.value(i);
                Ok(Some(Fields::from_interval(
                    v.months,
                    v.days,
                    v.nanoseconds / 1000,
                )))
            })
        }
        other => {
            return Err(no_such_function(
                "to_char",
                &[other.clone(), DataType::Utf8],
            ));
        }
    };
    let mut templates = Templates { last: None };
    let mut b = StringBuilder::with_capacity(n, n * 16);
    for i in 0..n {
        match (fields(i)?, formats.is_null(i)) {
            // An empty template gives NULL, as in PostgreSQL.
            (Some(_), false) if formats.value(i).is_empty() => b.append_null(),
            (Some(f), false) => b.append_value(render(templates.get(formats.value(i)), &f)?),
            _ => b.append_null(),
        }
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish()) as ArrayRef))
}

fn out_of_range() -> datafusion::common::DataFusionError {
    error(SqlState::DATETIME_FIELD_OVERFLOW, "timestamp out of range")
}

pub fn functions() -> Vec<ScalarUDF> {
    vec![
        PgFunction::new(
            "to_char",
            Signature::any(2, IMMUTABLE),
            DataType::Utf8,
            to_char,
        )
        .udf(),
    ]
}
