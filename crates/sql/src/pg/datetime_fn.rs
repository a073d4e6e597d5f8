//! Date and time functions with PostgreSQL's results: `extract` (numeric, with the scale
//! PostgreSQL gives each field), `date_part` (double precision), `date - date` (integer days),
//! `date_trunc` (timestamptz in the session's zone; dates as timestamptz; intervals),
//! `make_date`, `make_timestamp`, `to_timestamp(seconds)`, `isfinite`.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Decimal128Builder, Float64Builder, Int32Array,
    TimestampMicrosecondArray,
};
use arrow::datatypes::{
    DataType, Date32Type, Field, Float64Type, Int64Type, IntervalMonthDayNanoType, IntervalUnit,
    Time64MicrosecondType, TimeUnit, TimestampMicrosecondType,
};
use chrono::{Datelike, NaiveDate, NaiveDateTime, Timelike};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, Signature, TypeSignature,
};
use eddy_common::{Error, SqlState};

use super::cast::{external, session_zone};
use super::datetime_in::{MICROS_PER_DAY, MICROS_PER_SECOND};
use super::text::{date_from_days, local_time, naive_from_us};
use super::udf::{IMMUTABLE, PgFunction, Result, arrays, constant_text, error};

pub const DATE_DIFF: &str = "eddy_date_diff";

/// What `extract` reads from.
#[derive(Clone, Copy)]
enum Source {
    Timestamp { zoned: bool },
    Date,
    Time,
    Interval,
}

impl Source {
    fn of(t: &DataType) -> Option<Source> {
        Some(match t {
            DataType::Timestamp(_, zone) => Source::Timestamp {
                zoned: zone.is_some(),
            },
            DataType::Date32 | DataType::Date64 => Source::Date,
            DataType::Time32(_) | DataType::Time64(_) => Source::Time,
            DataType::Interval(_) | DataType::Duration(_) => Source::Interval,
            _ => return None,
        })
    }

    fn type_name(self) -> &'static str {
        match self {
            Source::Timestamp { zoned: true } => "timestamp with time zone",
            Source::Timestamp { zoned: false } => "timestamp without time zone",
            Source::Date => "date",
            Source::Time => "time without time zone",
            Source::Interval => "interval",
        }
    }
}

/// A field name as PostgreSQL spells its units, normalized (`years` and `y` are `year`).
fn field_name(raw: &str) -> String {
    let f = raw.trim().to_ascii_lowercase();
    let canonical = match f.as_str() {
        "microseconds" | "microsecond" | "us" | "usec" | "usecs" | "useconds" => "microseconds",
        "milliseconds" | "millisecond" | "ms" | "msec" | "msecs" | "mseconds" => "milliseconds",
        "second" | "seconds" | "s" | "sec" | "secs" => "second",
        "minute" | "minutes" | "m" | "min" | "mins" => "minute",
        "hour" | "hours" | "h" | "hr" | "hrs" => "hour",
        "day" | "days" | "d" => "day",
        "week" | "weeks" | "w" => "week",
        "month" | "months" | "mon" | "mons" => "month",
        "year" | "years" | "y" | "yr" | "yrs" => "year",
        "decade" | "decades" => "decade",
        "century" | "centuries" => "century",
        "millennium" | "millennia" | "millenniums" => "millennium",
        other => other,
    };
    canonical.to_owned()
}

/// The scale of `extract(field from source)`'s numeric result.
fn scale(field: &str, source: Source) -> i8 {
    match (field, source) {
        ("second" | "epoch", Source::Timestamp { .. } | Source::Time | Source::Interval) => 6,
        ("milliseconds", Source::Timestamp { .. } | Source::Time | Source::Interval) => 3,
        _ => 0,
    }
}

/// Every field name PostgreSQL's extract knows (after [`field_name`]).
const UNITS: [&str; 21] = [
    "microseconds",
    "milliseconds",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "quarter",
    "year",
    "decade",
    "century",
    "millennium",
    "epoch",
    "dow",
    "isodow",
    "doy",
    "isoyear",
    "julian",
    "timezone",
    "timezone_hour",
];

