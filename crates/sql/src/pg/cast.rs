//! Casts with PostgreSQL's semantics where Arrow's differ: to text (PostgreSQL's text forms),
//! to integers (floats round half to even as `rint` does, numerics half away from zero, and
//! out-of-range values are 22003), to numeric (rounding, "numeric field overflow"), and from
//! text to every type (PostgreSQL's input syntax and its error codes).
//!
//! Entry points: [`explicit`] decides which casts Eddy evaluates itself and builds the call of
//! `eddy_cast`; [`output_text`] is the implicit conversion to text (`'a' || 1`).

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder,
    Float32Builder, Float64Builder, Int16Builder, Int32Builder, Int64Builder,
    IntervalMonthDayNanoBuilder, PrimitiveBuilder, StringBuilder, Time64MicrosecondBuilder,
};
use arrow::datatypes::{
    ArrowTimestampType, DataType, Decimal128Type, Field, Float32Type, Float64Type,
    IntervalMonthDayNano, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType,
};
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, Signature, TypeSignature, lit,
};
use eddy_common::{Error, SqlState};

use super::datetime_in::{self, MICROS_PER_SECOND};
use super::decimal;
use super::text::{TextOptions, TimeZone, is_null, local_time, text_value};
use super::udf::{
    IMMUTABLE, PgFunction, Result, arrays, constant_text, first_argument_name, pg_field,
};

pub const CAST: &str = "eddy_cast";
pub const OUTPUT_TEXT: &str = "eddy_output_text";

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn is_integer(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
    )
}

fn integer_width(t: &DataType) -> u8 {
    match t {
        DataType::Int8 | DataType::UInt8 => 1,
        DataType::Int16 | DataType::UInt16 => 2,
        DataType::Int32 | DataType::UInt32 => 4,
        _ => 8,
    }
}

/// Whether Eddy evaluates a cast from `from` to `to` itself (PostgreSQL's semantics differ
/// from Arrow's there).
fn handled(from: &DataType, to: &DataType) -> bool {
    if from == to || from == &DataType::Null {
        return false;
    }
    match to {
        t if is_string(t) => !is_string(from),
        DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            matches!(
                from,
                DataType::Float32 | DataType::Float64 | DataType::Decimal128(..)
            ) || is_string(from)
                || is_integer(from) && integer_width(from) > integer_width(to)
        }
        DataType::Decimal128(..) => {
            is_string(from)
                || is_integer(from)
                || matches!(
                    from,
                    DataType::Float32 | DataType::Float64 | DataType::Decimal128(..)
                )
        }
        DataType::Float32 => {
            is_string(from) || matches!(from, DataType::Decimal128(..) | DataType::Float64)
        }
        DataType::Float64 => is_string(from) || matches!(from, DataType::Decimal128(..)),
        DataType::Boolean | DataType::Date32 | DataType::Binary => is_string(from),
        DataType::Time64(_) => is_string(from) || matches!(from, DataType::Interval(_)),
        DataType::Interval(_) => is_string(from),
        DataType::List(_) => is_string(from),
        DataType::Timestamp(_, zone) => {
            is_string(from)
                || matches!(
                    (from, zone),
                    (DataType::Timestamp(_, None), Some(_))
                        | (DataType::Timestamp(_, Some(_)), None)
                        | (DataType::Date32, Some(_))
                )
        }
        _ => false,
    }
}

/// `expr::to` as Eddy evaluates it, when PostgreSQL's cast differs from Arrow's.
pub fn explicit(cast: &ScalarUDF, expr: Expr, from: &DataType, to: &DataType) -> Option<Expr> {
    handled(from, to).then(|| cast.call(vec![expr, lit(to.to_string())]))
}

/// The text a value shows as when PostgreSQL converts it implicitly (`'a' || true` is `at`).
pub fn output_text(udf: &ScalarUDF, expr: Expr, from: &DataType) -> Option<Expr> {
    (!is_string(from) && from != &DataType::Null).then(|| udf.call(vec![expr]))
}

