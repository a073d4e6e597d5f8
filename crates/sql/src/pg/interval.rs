//! Interval arithmetic as PostgreSQL does it: `interval * number` and `interval / number`
//! cascade fractions of months into days (of 30) and of days into time; `timestamp -
//! timestamp` is `justify_hours` of the difference (`1 day`, not `24:00:00`); `age`, the
//! `justify_*` family and `make_interval`; comparisons by total length (`1 day = 24 hours`).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, Decimal128Builder, Float64Array, IntervalMonthDayNanoBuilder,
    PrimitiveArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{
    DataType, Float64Type, Int64Type, IntervalMonthDayNano, IntervalMonthDayNanoType, IntervalUnit,
    TimeUnit, TimestampMicrosecondType,
};
use chrono::{Datelike, NaiveDate, Timelike};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, Signature, TypeSignature,
};
use eddy_common::SqlState;

use super::datetime_in::{Interval, MICROS_PER_DAY, MICROS_PER_SECOND};
use super::text::naive_from_us;
use super::udf::{IMMUTABLE, PgFunction, Result, arrays, error, operator_name};

pub const MUL: &str = "eddy_interval_mul";
pub const DIV: &str = "eddy_interval_div";
pub const TIMESTAMP_DIFF: &str = "eddy_timestamp_diff";
pub const COMPARISON_KEY: &str = "eddy_interval_key";

const INTERVAL: DataType = DataType::Interval(IntervalUnit::MonthDayNano);
const DAYS_PER_MONTH: i64 = 30;

fn out_of_range() -> datafusion::common::DataFusionError {
    error(SqlState::DATETIME_FIELD_OVERFLOW, "interval out of range")
}

fn to_interval(v: IntervalMonthDayNano) -> Interval {
    Interval {
        months: v.months,
        days: v.days,
        micros: v.nanoseconds / 1000,
    }
}

fn from_interval(i: Interval) -> IntervalMonthDayNano {
    IntervalMonthDayNano::new(i.months, i.days, i.micros.saturating_mul(1000))
}

fn intervals(array: &ArrayRef) -> Result<ArrayRef> {
    Ok(arrow::compute::cast(array, &INTERVAL)?)
}