/// A field the type has not (0A000), or a name that is no field (22023), as PostgreSQL tells them apart.
fn unsupported_unit(field: &str, source: Source) -> datafusion::common::DataFusionError {
    if UNITS.contains(&field) || field == "timezone_minute" {
        error(
            SqlState::FEATURE_NOT_SUPPORTED,
            format!(
                "unit \"{field}\" not supported for type {}",
                source.type_name()
            ),
        )
    } else {
        error(
            SqlState::INVALID_PARAMETER_VALUE,
            format!(
                "unit \"{field}\" not recognized for type {}",
                source.type_name()
            ),
        )
    }
}

/// Seconds and microseconds of a clock time, as `second`, `milliseconds`, `microseconds` want.
fn clock_field(field: &str, seconds: i64, micros: i64) -> Option<i128> {
    let exact = i128::from(seconds) * 1_000_000 + i128::from(micros);
    Some(match field {
        "microseconds" => exact,
        "milliseconds" => exact,
        "second" => exact,
        _ => return None,
    })
}

/// `extract(field from` a local date-time`)`, at [`scale`].
fn datetime_field(
    field: &str,
    t: NaiveDateTime,
    epoch_us: i64,
    offset: Option<i32>,
    source: Source,
) -> Result<i128> {
    let year = i128::from(t.year());
    let date_only = matches!(source, Source::Date);
    let v = match field {
        "year" => year,
        "month" => i128::from(t.month()),
        "day" => i128::from(t.day()),
        "quarter" => i128::from((t.month() - 1) / 3 + 1),
        "week" => i128::from(t.iso_week().week()),
        "isoyear" => i128::from(t.iso_week().year()),
        "dow" => i128::from(t.weekday().num_days_from_sunday()),
        "isodow" => i128::from(t.weekday().number_from_monday()),
        "doy" => i128::from(t.ordinal()),
        "decade" => year.div_euclid(10),
        "century" => {
            if year > 0 {
                (year + 99) / 100
            } else {
                -((99 - (year - 1)) / 100)
            }
        }
        "millennium" => {
            if year > 0 {
                (year + 999) / 1000
            } else {
                -((999 - (year - 1)) / 1000)
            }
        }
        "julian" => i128::from(t.date().num_days_from_ce()) + 1_721_425,
        "epoch" if date_only => i128::from(epoch_us.div_euclid(MICROS_PER_SECOND)),
        "epoch" => i128::from(epoch_us),
        "hour" if !date_only => i128::from(t.hour()),
        "minute" if !date_only => i128::from(t.minute()),
        "timezone" => i128::from(offset.ok_or_else(|| unsupported_unit(field, source))?),
        "timezone_hour" => {
            i128::from(offset.ok_or_else(|| unsupported_unit(field, source))? / 3600)
        }
        "timezone_minute" => {
            i128::from(offset.ok_or_else(|| unsupported_unit(field, source))? / 60 % 60)
        }
        f if !date_only => clock_field(f, i64::from(t.second()), i64::from(t.nanosecond() / 1000))
            .ok_or_else(|| unsupported_unit(field, source))?,
        _ => return Err(unsupported_unit(field, source)),
    };
    Ok(v)
}

fn interval_field(field: &str, months: i32, days: i32, micros: i64) -> Result<i128> {
    let years = i128::from(months / 12);
    let seconds_in_minute = micros % (60 * MICROS_PER_SECOND);
    Ok(match field {
        "microseconds" | "milliseconds" | "second" => i128::from(seconds_in_minute),
        "minute" => i128::from(micros / (60 * MICROS_PER_SECOND) % 60),
        "hour" => i128::from(micros / (3600 * MICROS_PER_SECOND)),
        "day" => i128::from(days),
        "month" => i128::from(months % 12),
        "quarter" => i128::from((months % 12) / 3 + 1),
        "year" => years,
        "decade" => years / 10,
        "century" => years / 100,
        "millennium" => years / 1000,
        // A year is 365.25 days and a month 30, as PostgreSQL counts an interval's epoch.
        "epoch" => {
            let whole_days_us = (i128::from(months / 12) * 36525 * i128::from(MICROS_PER_DAY))
                / 100
                + i128::from(months % 12) * 30 * i128::from(MICROS_PER_DAY)
                + i128::from(days) * i128::from(MICROS_PER_DAY);
            whole_days_us + i128::from(micros)
        }
        _ => return Err(unsupported_unit(field, Source::Interval)),
    })
}