pub fn functions() -> Vec<ScalarUDF> {
    let cast = PgFunction::with_return(
        CAST,
        Signature::any(2, IMMUTABLE),
        |args| {
            let to: DataType = constant_text(args, 1)
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| {
                    super::udf::error(
                        SqlState::UNDEFINED_FUNCTION,
                        format!("{CAST} takes a value and the name of an Arrow type"),
                    )
                })?;
            Ok(Field::new("", to, true))
        },
        |args| evaluate(args, true),
    )
    .named(first_argument_name);
    let output = PgFunction::new(
        OUTPUT_TEXT,
        Signature::any(1, IMMUTABLE),
        DataType::Utf8,
        |args| evaluate(args, false),
    )
    .named(first_argument_name);
    // An unconstrained numeric: Arrow's fixed scale, printed without its trailing zeros.
    let numeric = PgFunction::with_return(
        super::ast::TO_NUMERIC,
        Signature::any(1, IMMUTABLE),
        |_| {
            Ok(pg_field(
                "",
                DataType::Decimal128(decimal::PRECISION_MAX, crate::types::NUMERIC_DEFAULT_SCALE),
                "numeric",
            ))
        },
        |args| evaluate(args, true),
    );
    vec![
        cast.udf(),
        output.udf(),
        numeric.udf(),
        character(super::ast::TO_VARCHAR, false),
        character(super::ast::TO_BPCHAR, true),
    ]
}

/// `x::varchar(n)` (truncated to n characters) and `x::char(n)` (also blank-padded to n).
fn character(name: &'static str, padded: bool) -> ScalarUDF {
    PgFunction::with_return(
        name,
        Signature::one_of(
            vec![TypeSignature::Any(1), TypeSignature::Any(2)],
            IMMUTABLE,
        ),
        move |args| {
            let pg = match (super::udf::constant(args, 1), padded) {
                (Some(n), true) => format!("character({n})"),
                (Some(n), false) => format!("character varying({n})"),
                (None, _) => "character varying".to_owned(),
            };
            Ok(pg_field("", DataType::Utf8, &pg))
        },
        move |args| {
            let a = arrays(args)?;
            let zone = session_zone(args);
            // Without a length (`::varchar`) nothing is cut.
            let unlimited: ArrayRef =
                Arc::new(arrow::array::Int64Array::from(vec![i64::MAX; a[0].len()]));
            let lengths = arrow::compute::cast(a.get(1).unwrap_or(&unlimited), &DataType::Int64)?;
            let lengths = lengths.as_primitive::<arrow::datatypes::Int64Type>();
            let options = TextOptions {
                bool_words: true,
                ..TextOptions::output(zone)
            };
            let mut b = StringBuilder::with_capacity(a[0].len(), a[0].len() * 8);
            for i in 0..a[0].len() {
                if is_null(&a[0], i) || lengths.is_null(i) {
                    b.append_null();
                    continue;
                }
                let text = text_value(&a[0], i, options).map_err(external)?;
                let n = usize::try_from(lengths.value(i)).unwrap_or(0);
                let s: String = text.chars().take(n).collect();
                // char(n) is kept without its blanks and padded when shown (TextOptions::blank_pad).
                b.append_value(if padded {
                    s.trim_end_matches(' ')
                } else {
                    s.as_str()
                });
            }
            Ok(ColumnarValue::Array(Arc::new(b.finish())))
        },
    )
    .udf()
}

pub fn session_zone(args: &ScalarFunctionArgs) -> TimeZone {
    TimeZone::from_config(args.config_options.execution.time_zone.as_deref())
}

fn evaluate(args: &ScalarFunctionArgs, explicit: bool) -> Result<ColumnarValue> {
    let input = arrays(args)?.swap_remove(0);
    let zone = session_zone(args);
    let to = args.return_type().clone();
    let out: ArrayRef = if is_string(&to) {
        let trim_numeric = super::text::is_unconstrained_numeric(&args.arg_fields[0]);
        let options = TextOptions {
            trim_numeric,
            bool_words: explicit,
            ..TextOptions::output(zone)
        };
        let mut b = StringBuilder::with_capacity(input.len(), input.len() * 8);
        for i in 0..input.len() {
            if is_null(&input, i) {
                b.append_null()
            } else {
                b.append_value(text_value(&input, i, options).map_err(external)?)
            }
        }
        let text: ArrayRef = Arc::new(b.finish());
        arrow::compute::cast(&text, &to)?
    } else if is_string(input.data_type()) {
        let strings = arrow::compute::cast(&input, &DataType::Utf8)?;
        from_text(strings.as_string::<i32>(), &to, zone)?
    } else {
        convert(&input, &to, zone)?
    };
    Ok(ColumnarValue::Array(out))
}