/// Applies `f` to each row of an interval column and a float column.
fn interval_and_factor(
    args: &ScalarFunctionArgs,
    f: impl Fn(Interval, f64) -> Result<Interval>,
) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let spans = intervals(&a[0])?;
    let factors = arrow::compute::cast(&a[1], &DataType::Float64)?;
    let (spans, factors) = (
        spans.as_primitive::<IntervalMonthDayNanoType>(),
        factors.as_primitive::<Float64Type>(),
    );
    let mut b = IntervalMonthDayNanoBuilder::with_capacity(spans.len());
    for i in 0..spans.len() {
        if spans.is_null(i) || factors.is_null(i) {
            b.append_null();
        } else {
            b.append_value(from_interval(f(
                to_interval(spans.value(i)),
                factors.value(i),
            )?));
        }
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

/// Rounds to microseconds, as PostgreSQL's TSROUND.
fn ts_round(v: f64) -> f64 {
    (v * 1e6).round_ties_even() / 1e6
}

fn to_i32(v: f64) -> Result<i32> {
    if v.is_nan() || v < f64::from(i32::MIN) || v > f64::from(i32::MAX) {
        Err(out_of_range())
    } else {
        Ok(v as i32)
    }
}

/// PostgreSQL's interval_mul / interval_div: `month_part` and `day_part` are the exact
/// months and days (before truncation), `time` the scaled microseconds.
fn cascade(month_part: f64, day_part: f64, time: f64) -> Result<Interval> {
    let months = to_i32(month_part)?;
    let mut days = to_i32(day_part)?;
    let month_remainder_days = ts_round((month_part - f64::from(months)) * DAYS_PER_MONTH as f64);
    let mut sec_remainder = ts_round(
        (day_part - f64::from(days) + month_remainder_days - month_remainder_days.trunc())
            * 86_400.0,
    );
    if sec_remainder.abs() >= 86_400.0 {
        let whole = (sec_remainder / 86_400.0).trunc();
        days = days.checked_add(whole as i32).ok_or_else(out_of_range)?;
        sec_remainder -= whole * 86_400.0;
    }
    days = days
        .checked_add(month_remainder_days as i32)
        .ok_or_else(out_of_range)?;
    let micros = (time + sec_remainder * MICROS_PER_SECOND as f64).round_ties_even();
    if !micros.is_finite() || micros.abs() > 9.2e18 {
        return Err(out_of_range());
    }
    Ok(Interval {
        months,
        days,
        micros: micros as i64,
    })
}

pub fn multiply(span: Interval, factor: f64) -> Result<Interval> {
    cascade(
        f64::from(span.months) * factor,
        f64::from(span.days) * factor,
        span.micros as f64 * factor,
    )
}

pub fn divide(span: Interval, factor: f64) -> Result<Interval> {
    if factor == 0.0 {
        return Err(error(SqlState::DIVISION_BY_ZERO, "division by zero"));
    }
    cascade(
        f64::from(span.months) / factor,
        f64::from(span.days) / factor,
        span.micros as f64 / factor,
    )
}

/// Whole days of the time part move into days; then the signs of days and time agree.
pub fn justify_hours(mut i: Interval) -> Interval {
    i.days = i.days.saturating_add((i.micros / MICROS_PER_DAY) as i32);
    i.micros %= MICROS_PER_DAY;
    if i.days > 0 && i.micros < 0 {
        i.micros += MICROS_PER_DAY;
        i.days -= 1;
    } else if i.days < 0 && i.micros > 0 {
        i.micros -= MICROS_PER_DAY;
        i.days += 1;
    }
    i
}

pub fn justify_days(mut i: Interval) -> Interval {
    let whole_months = i.days / DAYS_PER_MONTH as i32;
    i.days -= whole_months * DAYS_PER_MONTH as i32;
    i.months = i.months.saturating_add(whole_months);
    if i.months > 0 && i.days < 0 {
        i.days += DAYS_PER_MONTH as i32;
        i.months -= 1;
    } else if i.months < 0 && i.days > 0 {
        i.days -= DAYS_PER_MONTH as i32;
        i.months += 1;
    }
    i
}

pub fn justify_interval(i: Interval) -> Interval {
    let mut i = Interval {
        days: i.days.saturating_add((i.micros / MICROS_PER_DAY) as i32),
        micros: i.micros % MICROS_PER_DAY,
        ..i
    };
    let whole_months = i.days / DAYS_PER_MONTH as i32;
    i.days -= whole_months * DAYS_PER_MONTH as i32;
    i.months = i.months.saturating_add(whole_months);
    if i.months > 0 && (i.days < 0 || i.days == 0 && i.micros < 0) {
        i.days += DAYS_PER_MONTH as i32;
        i.months -= 1;
    } else if i.months < 0 && (i.days > 0 || i.days == 0 && i.micros > 0) {
        i.days -= DAYS_PER_MONTH as i32;
        i.months += 1;
    }
    justify_hours(i)
}

fn days_in_month(year: i32, month: u32) -> i32 {
    let next = if month == 12 {
        NaiveDate::from_ymd_opt(year + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(year, month + 1, 1)
    };
    match (next, NaiveDate::from_ymd_opt(year, month, 1)) {
        (Some(n), Some(f)) => (n - f).num_days() as i32,
        _ => 30,
    }
}

/// PostgreSQL's `age(a, b)`: the symbolic difference in years, months and days, borrowing
/// from the month of the earlier argument.
pub fn age(a_us: i64, b_us: i64) -> Option<Interval> {
    let (a, b) = (naive_from_us(a_us)?, naive_from_us(b_us)?);
    let flip = a_us < b_us;
    let sign = if flip { -1 } else { 1 };
    let mut usec = sign * (i64::from(a.nanosecond() / 1000) - i64::from(b.nanosecond() / 1000));
    let mut sec = sign * (a.second() as i64 - b.second() as i64);
    let mut min = sign * (a.minute() as i64 - b.minute() as i64);
    let mut hour = sign * (a.hour() as i64 - b.hour() as i64);
    let mut day = sign * (i64::from(a.day()) - i64::from(b.day()));
    let mut mon = sign * (i64::from(a.month()) - i64::from(b.month()));
    let mut year = sign * i64::from(a.year() - b.year());
    while usec < 0 {
        usec += MICROS_PER_SECOND;
        sec -= 1;
    }
    while sec < 0 {
        sec += 60;
        min -= 1;
    }
    while min < 0 {
        min += 60;
        hour -= 1;
    }
    while hour < 0 {
        hour += 24;
        day -= 1;
    }
    while day < 0 {
        let from = if flip { a } else { b };
        day += i64::from(days_in_month(from.year(), from.month()));
        mon -= 1;
    }
    while mon < 0 {
        mon += 12;
        year -= 1;
    }
    let micros = ((hour * 60 + min) * 60 + sec) * MICROS_PER_SECOND + usec;
    Some(Interval {
        months: (sign * (year * 12 + mon)) as i32,
        days: (sign * day) as i32,
        micros: sign * micros,
    })
}

/// The length PostgreSQL orders and compares intervals by: months of 30 days, days of 24 hours.
pub fn comparison_key(i: Interval) -> i128 {
    (i128::from(i.months) * 30 + i128::from(i.days)) * i128::from(MICROS_PER_DAY)
        + i128::from(i.micros)
}

fn map_intervals(
    args: &ScalarFunctionArgs,
    f: impl Fn(Interval) -> Interval,
) -> Result<ColumnarValue> {
    let spans = intervals(&arrays(args)?[0])?;
    let spans = spans.as_primitive::<IntervalMonthDayNanoType>();
    let out: PrimitiveArray<IntervalMonthDayNanoType> = spans
        .iter()
        .map(|v| v.map(|v| from_interval(f(to_interval(v)))))
        .collect();
    Ok(ColumnarValue::Array(Arc::new(out)))
}

fn micros_of(array: &ArrayRef) -> Result<TimestampMicrosecondArray> {
    let cast = arrow::compute::cast(array, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
    Ok(cast.as_primitive::<TimestampMicrosecondType>().clone())
}

fn two_timestamps(
    args: &ScalarFunctionArgs,
    f: impl Fn(i64, i64) -> Result<Interval>,
) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let (x, y) = (micros_of(&a[0])?, micros_of(&a[1])?);
    let mut b = IntervalMonthDayNanoBuilder::with_capacity(x.len());
    for i in 0..x.len() {
        if x.is_null(i) || y.is_null(i) {
            b.append_null()
        } else {
            b.append_value(from_interval(f(x.value(i), y.value(i))?))
        }
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

fn timestamp_types() -> Vec<TypeSignature> {
    let ts = |tz: Option<Arc<str>>| DataType::Timestamp(TimeUnit::Microsecond, tz);
    vec![
        TypeSignature::Exact(vec![ts(None), ts(None)]),
        TypeSignature::Exact(vec![ts(Some("UTC".into())), ts(Some("UTC".into()))]),
        TypeSignature::Exact(vec![DataType::Date32, DataType::Date32]),
    ]
}

/// `make_interval(years, months, weeks, days, hours, mins, secs)`, every argument optional.
fn make_interval(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let n = args.number_rows;
    let ints: Vec<PrimitiveArray<Int64Type>> = a
        .iter()
        .take(6)
        .map(|c| {
            arrow::compute::cast(c, &DataType::Int64).map(|c| c.as_primitive::<Int64Type>().clone())
        })
        .collect::<std::result::Result<_, _>>()?;
    let secs: Option<Float64Array> = a
        .get(6)
        .map(|c| {
            arrow::compute::cast(c, &DataType::Float64)
                .map(|c| c.as_primitive::<Float64Type>().clone())
        })
        .transpose()?;
    let mut b = IntervalMonthDayNanoBuilder::with_capacity(n);
    'rows: for row in 0..n {
        let mut field = [0i64; 6];
        for (k, column) in ints.iter().enumerate() {
            if column.is_null(row) {
                b.append_null();
                continue 'rows;
            }
            field[k] = column.value(row);
        }
        let seconds = match &secs {
            Some(s) if s.is_null(row) => {
                b.append_null();
                continue 'rows;
            }
            Some(s) => s.value(row),
            None => 0.0,
        };
        let months = field[0]
            .checked_mul(12)
            .and_then(|m| m.checked_add(field[1]))
            .and_then(|m| i32::try_from(m).ok());
        let days = field[2]
            .checked_mul(7)
            .and_then(|d| d.checked_add(field[3]))
            .and_then(|d| i32::try_from(d).ok());
        let micros = (field[4] as f64 * 3600.0 + field[5] as f64 * 60.0 + seconds)
            * MICROS_PER_SECOND as f64;
        let (Some(months), Some(days)) = (months, days) else {
            return Err(out_of_range());
        };
        if !micros.is_finite() || micros.abs() > 9.2e18 {
            return Err(out_of_range());
        }
        b.append_value(from_interval(Interval {
            months,
            days,
            micros: micros.round_ties_even() as i64,
        }));
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

pub fn functions() -> Vec<ScalarUDF> {
    let interval_number = || {
        Signature::one_of(
            vec![TypeSignature::Exact(vec![INTERVAL, DataType::Float64])],
            IMMUTABLE,
        )
    };
    let one_interval = || Signature::exact(vec![INTERVAL], IMMUTABLE);
    let make_interval_signature = Signature::one_of(
        (0..=7)
            .map(|n| {
                TypeSignature::Exact(
                    (0..n)
                        .map(|k| {
                            if k == 6 {
                                DataType::Float64
                            } else {
                                DataType::Int64
                            }
                        })
                        .collect(),
                )
            })
            .collect(),
        IMMUTABLE,
    );
    let key = PgFunction::new(
        COMPARISON_KEY,
        one_interval(),
        DataType::Decimal128(38, 0),
        |args| {
            let spans = intervals(&arrays(args)?[0])?;
            let mut b =
                Decimal128Builder::with_capacity(spans.len()).with_precision_and_scale(38, 0)?;
            for v in spans.as_primitive::<IntervalMonthDayNanoType>().iter() {
                b.append_option(v.map(|v| comparison_key(to_interval(v))));
            }
            Ok(ColumnarValue::Array(Arc::new(b.finish())))
        },
    );
    vec![
        PgFunction::new(MUL, interval_number(), INTERVAL, |args| {
            interval_and_factor(args, multiply)
        })
        .named(operator_name("*"))
        .udf(),
        PgFunction::new(DIV, interval_number(), INTERVAL, |args| {
            interval_and_factor(args, divide)
        })
        .named(operator_name("/"))
        .udf(),
        PgFunction::new(
            TIMESTAMP_DIFF,
            Signature::one_of(timestamp_types(), IMMUTABLE),
            INTERVAL,
            |args| {
                two_timestamps(args, |a, b| {
                    Ok(justify_hours(Interval {
                        micros: a.checked_sub(b).ok_or_else(out_of_range)?,
                        ..Interval::default()
                    }))
                })
            },
        )
        .named(operator_name("-"))
        .udf(),
        PgFunction::new(
            "age",
            Signature::one_of(timestamp_types(), IMMUTABLE),
            INTERVAL,
            |args| two_timestamps(args, |a, b| age(a, b).ok_or_else(out_of_range)),
        )
        .udf(),
        PgFunction::new("justify_hours", one_interval(), INTERVAL, |args| {
            map_intervals(args, justify_hours)
        })
        .udf(),
        PgFunction::new("justify_days", one_interval(), INTERVAL, |args| {
            map_intervals(args, justify_days)
        })
        .udf(),
        PgFunction::new("justify_interval", one_interval(), INTERVAL, |args| {
            map_intervals(args, justify_interval)
        })
        .udf(),
        PgFunction::new(
            "make_interval",
            make_interval_signature,
            INTERVAL,
            make_interval,
        )
        .udf(),
        key.udf(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(months: i32, days: i32, micros: i64) -> Interval {
        Interval {
            months,
            days,
            micros,
        }
    }

    #[test]
    fn arithmetic_like_postgres() {
        assert_eq!(multiply(iv(1, 0, 0), 1.5).unwrap(), iv(1, 15, 0));
        assert_eq!(
            multiply(iv(0, 0, 3_600_000_000), 1.5).unwrap(),
            iv(0, 0, 5_400_000_000)
        );
        assert_eq!(divide(iv(0, 1, 0), 3.0).unwrap(), iv(0, 0, 28_800_000_000));
        assert_eq!(
            justify_hours(iv(0, 0, 27 * 3_600_000_000)),
            iv(0, 1, 3 * 3_600_000_000)
        );
        assert_eq!(justify_days(iv(0, 35, 0)), iv(1, 5, 0));
        assert_eq!(justify_interval(iv(1, -1, 0)), iv(0, 29, 0));
        assert!(divide(iv(0, 1, 0), 0.0).is_err());
    }

    #[test]
    fn age_borrows_from_the_month() {
        let us = |y, m, d| {
            NaiveDate::from_ymd_opt(y, m, d)
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap()
                .and_utc()
                .timestamp_micros()
        };
        assert_eq!(age(us(2026, 3, 1), us(2025, 1, 15)), Some(iv(13, 17, 0)));
        assert_eq!(age(us(2026, 3, 1), us(2026, 1, 31)), Some(iv(1, 1, 0)));
        assert_eq!(age(us(2025, 1, 15), us(2026, 3, 1)), Some(iv(-13, -17, 0)));
    }
}