/// Each row's field as an integer number of units at the field's microsecond-based scale
/// (seconds and epochs in µs, milliseconds in µs too), then rescaled by the caller.
fn extract_rows(
    field: &str,
    input: &ArrayRef,
    source: Source,
    args: &ScalarFunctionArgs,
) -> Result<Vec<Option<i128>>> {
    let zone = session_zone(args);
    let n = input.len();
    let mut out = Vec::with_capacity(n);
    match source {
        Source::Timestamp { zoned } => {
            let us =
                arrow::compute::cast(input, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
            for v in us.as_primitive::<TimestampMicrosecondType>().iter() {
                out.push(match v {
                    None => None,
                    Some(us) => {
                        let (local, offset) = if zoned {
                            local_time(us, zone).map(|(l, o)| (l, Some(o)))
                        } else {
                            naive_from_us(us).map(|l| (l, None))
                        }
                        .ok_or_else(out_of_range)?;
                        Some(datetime_field(field, local, us, offset, source)?)
                    }
                });
            }
        }
        Source::Date => {
            let days = arrow::compute::cast(input, &DataType::Date32)?;
            for v in days.as_primitive::<Date32Type>().iter() {
                out.push(match v {
                    None => None,
                    Some(d) => {
                        let date = date_from_days(d).ok_or_else(out_of_range)?;
                        Some(datetime_field(
                            field,
                            date.and_time(chrono::NaiveTime::MIN),
                            i64::from(d) * MICROS_PER_DAY,
                            None,
                            source,
                        )?)
                    }
                });
            }
        }
        Source::Time => {
            let times = arrow::compute::cast(input, &DataType::Time64(TimeUnit::Microsecond))?;
            for v in times.as_primitive::<Time64MicrosecondType>().iter() {
                out.push(match v {
                    None => None,
                    Some(us) => Some(match field {
                        "hour" => i128::from(us / (3600 * MICROS_PER_SECOND)),
                        "minute" => i128::from(us / (60 * MICROS_PER_SECOND) % 60),
                        "epoch" => i128::from(us),
                        f => clock_field(f, us / MICROS_PER_SECOND % 60, us % MICROS_PER_SECOND)
                            .ok_or_else(|| unsupported_unit(field, source))?,
                    }),
                });
            }
        }
        Source::Interval => {
            let spans =
                arrow::compute::cast(input, &DataType::Interval(IntervalUnit::MonthDayNano))?;
            for v in spans.as_primitive::<IntervalMonthDayNanoType>().iter() {
                out.push(
                    v.map(|v| interval_field(field, v.months, v.days, v.nanoseconds / 1000))
                        .transpose()?,
                );
            }
        }
    }
    Ok(out)
}

fn out_of_range() -> datafusion::common::DataFusionError {
    error(SqlState::DATETIME_FIELD_OVERFLOW, "timestamp out of range")
}

/// The scale the values of [`extract_rows`] come at: µs-based fields carry 6 digits.
fn raw_scale(field: &str, source: Source) -> i8 {
    match (field, source) {
        (
            "second" | "milliseconds" | "microseconds",
            Source::Timestamp { .. } | Source::Time | Source::Interval,
        ) => 6,
        ("epoch", Source::Timestamp { .. } | Source::Time | Source::Interval) => 6,
        _ => 0,
    }
}

/// `milliseconds` is µs / 1000, `microseconds` is µs: the unit factor of a µs-based field.
fn unit_shift(field: &str) -> i8 {
    match field {
        "milliseconds" => 3,
        "microseconds" => 6,
        _ => 0,
    }
}

fn field_and_source(
    args: &datafusion::logical_expr::ReturnFieldArgs<'_>,
) -> Result<(String, Source)> {
    let field = constant_text(args, 0).ok_or_else(|| {
        error(
            SqlState::FEATURE_NOT_SUPPORTED,
            "the field of extract/date_part must be a constant",
        )
    })?;
    let t = args.arg_fields[1].data_type();
    let source = Source::of(t)
        .ok_or_else(|| super::udf::no_such_function("date_part", &[DataType::Utf8, t.clone()]))?;
    Ok((field_name(&field), source))
}

fn evaluate_extract(args: &ScalarFunctionArgs, numeric: bool) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let fields = arrow::compute::cast(&a[0], &DataType::Utf8)?;
    let field = field_name(
        fields
            .as_string::<i32>()
            .iter()
            .flatten()
            .next()
            .unwrap_or(""),
    );
    let source = Source::of(a[1].data_type()).ok_or_else(|| {
        super::udf::no_such_function("date_part", &[DataType::Utf8, a[1].data_type().clone()])
    })?;
    let rows = extract_rows(&field, &a[1], source, args)?;
    // Raw values are at `raw_scale`, in units of 10^-unit_shift of the field.
    let raw = raw_scale(&field, source) - unit_shift(&field);
    let out: ArrayRef = if numeric {
        let target = scale(&field, source);
        let mut b =
            Decimal128Builder::with_capacity(rows.len()).with_precision_and_scale(38, target)?;
        for v in rows {
            b.append_option(v.map(|v| super::decimal::rescale(v, raw, target).unwrap_or(v)));
        }
        Arc::new(b.finish())
    } else {
        let mut b = Float64Builder::with_capacity(rows.len());
        for v in rows {
            b.append_option(v.map(|v| v as f64 / 10f64.powi(i32::from(raw))));
        }
        Arc::new(b.finish())
    };
    Ok(ColumnarValue::Array(out))
}