pub fn external(e: Error) -> datafusion::common::DataFusionError {
    datafusion::common::DataFusionError::External(Box::new(e))
}

/// Maps each non-NULL string through `parse` into a builder.
fn parse_each<B: arrow::array::ArrayBuilder, T>(
    strings: &arrow::array::StringArray,
    mut builder: B,
    parse: impl Fn(&str) -> eddy_common::Result<T>,
    append: impl Fn(&mut B, Option<T>),
) -> Result<ArrayRef> {
    for s in strings.iter() {
        let value = s.map(&parse).transpose().map_err(external)?;
        append(&mut builder, value);
    }
    Ok(Arc::new(builder.finish()))
}

fn int_out_of_range(to: &DataType) -> Error {
    let name = match to {
        DataType::Int16 => "smallint",
        DataType::Int32 => "integer",
        _ => "bigint",
    };
    Error::new(
        SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        format!("{name} out of range"),
    )
}

fn int_bounds(to: &DataType) -> (i128, i128) {
    match to {
        DataType::Int16 => (i128::from(i16::MIN), i128::from(i16::MAX)),
        DataType::Int32 => (i128::from(i32::MIN), i128::from(i32::MAX)),
        _ => (i128::from(i64::MIN), i128::from(i64::MAX)),
    }
}

fn parse_int(text: &str, to: &DataType) -> eddy_common::Result<i128> {
    let name = match to {
        DataType::Int16 => "smallint",
        DataType::Int32 => "integer",
        _ => "bigint",
    };
    let t = text.trim();
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::new(
            SqlState::INVALID_TEXT_REPRESENTATION,
            format!("invalid input syntax for type {name}: \"{text}\""),
        ));
    }
    let (lo, hi) = int_bounds(to);
    match t.parse::<i128>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(Error::new(
            SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
            format!("value \"{text}\" is out of range for type {name}"),
        )),
    }
}

fn parse_float(text: &str, single: bool) -> eddy_common::Result<f64> {
    let name = if single { "real" } else { "double precision" };
    let t = text.trim();
    let v: f64 = t.parse().map_err(|_| {
        Error::new(
            SqlState::INVALID_TEXT_REPRESENTATION,
            format!("invalid input syntax for type {name}: \"{text}\""),
        )
    })?;
    let written_infinite = t
        .trim_start_matches(['+', '-'])
        .to_ascii_lowercase()
        .starts_with("inf");
    let overflows = if single {
        (v as f32).is_infinite()
    } else {
        v.is_infinite()
    };
    if overflows && !written_infinite {
        return Err(Error::new(
            SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
            format!("\"{t}\" is out of range for type {name}"),
        ));
    }
    Ok(v)
}

/// PostgreSQL's boolean input: `t`, `true`, `yes`, `on`, `1` and their opposites, or any
/// unambiguous prefix of the words.
fn parse_bool(text: &str) -> eddy_common::Result<bool> {
    let t = text.trim().to_ascii_lowercase();
    let prefix_of = |word: &str, min: usize| t.len() >= min && word.starts_with(&t);
    if prefix_of("true", 1) || prefix_of("yes", 1) || t == "on" || t == "1" {
        Ok(true)
    } else if prefix_of("false", 1) || prefix_of("no", 1) || prefix_of("off", 2) || t == "0" {
        Ok(false)
    } else {
        Err(Error::new(
            SqlState::INVALID_TEXT_REPRESENTATION,
            format!("invalid input syntax for type boolean: \"{text}\""),
        ))
    }
}