fn date_diff(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let (x, y) = (
        a[0].as_primitive::<Date32Type>(),
        a[1].as_primitive::<Date32Type>(),
    );
    let out: Int32Array = x.iter().zip(y.iter()).map(|(x, y)| Some(x? - y?)).collect();
    Ok(ColumnarValue::Array(Arc::new(out)))
}

/// `make_timestamp(year, month, day, hour, min, sec)`.
fn make_timestamp(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let ints: Vec<ArrayRef> = a
        .iter()
        .take(5)
        .map(|c| arrow::compute::cast(c, &DataType::Int64))
        .collect::<std::result::Result<_, _>>()?;
    let secs = arrow::compute::cast(&a[5], &DataType::Float64)?;
    let secs = secs.as_primitive::<Float64Type>();
    let mut out = Vec::with_capacity(args.number_rows);
    for row in 0..args.number_rows {
        if ints.iter().any(|c| c.is_null(row)) || secs.is_null(row) {
            out.push(None);
            continue;
        }
        let f: Vec<i64> = ints
            .iter()
            .map(|c| c.as_primitive::<Int64Type>().value(row))
            .collect();
        let s = secs.value(row);
        let text = format!("{}-{}-{} {}:{}:{}", f[0], f[1], f[2], f[3], f[4], s);
        let date = i32::try_from(f[0]).ok().and_then(|y| {
            NaiveDate::from_ymd_opt(y, u32::try_from(f[1]).ok()?, u32::try_from(f[2]).ok()?)
        });
        let valid_time =
            (0..24).contains(&f[3]) && (0..60).contains(&f[4]) && (0.0..60.0).contains(&s);
        let (Some(date), true) = (date, valid_time) else {
            return Err(external(Error::new(
                SqlState::DATETIME_FIELD_OVERFLOW,
                format!("date/time field value out of range: {text}"),
            )));
        };
        let micros = (f[3] * 3600 + f[4] * 60) * MICROS_PER_SECOND
            + (s * MICROS_PER_SECOND as f64).round_ties_even() as i64;
        out.push(Some(
            date.and_time(chrono::NaiveTime::MIN)
                .and_utc()
                .timestamp_micros()
                + micros,
        ));
    }
    Ok(ColumnarValue::Array(Arc::new(
        TimestampMicrosecondArray::from(out),
    )))
}

/// `to_timestamp(seconds)`: a timestamptz from seconds since 1970.
fn to_timestamp_seconds(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let secs = arrow::compute::cast(&arrays(args)?[0], &DataType::Float64)?;
    let mut out = Vec::with_capacity(secs.len());
    for v in secs.as_primitive::<Float64Type>().iter() {
        out.push(match v {
            None => None,
            Some(s) if s.is_finite() && s.abs() < 9.2e12 => {
                Some((s * MICROS_PER_SECOND as f64).round_ties_even() as i64)
            }
            Some(_) => {
                return Err(error(
                    SqlState::DATETIME_FIELD_OVERFLOW,
                    "timestamp out of range",
                ));
            }
        });
    }
    Ok(ColumnarValue::Array(Arc::new(
        TimestampMicrosecondArray::from(out).with_timezone(crate::types::UTC),
    )))
}

/// `date_trunc(unit, local date-time)`: the start of the unit containing it.
fn truncate(t: NaiveDateTime, unit: &str) -> Option<NaiveDateTime> {
    let date = t.date();
    let midnight = |d: NaiveDate| d.and_time(chrono::NaiveTime::MIN);
    let year_start = |y: i32| NaiveDate::from_ymd_opt(y, 1, 1).map(midnight);
    Some(match unit {
        "microseconds" => t,
        "milliseconds" => t.with_nanosecond(t.nanosecond() / 1_000_000 * 1_000_000)?,
        "second" => t.with_nanosecond(0)?,
        "minute" => t.with_nanosecond(0)?.with_second(0)?,
        "hour" => t.with_nanosecond(0)?.with_second(0)?.with_minute(0)?,
        "day" => midnight(date),
        "week" => midnight(
            date - chrono::Duration::days(i64::from(date.weekday().num_days_from_monday())),
        ),
        "month" => midnight(date.with_day(1)?),
        "quarter" => midnight(NaiveDate::from_ymd_opt(
            date.year(),
            (date.month() - 1) / 3 * 3 + 1,
            1,
        )?),
        "year" => year_start(date.year())?,
        "decade" => year_start(date.year().div_euclid(10) * 10)?,
        // Centuries and millennia start at years ending in 01 and 001.
        "century" => year_start((date.year() - 1).div_euclid(100) * 100 + 1)?,
        "millennium" => year_start((date.year() - 1).div_euclid(1000) * 1000 + 1)?,
        _ => return None,
    })
}

const TRUNCATE_UNITS: [&str; 13] = [
    "microseconds",
    "milliseconds",
    "second",
    "minute",
    "hour",
    "day",
    "week",
    "month",
    "quarter",
    "year",
    "decade",
    "century",
    "millennium",
];

fn truncate_interval(
    v: arrow::datatypes::IntervalMonthDayNano,
    unit: &str,
) -> Result<arrow::datatypes::IntervalMonthDayNano> {
    let (months, days, micros) = (v.months, v.days, v.nanoseconds / 1000);
    let keep = |us_unit: i64| micros - micros % us_unit;
    let (months, days, micros) = match unit {
        "microseconds" => (months, days, micros),
        "milliseconds" => (months, days, keep(1000)),
        "second" => (months, days, keep(MICROS_PER_SECOND)),
        "minute" => (months, days, keep(60 * MICROS_PER_SECOND)),
        "hour" => (months, days, keep(3600 * MICROS_PER_SECOND)),
        "day" => (months, days, 0),
        "month" => (months, 0, 0),
        "quarter" => (months - months % 3, 0, 0),
        "year" => (months - months % 12, 0, 0),
        "decade" => (months - months % 120, 0, 0),
        "century" => (months - months % 1200, 0, 0),
        "millennium" => (months - months % 12000, 0, 0),
        "week" => {
            return Err(error(
                SqlState::FEATURE_NOT_SUPPORTED,
                "interval units \"week\" not supported because months usually have fractional weeks",
            ));
        }
        _ => {
            return Err(error(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("unit \"{unit}\" not recognized for type interval"),
            ));
        }
    };
    Ok(arrow::datatypes::IntervalMonthDayNano::new(
        months,
        days,
        micros * 1000,
    ))
}