/// PostgreSQL's bytea input: `\x` and hex digits, or the escape form (`\\`, `\ooo`).
pub fn parse_bytea(text: &str) -> eddy_common::Result<Vec<u8>> {
    let invalid = || {
        Error::new(
            SqlState::INVALID_TEXT_REPRESENTATION,
            "invalid input syntax for type bytea",
        )
    };
    if let Some(hex) = text.strip_prefix("\\x") {
        let digits: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        if !digits.len().is_multiple_of(2) {
            return Err(Error::new(
                SqlState::INVALID_TEXT_REPRESENTATION,
                "invalid hexadecimal data: odd number of digits",
            ));
        }
        return digits
            .chunks(2)
            .map(|pair| {
                std::str::from_utf8(pair)
                    .ok()
                    .and_then(|p| u8::from_str_radix(p, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| {
                Error::new(
                    SqlState::INVALID_TEXT_REPRESENTATION,
                    "invalid hexadecimal digit",
                )
            });
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            out.push(bytes[i]);
            i += 1;
        } else if bytes.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else {
            let octal = bytes
                .get(i + 1..i + 4)
                .and_then(|o| std::str::from_utf8(o).ok())
                .and_then(|o| u8::from_str_radix(o, 8).ok());
            out.push(octal.ok_or_else(invalid)?);
            i += 4;
        }
    }
    Ok(out)
}

fn timestamp_builder_array(
    values: Vec<Option<i64>>,
    unit: TimeUnit,
    zone: Option<Arc<str>>,
) -> ArrayRef {
    fn build<T: ArrowTimestampType>(values: Vec<Option<i64>>, zone: Option<Arc<str>>) -> ArrayRef {
        Arc::new(
            values
                .into_iter()
                .collect::<arrow::array::PrimitiveArray<T>>()
                .with_timezone_opt(zone),
        )
    }
    match unit {
        TimeUnit::Second => build::<TimestampSecondType>(
            values
                .into_iter()
                .map(|v| v.map(|us| us.div_euclid(MICROS_PER_SECOND)))
                .collect(),
            zone,
        ),
        TimeUnit::Millisecond => build::<TimestampMillisecondType>(
            values
                .into_iter()
                .map(|v| v.map(|us| us.div_euclid(1000)))
                .collect(),
            zone,
        ),
        TimeUnit::Microsecond => build::<TimestampMicrosecondType>(values, zone),
        TimeUnit::Nanosecond => build::<TimestampNanosecondType>(
            values
                .into_iter()
                .map(|v| v.and_then(|us| us.checked_mul(1000)))
                .collect(),
            zone,
        ),
    }
}

/// Text values read with PostgreSQL's input syntax into a column of `to` (COPY, text-format
/// parameters); `None` for types without an Eddy reader, which Arrow's cast then reads.
/// Timestamps without a zone are taken to be in `zone`.
pub fn parse_text(
    strings: &arrow::array::StringArray,
    to: &DataType,
    zone: TimeZone,
) -> Option<eddy_common::Result<ArrayRef>> {
    let supported = matches!(
        to,
        DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Decimal128(..)
            | DataType::Float32
            | DataType::Float64
            | DataType::Boolean
            | DataType::Binary
            | DataType::Date32
            | DataType::Time64(_)
            | DataType::Interval(_)
            | DataType::Timestamp(..)
            | DataType::List(_)
    );
    supported.then(|| from_text(strings, to, zone).map_err(crate::error::from_datafusion))
}

fn from_text(
    strings: &arrow::array::StringArray,
    to: &DataType,
    zone: TimeZone,
) -> Result<ArrayRef> {
    let n = strings.len();
    match to {
        DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            let values = strings
                .iter()
                .map(|s| s.map(|s| parse_int(s, to)).transpose())
                .collect::<eddy_common::Result<Vec<_>>>()
                .map_err(external)?;
            ints(values, to)
        }
        DataType::Decimal128(p, s) => {
            let (p, s) = (*p, *s);
            let builder = Decimal128Builder::with_capacity(n).with_precision_and_scale(p, s)?;
            parse_each(
                strings,
                builder,
                |t| {
                    decimal::parse(t, s).and_then(|v| {
                        if decimal::fits(v, p) {
                            Ok(v)
                        } else {
                            Err(decimal::overflow())
                        }
                    })
                },
                |b, v| b.append_option(v),
            )
        }
        DataType::Float64 => parse_each(
            strings,
            Float64Builder::with_capacity(n),
            |t| parse_float(t, false),
            |b, v| b.append_option(v),
        ),
        DataType::Float32 => parse_each(
            strings,
            Float32Builder::with_capacity(n),
            |t| parse_float(t, true).map(|v| v as f32),
            |b, v| b.append_option(v),
        ),
        DataType::Boolean => parse_each(
            strings,
            BooleanBuilder::with_capacity(n),
            parse_bool,
            |b, v| b.append_option(v),
        ),
        DataType::Binary => parse_each(
            strings,
            BinaryBuilder::with_capacity(n, n * 8),
            parse_bytea,
            |b, v| b.append_option(v),
        ),
        DataType::Date32 => parse_each(
            strings,
            Date32Builder::with_capacity(n),
            |t| datetime_in::parse_date(t).map(datetime_in::days_since_epoch),
            |b, v| b.append_option(v),
        ),
        DataType::Time64(_) => {
            let out = parse_each(
                strings,
                Time64MicrosecondBuilder::with_capacity(n),
                datetime_in::parse_time,
                |b, v| b.append_option(v),
            )?;
            Ok(arrow::compute::cast(&out, to)?)
        }
        DataType::Interval(_) => {
            let out = parse_each(
                strings,
                IntervalMonthDayNanoBuilder::with_capacity(n),
                datetime_in::parse_interval,
                |b, v| {
                    b.append_option(v.map(|i| {
                        IntervalMonthDayNano::new(i.months, i.days, i.micros.saturating_mul(1000))
                    }))
                },
            )?;
            Ok(arrow::compute::cast(&out, to)?)
        }
        DataType::Timestamp(unit, tz) => {
            let kind = if tz.is_some() {
                "timestamp with time zone"
            } else {
                "timestamp"
            };
            let mut values = Vec::with_capacity(n);
            for s in strings.iter() {
                values.push(match s {
                    None => None,
                    Some(t) => {
                        let written = datetime_in::parse_timestamp(t, kind).map_err(external)?;
                        // A timestamp without time zone ignores a written zone, as PostgreSQL does.
                        let us = if tz.is_some() {
                            written.utc_micros(zone)
                        } else {
                            Some(written.local.and_utc().timestamp_micros())
                        };
                        Some(us.ok_or_else(|| {
                            external(Error::new(
                                SqlState::DATETIME_FIELD_OVERFLOW,
                                format!("timestamp out of range: \"{t}\""),
                            ))
                        })?)
                    }
                });
            }
            Ok(timestamp_builder_array(values, *unit, tz.clone()))
        }
        DataType::List(element) => {
            super::array::from_text(strings, element, |elements, t| match t {
                t if is_string(t) => Ok(arrow::compute::cast(elements, t)?),
                t => from_text(elements, t, zone),
            })
        }
        other => Err(external(Error::internal(format!(
            "no text input for {other}"
        )))),
    }
}

fn ints(values: Vec<Option<i128>>, to: &DataType) -> Result<ArrayRef> {
    fn build<T: arrow::datatypes::ArrowPrimitiveType>(
        values: &[Option<i128>],
        builder: PrimitiveBuilder<T>,
        narrow: impl Fn(i128) -> T::Native,
    ) -> ArrayRef {
        let mut b = builder;
        for v in values {
            b.append_option(v.map(&narrow));
        }
        Arc::new(b.finish())
    }
    // Callers checked the bounds.
    Ok(match to {
        DataType::Int16 => build(&values, Int16Builder::new(), |v| v as i16),
        DataType::Int32 => build(&values, Int32Builder::new(), |v| v as i32),
        _ => build(&values, Int64Builder::new(), |v| v as i64),
    })
}

/// Numbers to an integer type: floats round half to even (rint), numerics half away from
/// zero, and anything out of the type's range is 22003, as in PostgreSQL.
fn to_integer(input: &ArrayRef, to: &DataType) -> Result<ArrayRef> {
    let (lo, hi) = int_bounds(to);
    let check = |r: i128| {
        if (lo..=hi).contains(&r) {
            Ok(r)
        } else {
            Err(int_out_of_range(to))
        }
    };
    let values = match input.data_type() {
        DataType::Float32 | DataType::Float64 => {
            let floats = arrow::compute::cast(input, &DataType::Float64)?;
            floats
                .as_primitive::<Float64Type>()
                .iter()
                .map(|v| {
                    v.map(|f| {
                        let r = f.round_ties_even();
                        if r.is_nan() || r < lo as f64 || r > hi as f64 {
                            Err(int_out_of_range(to))
                        } else {
                            Ok(r as i128)
                        }
                    })
                    .transpose()
                })
                .collect::<eddy_common::Result<Vec<_>>>()
        }
        DataType::Decimal128(_, scale) => input
            .as_primitive::<Decimal128Type>()
            .iter()
            .map(|v| {
                v.map(|d| {
                    decimal::rescale(d, *scale, 0)
                        .ok_or_else(|| int_out_of_range(to))
                        .and_then(check)
                })
                .transpose()
            })
            .collect::<eddy_common::Result<Vec<_>>>(),
        _ => {
            let wide = arrow::compute::cast(input, &DataType::Int64)?;
            wide.as_primitive::<arrow::datatypes::Int64Type>()
                .iter()
                .map(|v| v.map(|x| check(i128::from(x))).transpose())
                .collect::<eddy_common::Result<Vec<_>>>()
        }
    };
    ints(values.map_err(external)?, to)
}

/// Casts between non-text types that PostgreSQL evaluates differently from Arrow.
fn convert(input: &ArrayRef, to: &DataType, zone: TimeZone) -> Result<ArrayRef> {
    match (input.data_type(), to) {
        (_, DataType::Int16 | DataType::Int32 | DataType::Int64) => to_integer(input, to),
        (from, DataType::Decimal128(p, s)) => to_decimal(input, from, *p, *s),
        (DataType::Decimal128(_, scale), DataType::Float32 | DataType::Float64) => {
            // Through the decimal digits, so 1e100::float8 is the double nearest 10^100.
            let floats: arrow::array::Float64Array = input
                .as_primitive::<Decimal128Type>()
                .iter()
                .map(|v| {
                    v.map(|d| {
                        super::text::decimal_text(d, *scale)
                            .parse::<f64>()
                            .unwrap_or(f64::NAN)
                    })
                })
                .collect();
            let floats: ArrayRef = Arc::new(floats);
            Ok(arrow::compute::cast(&floats, to)?)
        }
        (DataType::Timestamp(..) | DataType::Date32, DataType::Timestamp(unit, tz)) => {
            retime(input, *unit, tz.clone(), zone)
        }
        (DataType::Float64, DataType::Float32) => {
            // Out of real's range is an error, not infinity or zero.
            let mut out = Vec::with_capacity(input.len());
            for v in input.as_primitive::<Float64Type>().iter() {
                out.push(match v {
                    Some(f) if f.is_finite() && (f as f32).is_infinite() => {
                        return Err(external(Error::new(
                            SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                            "value out of range: overflow",
                        )));
                    }
                    Some(f) if f != 0.0 && (f as f32) == 0.0 => {
                        return Err(external(Error::new(
                            SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                            "value out of range: underflow",
                        )));
                    }
                    v => v.map(|f| f as f32),
                });
            }
            Ok(Arc::new(arrow::array::Float32Array::from(out)))
        }
        (DataType::Interval(_), DataType::Time64(_)) => {
            // The time of day of the interval's time part, as PostgreSQL's interval_time.
            let spans = arrow::compute::cast(
                input,
                &DataType::Interval(arrow::datatypes::IntervalUnit::MonthDayNano),
            )?;
            let day = 86_400 * MICROS_PER_SECOND;
            let times: arrow::array::Time64MicrosecondArray = spans
                .as_primitive::<arrow::datatypes::IntervalMonthDayNanoType>()
                .iter()
                .map(|v| v.map(|v| (v.nanoseconds / 1000).rem_euclid(day)))
                .collect();
            let times: ArrayRef = Arc::new(times);
            Ok(arrow::compute::cast(&times, to)?)
        }
        (from, to) => Err(external(Error::internal(format!(
            "no cast from {from} to {to}"
        )))),
    }
}

fn to_decimal(input: &ArrayRef, from: &DataType, precision: u8, scale: i8) -> Result<ArrayRef> {
    let mut b =
        Decimal128Builder::with_capacity(input.len()).with_precision_and_scale(precision, scale)?;
    let each = |b: &mut Decimal128Builder, v: Option<eddy_common::Result<i128>>| -> Result<()> {
        let v = v.transpose().map_err(external)?;
        match v {
            Some(v) if !decimal::fits(v, precision) => Err(external(decimal::overflow())),
            v => {
                b.append_option(v);
                Ok(())
            }
        }
    };
    match from {
        DataType::Decimal128(_, from_scale) => {
            for v in input.as_primitive::<Decimal128Type>().iter() {
                each(
                    &mut b,
                    v.map(|d| {
                        decimal::rescale(d, *from_scale, scale).ok_or_else(decimal::overflow)
                    }),
                )?;
            }
        }
        DataType::Float32 => {
            for v in input.as_primitive::<Float32Type>().iter() {
                each(
                    &mut b,
                    v.map(|f| decimal::from_float(f64::from(f), 6, scale)),
                )?;
            }
        }
        DataType::Float64 => {
            for v in input.as_primitive::<Float64Type>().iter() {
                each(&mut b, v.map(|f| decimal::from_float(f, 15, scale)))?;
            }
        }
        _ => {
            let wide = arrow::compute::cast(input, &DataType::Int64)?;
            for v in wide.as_primitive::<arrow::datatypes::Int64Type>().iter() {
                each(
                    &mut b,
                    v.map(|x| {
                        decimal::rescale(i128::from(x), 0, scale).ok_or_else(decimal::overflow)
                    }),
                )?;
            }
        }
    }
    Ok(Arc::new(b.finish()))
}

/// Timestamps to and from timestamptz (and dates to timestamptz) through the session's zone:
/// a timestamp without time zone is a local time there, as in PostgreSQL.
fn retime(
    input: &ArrayRef,
    unit: TimeUnit,
    tz: Option<Arc<str>>,
    zone: TimeZone,
) -> Result<ArrayRef> {
    let from_zoned = matches!(input.data_type(), DataType::Timestamp(_, Some(_)));
    let micros = arrow::compute::cast(input, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
    let values: Vec<Option<i64>> = micros
        .as_primitive::<TimestampMicrosecondType>()
        .iter()
        .map(|v| {
            v.and_then(|us| {
                if from_zoned {
                    local_time(us, zone).map(|(local, _)| local.and_utc().timestamp_micros())
                } else {
                    let local = super::text::naive_from_us(us)?;
                    datetime_in::WrittenTimestamp { local, zone: None }.utc_micros(zone)
                }
            })
        })
        .collect();
    Ok(timestamp_builder_array(values, unit, tz))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs() {
        assert_eq!(parse_int(" 42 ", &DataType::Int32).unwrap(), 42);
        assert_eq!(
            parse_int("abc", &DataType::Int32).unwrap_err().state,
            SqlState::INVALID_TEXT_REPRESENTATION
        );
        assert_eq!(
            parse_int("9999999999", &DataType::Int32).unwrap_err().state,
            SqlState::NUMERIC_VALUE_OUT_OF_RANGE
        );
        assert!(parse_bool("yes").unwrap());
        assert!(!parse_bool("of").unwrap());
        assert!(parse_bool("o").is_err());
        assert_eq!(parse_bytea("\\x414243").unwrap(), b"ABC");
        assert_eq!(parse_bytea("a\\\\b\\101").unwrap(), b"a\\bA");
        assert_eq!(
            parse_float("1e400", false).unwrap_err().state,
            SqlState::NUMERIC_VALUE_OUT_OF_RANGE
        );
        assert!(parse_float("-Infinity", false).unwrap().is_infinite());
        assert!(
            "Timestamp(ns)".parse::<DataType>().is_ok()
                || "Timestamp(Nanosecond, None)".parse::<DataType>().is_ok()
        );
        let ty = DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into()));
        assert_eq!(ty.to_string().parse::<DataType>().unwrap(), ty);
    }
}