fn date_trunc_type(args: &datafusion::logical_expr::ReturnFieldArgs<'_>) -> Result<Field> {
    let t = args.arg_fields[1].data_type();
    let out = match t {
        DataType::Timestamp(_, None) => DataType::Timestamp(TimeUnit::Microsecond, None),
        // A date is truncated as the timestamptz of its midnight, as PostgreSQL casts it.
        DataType::Timestamp(_, Some(_)) | DataType::Date32 | DataType::Date64 => {
            DataType::Timestamp(TimeUnit::Microsecond, Some(crate::types::UTC.into()))
        }
        DataType::Interval(_) => DataType::Interval(IntervalUnit::MonthDayNano),
        other => {
            return Err(super::udf::no_such_function(
                "date_trunc",
                &[DataType::Utf8, other.clone()],
            ));
        }
    };
    Ok(Field::new("", out, true))
}

fn date_trunc(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let units = arrow::compute::cast(&a[0], &DataType::Utf8)?;
    let units = units.as_string::<i32>();
    let zone = session_zone(args);
    let input = &a[1];
    if let DataType::Interval(_) = args.return_type() {
        let spans = arrow::compute::cast(input, &DataType::Interval(IntervalUnit::MonthDayNano))?;
        let mut out = Vec::with_capacity(spans.len());
        for (i, v) in spans
            .as_primitive::<IntervalMonthDayNanoType>()
            .iter()
            .enumerate()
        {
            out.push(match (v, units.is_null(i)) {
                (Some(v), false) => Some(truncate_interval(v, &field_name(units.value(i)))?),
                _ => None,
            });
        }
        return Ok(ColumnarValue::Array(Arc::new(
            arrow::array::IntervalMonthDayNanoArray::from(out),
        )));
    }
    let zoned = matches!(args.return_type(), DataType::Timestamp(_, Some(_)));
    let from_date = matches!(input.data_type(), DataType::Date32 | DataType::Date64);
    let us = arrow::compute::cast(input, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
    let kind = if zoned {
        "timestamp with time zone"
    } else {
        "timestamp without time zone"
    };
    let mut out = Vec::with_capacity(us.len());
    for (i, v) in us
        .as_primitive::<TimestampMicrosecondType>()
        .iter()
        .enumerate()
    {
        let (Some(v), false) = (v, units.is_null(i)) else {
            out.push(None);
            continue;
        };
        let unit = field_name(units.value(i));
        if !TRUNCATE_UNITS.contains(&unit.as_str()) {
            return Err(error(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("unit \"{}\" not recognized for type {kind}", units.value(i)),
            ));
        }
        let local = if zoned && !from_date {
            local_time(v, zone).map(|(l, _)| l)
        } else {
            naive_from_us(v)
        }
        .ok_or_else(out_of_range)?;
        let truncated = truncate(local, &unit).ok_or_else(out_of_range)?;
        out.push(Some(if zoned {
            super::datetime_in::WrittenTimestamp {
                local: truncated,
                zone: None,
            }
            .utc_micros(zone)
            .ok_or_else(out_of_range)?
        } else {
            truncated.and_utc().timestamp_micros()
        }));
    }
    let out = TimestampMicrosecondArray::from(out);
    Ok(ColumnarValue::Array(if zoned {
        Arc::new(out.with_timezone(crate::types::UTC))
    } else {
        Arc::new(out)
    }))
}

/// `make_date(year, month, day)`.
fn make_date(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let fields: Vec<ArrayRef> = a
        .iter()
        .map(|c| arrow::compute::cast(c, &DataType::Int64))
        .collect::<std::result::Result<_, _>>()?;
    let mut out = Vec::with_capacity(args.number_rows);
    for row in 0..args.number_rows {
        if fields.iter().any(|c| c.is_null(row)) {
            out.push(None);
            continue;
        }
        let f: Vec<i64> = fields
            .iter()
            .map(|c| c.as_primitive::<Int64Type>().value(row))
            .collect();
        let date = i32::try_from(f[0]).ok().and_then(|y| {
            NaiveDate::from_ymd_opt(y, u32::try_from(f[1]).ok()?, u32::try_from(f[2]).ok()?)
        });
        let date = date.ok_or_else(|| {
            error(
                SqlState::DATETIME_FIELD_OVERFLOW,
                format!(
                    "date field value out of range: {}-{:02}-{:02}",
                    f[0], f[1], f[2]
                ),
            )
        })?;
        out.push(Some(super::datetime_in::days_since_epoch(date)));
    }
    Ok(ColumnarValue::Array(Arc::new(
        arrow::array::Date32Array::from(out),
    )))
}

pub fn functions() -> Vec<ScalarUDF> {
    let extract_signature = || Signature::any(2, IMMUTABLE);
    let extract = PgFunction::with_return(
        "extract",
        extract_signature(),
        |args| {
            let (field, source) = field_and_source(args)?;
            Ok(Field::new(
                "",
                DataType::Decimal128(38, scale(&field, source)),
                true,
            ))
        },
        |args| evaluate_extract(args, true),
    );
    let date_part = PgFunction::with_return(
        "date_part",
        extract_signature(),
        |args| {
            field_and_source(args)?;
            Ok(Field::new("", DataType::Float64, true))
        },
        |args| evaluate_extract(args, false),
    )
    .alias("datepart");
    let ts = DataType::Timestamp(TimeUnit::Microsecond, None);
    let make_timestamp_signature = Signature::exact(
        vec![
            DataType::Int64,
            DataType::Int64,
            DataType::Int64,
            DataType::Int64,
            DataType::Int64,
            DataType::Float64,
        ],
        IMMUTABLE,
    );
    let isfinite = PgFunction::new(
        "isfinite",
        Signature::any(1, IMMUTABLE),
        DataType::Boolean,
        |args| {
            // Eddy stores no infinite dates or timestamps: every non-NULL value is finite.
            let input = &arrays(args)?[0];
            let out: arrow::array::BooleanArray = (0..input.len())
                .map(|i| (!input.is_null(i)).then_some(true))
                .collect();
            Ok(ColumnarValue::Array(Arc::new(out)))
        },
    );
    vec![
        extract.udf(),
        date_part.udf(),
        PgFunction::new(
            DATE_DIFF,
            Signature::exact(vec![DataType::Date32, DataType::Date32], IMMUTABLE),
            DataType::Int32,
            date_diff,
        )
        .named(super::udf::operator_name("-"))
        .udf(),
        PgFunction::new(
            "make_timestamp",
            make_timestamp_signature,
            ts,
            make_timestamp,
        )
        .udf(),
        PgFunction::new(
            "to_timestamp",
            Signature::one_of(
                vec![
                    TypeSignature::Exact(vec![DataType::Float64]),
                    TypeSignature::Exact(vec![DataType::Utf8, DataType::Utf8]),
                ],
                IMMUTABLE,
            ),
            DataType::Timestamp(TimeUnit::Microsecond, Some(crate::types::UTC.into())),
            |args| {
                if args.args.len() == 1 {
                    to_timestamp_seconds(args)
                } else {
                    super::to_timestamp::to_timestamp(args)
                }
            },
        )
        .udf(),
        isfinite.udf(),
        PgFunction::with_return(
            "date_trunc",
            Signature::any(2, IMMUTABLE),
            date_trunc_type,
            date_trunc,
        )
        .udf(),
        PgFunction::new(
            "make_date",
            Signature::exact(
                vec![DataType::Int64, DataType::Int64, DataType::Int64],
                IMMUTABLE,
            ),
            DataType::Date32,
            make_date,
        )
        .udf(),
    ]
}
