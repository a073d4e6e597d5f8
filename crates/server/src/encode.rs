//! Arrow values on the PostgreSQL wire: type OIDs, text rendering as PostgreSQL prints values,
//! and the binary formats drivers ask for.
//!
//! Arrow's own display differs from PostgreSQL's (`true` vs `t`, `2.0` vs `2`, timestamptz
//! offsets), so every type is rendered here, column by column (no per-value dispatch on type).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Field, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    IntervalMonthDayNanoType, IntervalUnit, Time64MicrosecondType, TimeUnit, UInt8Type, UInt16Type, UInt32Type,
    UInt64Type,
};
use bytes::{BufMut, BytesMut};
use chrono::{DateTime, NaiveDate, NaiveDateTime, Offset, TimeZone as _, Timelike};
use eddy_common::{Error, Result};
use eddy_engine::{PG_TYPE_KEY, TimeZone};
use pgwire::api::Type;
use pgwire::api::results::{FieldFormat, FieldInfo};
use pgwire::messages::data::DataRow;

/// Microseconds between 1970-01-01 and PostgreSQL's epoch 2000-01-01.
const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;
const PG_EPOCH_OFFSET_DAYS: i32 = 10_957;

/// The PostgreSQL type of an Arrow field.
pub fn pg_type(field: &Field) -> Type {
    if let Some(declared) = field.metadata().get(PG_TYPE_KEY) {
        let declared = declared.as_str();
        if declared == "jsonb" {
            return Type::JSONB;
        }
        if declared == "json" {
            return Type::JSON;
        }
        if declared.starts_with("character varying") {
            return Type::VARCHAR;
        }
        if declared.starts_with("character(") {
            return Type::BPCHAR;
        }
    }
    match field.data_type() {
        DataType::Boolean => Type::BOOL,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => Type::INT2,
        DataType::Int32 | DataType::UInt16 => Type::INT4,
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => Type::INT8,
        DataType::Float16 | DataType::Float32 => Type::FLOAT4,
        DataType::Float64 => Type::FLOAT8,
        DataType::Decimal128(..) | DataType::Decimal256(..) => Type::NUMERIC,
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_) => Type::BYTEA,
        DataType::Date32 | DataType::Date64 => Type::DATE,
        DataType::Time32(_) | DataType::Time64(_) => Type::TIME,
        DataType::Timestamp(_, None) => Type::TIMESTAMP,
        DataType::Timestamp(_, Some(_)) => Type::TIMESTAMPTZ,
        DataType::Interval(_) | DataType::Duration(_) => Type::INTERVAL,
        _ => Type::TEXT,
    }
}

/// The Arrow type Eddy uses for values of a PostgreSQL type (parameters sent by clients).
pub fn arrow_type(pg: &Type) -> DataType {
    match *pg {
        Type::BOOL => DataType::Boolean,
        Type::INT2 => DataType::Int16,
        Type::INT4 | Type::OID => DataType::Int32,
        Type::INT8 => DataType::Int64,
        Type::FLOAT4 => DataType::Float32,
        Type::FLOAT8 => DataType::Float64,
        Type::NUMERIC => DataType::Decimal128(38, 10),
        Type::BYTEA => DataType::Binary,
        Type::DATE => DataType::Date32,
        Type::TIME => DataType::Time64(TimeUnit::Microsecond),
        Type::TIMESTAMP => DataType::Timestamp(TimeUnit::Microsecond, None),
        Type::TIMESTAMPTZ => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        Type::INTERVAL => DataType::Interval(IntervalUnit::MonthDayNano),
        _ => DataType::Utf8,
    }
}

pub fn field_infos(schema: &arrow::datatypes::Schema, format_for: impl Fn(usize) -> FieldFormat) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| FieldInfo::new(f.name().clone(), None, None, pg_type(f), format_for(i)))
        .collect()
}

/// Encodes every row of a batch into DataRows.
pub fn encode_batch(batch: &RecordBatch, formats: &[FieldFormat], tz: TimeZone) -> Result<Vec<DataRow>> {
    let n = batch.num_rows();
    let columns = batch.num_columns();
    // Render column by column into per-row buffers.
    let mut cells: Vec<Vec<Option<Vec<u8>>>> = Vec::with_capacity(columns);
    for (c, column) in batch.columns().iter().enumerate() {
        let field = batch.schema().field(c).clone();
        let format = formats.get(c).copied().unwrap_or(FieldFormat::Text);
        cells.push(encode_column(column, &field, format, tz)?);
    }
    let mut rows = Vec::with_capacity(n);
    for r in 0..n {
        let mut buf = BytesMut::with_capacity(16 * columns);
        for column in &mut cells {
            match column[r].take() {
                None => buf.put_i32(-1),
                Some(bytes) => {
                    buf.put_i32(bytes.len() as i32);
                    buf.put_slice(&bytes);
                }
            }
        }
        rows.push(DataRow::new(buf, columns as i16));
    }
    Ok(rows)
}

fn encode_column(column: &ArrayRef, field: &Field, format: FieldFormat, tz: TimeZone) -> Result<Vec<Option<Vec<u8>>>> {
    let n = column.len();
    let mut out = Vec::with_capacity(n);
    match format {
        FieldFormat::Text => {
            let unconstrained_numeric = field.metadata().get(PG_TYPE_KEY).is_some_and(|t| t == "numeric");
            for i in 0..n {
                out.push(if column.is_null(i) {
                    None
                } else {
                    Some(text_value(column, i, tz, unconstrained_numeric)?.into_bytes())
                });
            }
        }
        FieldFormat::Binary => {
            for i in 0..n {
                out.push(if column.is_null(i) { None } else { Some(binary_value(column, i, tz)?) });
            }
        }
    }
    Ok(out)
}

fn unsupported_type(dt: &DataType) -> Error {
    Error::unsupported(format!("values of type {dt} cannot be sent to clients yet"))
}

/// Rows as COPY text lines: tab-separated, `\N` for NULL, backslash escapes.
pub fn copy_text_lines(batch: &RecordBatch, tz: TimeZone) -> Result<Vec<Vec<u8>>> {
    let mut lines = vec![Vec::new(); batch.num_rows()];
    for (c, column) in batch.columns().iter().enumerate() {
        let trim = batch.schema().field(c).metadata().get(PG_TYPE_KEY).is_some_and(|t| t == "numeric");
        for (r, line) in lines.iter_mut().enumerate() {
            if c > 0 {
                line.push(b'\t');
            }
            if column.is_null(r) {
                line.extend_from_slice(b"\\N");
                continue;
            }
            for ch in text_value(column, r, tz, trim)?.chars() {
                match ch {
                    '\\' => line.extend_from_slice(b"\\\\"),
                    '\t' => line.extend_from_slice(b"\\t"),
                    '\n' => line.extend_from_slice(b"\\n"),
                    '\r' => line.extend_from_slice(b"\\r"),
                    other => {
                        let mut buf = [0u8; 4];
                        line.extend_from_slice(other.encode_utf8(&mut buf).as_bytes());
                    }
                }
            }
        }
    }
    for line in &mut lines {
        line.push(b'\n');
    }
    Ok(lines)
}

/// PostgreSQL's text form of one value.
pub fn text_value(column: &ArrayRef, i: usize, tz: TimeZone, trim_numeric: bool) -> Result<String> {
    let s = match column.data_type() {
        DataType::Boolean => (if column.as_boolean().value(i) { "t" } else { "f" }).to_owned(),
        DataType::Int8 => column.as_primitive::<Int8Type>().value(i).to_string(),
        DataType::Int16 => column.as_primitive::<Int16Type>().value(i).to_string(),
        DataType::Int32 => column.as_primitive::<Int32Type>().value(i).to_string(),
        DataType::Int64 => column.as_primitive::<Int64Type>().value(i).to_string(),
        DataType::UInt8 => column.as_primitive::<UInt8Type>().value(i).to_string(),
        DataType::UInt16 => column.as_primitive::<UInt16Type>().value(i).to_string(),
        DataType::UInt32 => column.as_primitive::<UInt32Type>().value(i).to_string(),
        DataType::UInt64 => column.as_primitive::<UInt64Type>().value(i).to_string(),
        DataType::Float32 => float_text(f64::from(column.as_primitive::<Float32Type>().value(i)), true),
        DataType::Float64 => float_text(column.as_primitive::<Float64Type>().value(i), false),
        DataType::Decimal128(_, scale) => {
            let text = decimal_text(column.as_primitive::<Decimal128Type>().value(i), *scale);
            if trim_numeric { trim_decimal(text) } else { text }
        }
        DataType::Utf8 => column.as_string::<i32>().value(i).to_owned(),
        DataType::LargeUtf8 => column.as_string::<i64>().value(i).to_owned(),
        DataType::Utf8View => column.as_string_view().value(i).to_owned(),
        DataType::Binary => bytea_text(column.as_binary::<i32>().value(i)),
        DataType::LargeBinary => bytea_text(column.as_binary::<i64>().value(i)),
        DataType::BinaryView => bytea_text(column.as_binary_view().value(i)),
        DataType::Date32 => date_text(column.as_primitive::<Date32Type>().value(i)),
        DataType::Time64(TimeUnit::Microsecond) => time_text(column.as_primitive::<Time64MicrosecondType>().value(i)),
        DataType::Timestamp(unit, zone) => {
            let us = timestamp_us(column, i, *unit);
            if zone.is_some() { timestamptz_text(us, tz) } else { timestamp_text(us) }
        }
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            let v = column.as_primitive::<IntervalMonthDayNanoType>().value(i);
            interval_text(v.months, v.days, v.nanoseconds / 1000)
        }
        DataType::Null => return Ok(String::new()),
        _ => {
            // Everything else (lists, structs, other units) through arrow's display, converted
            // to a type we render when possible.
            let converted = match column.data_type() {
                DataType::Date64 => Some(DataType::Date32),
                DataType::Time32(_) | DataType::Time64(_) => Some(DataType::Time64(TimeUnit::Microsecond)),
                DataType::Interval(_) | DataType::Duration(_) => Some(DataType::Interval(IntervalUnit::MonthDayNano)),
                DataType::Float16 => Some(DataType::Float32),
                DataType::Decimal256(p, s) if *p <= 38 => Some(DataType::Decimal128(*p, *s)),
                _ => None,
            };
            if let Some(target) = converted {
                let one = column.slice(i, 1);
                let cast = arrow::compute::cast(&one, &target).map_err(|_| unsupported_type(column.data_type()))?;
                return text_value(&cast, 0, tz, trim_numeric);
            }
            arrow::util::display::array_value_to_string(column, i).map_err(|_| unsupported_type(column.data_type()))?
        }
    };
    Ok(s)
}

fn timestamp_us(column: &ArrayRef, i: usize, unit: TimeUnit) -> i64 {
    use arrow::datatypes::{TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType};
    match unit {
        TimeUnit::Second => column.as_primitive::<TimestampSecondType>().value(i).saturating_mul(1_000_000),
        TimeUnit::Millisecond => column.as_primitive::<TimestampMillisecondType>().value(i).saturating_mul(1000),
        TimeUnit::Microsecond => column.as_primitive::<TimestampMicrosecondType>().value(i),
        TimeUnit::Nanosecond => column.as_primitive::<TimestampNanosecondType>().value(i).div_euclid(1000),
    }
}

/// Shortest round-trip digits, in PostgreSQL's notation (`1e+100`, `1.5e-05`, `Infinity`).
pub fn float_text(v: f64, single: bool) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let abs = v.abs();
    let exponent_form = abs != 0.0 && (abs >= if single { 1e6 } else { 1e15 } || abs < 1e-4);
    if !exponent_form {
        return if single { format!("{}", v as f32) } else { format!("{v}") };
    }
    let s = if single { format!("{:e}", v as f32) } else { format!("{v:e}") };
    let Some((mantissa, exp)) = s.split_once('e') else { return s };
    let (sign, digits) = match exp.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', exp),
    };
    format!("{mantissa}e{sign}{digits:0>2}")
}

pub fn decimal_text(value: i128, scale: i8) -> String {
    let negative = value < 0;
    let digits = value.unsigned_abs().to_string();
    let scale = scale.max(0) as usize;
    let body = if scale == 0 {
        digits
    } else if digits.len() > scale {
        format!("{}.{}", &digits[..digits.len() - scale], &digits[digits.len() - scale..])
    } else {
        format!("0.{}{}", "0".repeat(scale - digits.len()), digits)
    };
    if negative { format!("-{body}") } else { body }
}

fn trim_decimal(text: String) -> String {
    if !text.contains('.') {
        return text;
    }
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn bytea_text(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 + bytes.len() * 2);
    s.push_str("\\x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn date_from_days(days: i32) -> Option<NaiveDate> {
    NaiveDate::from_ymd_opt(1970, 1, 1)?.checked_add_signed(chrono::Duration::days(i64::from(days)))
}

fn date_text(days: i32) -> String {
    date_from_days(days).map_or_else(|| days.to_string(), |d| d.format("%Y-%m-%d").to_string())
}

fn fraction(us: u32) -> String {
    if us == 0 { String::new() } else { format!(".{us:06}").trim_end_matches('0').to_owned() }
}

fn time_text(us: i64) -> String {
    let secs = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000) as u32;
    format!("{:02}:{:02}:{:02}{}", secs / 3600, (secs / 60) % 60, secs % 60, fraction(micros))
}

fn naive_from_us(us: i64) -> Option<NaiveDateTime> {
    DateTime::from_timestamp_micros(us).map(|d| d.naive_utc())
}

fn timestamp_text(us: i64) -> String {
    match naive_from_us(us) {
        Some(t) => format!("{}{}", t.format("%Y-%m-%d %H:%M:%S"), fraction(t.nanosecond() / 1000)),
        None => us.to_string(),
    }
}

fn offset_text(seconds: i32) -> String {
    let sign = if seconds < 0 { '-' } else { '+' };
    let s = seconds.abs();
    let (h, m, sec) = (s / 3600, (s / 60) % 60, s % 60);
    match (m, sec) {
        (0, 0) => format!("{sign}{h:02}"),
        (_, 0) => format!("{sign}{h:02}:{m:02}"),
        _ => format!("{sign}{h:02}:{m:02}:{sec:02}"),
    }
}

/// A timestamptz rendered in the session's time zone with its offset, as PostgreSQL does.
pub fn timestamptz_text(us: i64, tz: TimeZone) -> String {
    let Some(utc) = naive_from_us(us) else { return us.to_string() };
    let (local, offset) = match tz {
        TimeZone::Named(zone) => {
            let t = zone.from_utc_datetime(&utc);
            (t.naive_local(), t.offset().fix().local_minus_utc())
        }
        TimeZone::Fixed(fixed) => {
            let t = fixed.from_utc_datetime(&utc);
            (t.naive_local(), fixed.local_minus_utc())
        }
    };
    format!("{}{}{}", local.format("%Y-%m-%d %H:%M:%S"), fraction(local.nanosecond() / 1000), offset_text(offset))
}

/// PostgreSQL's `postgres` IntervalStyle: `1 year 2 mons 3 days 04:05:06.5`.
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
        let sign = if us < 0 { "-" } else { "" };
        let abs = us.unsigned_abs();
        let secs = abs / 1_000_000;
        let micros = (abs % 1_000_000) as u32;
        parts.push(format!("{sign}{:02}:{:02}:{:02}{}", secs / 3600, (secs / 60) % 60, secs % 60, fraction(micros)));
    }
    parts.join(" ")
}

/// PostgreSQL's binary form of one value.
fn binary_value(column: &ArrayRef, i: usize, tz: TimeZone) -> Result<Vec<u8>> {
    let v = match column.data_type() {
        DataType::Boolean => vec![u8::from(column.as_boolean().value(i))],
        DataType::Int8 => i16::from(column.as_primitive::<Int8Type>().value(i)).to_be_bytes().to_vec(),
        DataType::UInt8 => i16::from(column.as_primitive::<UInt8Type>().value(i)).to_be_bytes().to_vec(),
        DataType::Int16 => column.as_primitive::<Int16Type>().value(i).to_be_bytes().to_vec(),
        DataType::UInt16 => i32::from(column.as_primitive::<UInt16Type>().value(i)).to_be_bytes().to_vec(),
        DataType::Int32 => column.as_primitive::<Int32Type>().value(i).to_be_bytes().to_vec(),
        DataType::UInt32 => i64::from(column.as_primitive::<UInt32Type>().value(i)).to_be_bytes().to_vec(),
        DataType::Int64 => column.as_primitive::<Int64Type>().value(i).to_be_bytes().to_vec(),
        DataType::UInt64 => (column.as_primitive::<UInt64Type>().value(i) as i64).to_be_bytes().to_vec(),
        DataType::Float32 => column.as_primitive::<Float32Type>().value(i).to_be_bytes().to_vec(),
        DataType::Float64 => column.as_primitive::<Float64Type>().value(i).to_be_bytes().to_vec(),
        DataType::Decimal128(_, scale) => numeric_binary(column.as_primitive::<Decimal128Type>().value(i), *scale),
        DataType::Binary => column.as_binary::<i32>().value(i).to_vec(),
        DataType::LargeBinary => column.as_binary::<i64>().value(i).to_vec(),
        DataType::BinaryView => column.as_binary_view().value(i).to_vec(),
        DataType::Date32 => (column.as_primitive::<Date32Type>().value(i) - PG_EPOCH_OFFSET_DAYS).to_be_bytes().to_vec(),
        DataType::Time64(TimeUnit::Microsecond) => column.as_primitive::<Time64MicrosecondType>().value(i).to_be_bytes().to_vec(),
        DataType::Timestamp(unit, _) => (timestamp_us(column, i, *unit) - PG_EPOCH_OFFSET_US).to_be_bytes().to_vec(),
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            let v = column.as_primitive::<IntervalMonthDayNanoType>().value(i);
            let mut out = Vec::with_capacity(16);
            out.extend_from_slice(&(v.nanoseconds / 1000).to_be_bytes());
            out.extend_from_slice(&v.days.to_be_bytes());
            out.extend_from_slice(&v.months.to_be_bytes());
            out
        }
        // Text-typed values (text, varchar, json) are their UTF-8 bytes in binary too.
        _ => text_value(column, i, tz, false)?.into_bytes(),
    };
    Ok(v)
}

/// PostgreSQL's binary numeric: base-10000 digits with a weight, sign and display scale.
pub fn numeric_binary(value: i128, scale: i8) -> Vec<u8> {
    let scale = scale.max(0) as usize;
    let negative = value < 0;
    let digits = value.unsigned_abs().to_string();
    let (int_part, frac_part) = if digits.len() > scale {
        (digits[..digits.len() - scale].to_owned(), digits[digits.len() - scale..].to_owned())
    } else {
        ("0".to_owned(), format!("{}{}", "0".repeat(scale - digits.len()), digits))
    };
    let int_part = int_part.trim_start_matches('0');
    // Group the integer part from the right, the fraction from the left, in 4-digit groups.
    let int_pad = (4 - int_part.len() % 4) % 4;
    let int_digits = format!("{}{}", "0".repeat(int_pad), int_part);
    let frac_pad = (4 - frac_part.len() % 4) % 4;
    let frac_digits = format!("{}{}", frac_part, "0".repeat(frac_pad));
    let mut groups: Vec<i16> = Vec::new();
    for chunk in int_digits.as_bytes().chunks(4).chain(frac_digits.as_bytes().chunks(4)) {
        let s = std::str::from_utf8(chunk).unwrap_or("0");
        groups.push(s.parse().unwrap_or(0));
    }
    let mut weight = (int_digits.len() / 4) as i16 - 1;
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    let mut out = Vec::with_capacity(8 + 2 * groups.len());
    out.extend_from_slice(&(groups.len() as i16).to_be_bytes());
    out.extend_from_slice(&weight.to_be_bytes());
    out.extend_from_slice(&(if negative && !groups.is_empty() { 0x4000u16 } else { 0 }).to_be_bytes());
    out.extend_from_slice(&(scale as u16).to_be_bytes());
    for g in groups {
        out.extend_from_slice(&g.to_be_bytes());
    }
    out
}

/// Decodes a binary parameter of PostgreSQL type `pg` into a one-row Arrow array.
pub fn decode_binary_param(pg: &Type, bytes: &[u8]) -> Result<ArrayRef> {
    use arrow::array::*;
    let bad = || Error::new(eddy_common::SqlState::INVALID_BINARY_REPRESENTATION, format!("incorrect binary data format for a {pg} parameter"));
    let fixed = |n: usize| -> Result<&[u8]> { if bytes.len() == n { Ok(bytes) } else { Err(bad()) } };
    let array: ArrayRef = match *pg {
        Type::BOOL => Arc::new(BooleanArray::from(vec![fixed(1)?[0] != 0])),
        Type::INT2 => Arc::new(Int16Array::from(vec![i16::from_be_bytes(fixed(2)?.try_into().map_err(|_| bad())?)])),
        Type::INT4 | Type::OID => Arc::new(Int32Array::from(vec![i32::from_be_bytes(fixed(4)?.try_into().map_err(|_| bad())?)])),
        Type::INT8 => Arc::new(Int64Array::from(vec![i64::from_be_bytes(fixed(8)?.try_into().map_err(|_| bad())?)])),
        Type::FLOAT4 => Arc::new(Float32Array::from(vec![f32::from_be_bytes(fixed(4)?.try_into().map_err(|_| bad())?)])),
        Type::FLOAT8 => Arc::new(Float64Array::from(vec![f64::from_be_bytes(fixed(8)?.try_into().map_err(|_| bad())?)])),
        Type::BYTEA => Arc::new(BinaryArray::from(vec![bytes])),
        Type::DATE => Arc::new(Date32Array::from(vec![i32::from_be_bytes(fixed(4)?.try_into().map_err(|_| bad())?) + PG_EPOCH_OFFSET_DAYS])),
        Type::TIMESTAMP => Arc::new(TimestampMicrosecondArray::from(vec![
            i64::from_be_bytes(fixed(8)?.try_into().map_err(|_| bad())?) + PG_EPOCH_OFFSET_US,
        ])),
        Type::TIMESTAMPTZ => Arc::new(
            TimestampMicrosecondArray::from(vec![i64::from_be_bytes(fixed(8)?.try_into().map_err(|_| bad())?) + PG_EPOCH_OFFSET_US])
                .with_timezone("UTC"),
        ),
        Type::TIME => Arc::new(Time64MicrosecondArray::from(vec![i64::from_be_bytes(fixed(8)?.try_into().map_err(|_| bad())?)])),
        Type::NUMERIC => return numeric_from_binary(bytes).ok_or_else(bad),
        _ => Arc::new(StringArray::from(vec![std::str::from_utf8(bytes).map_err(|_| bad())?])),
    };
    Ok(array)
}

fn numeric_from_binary(bytes: &[u8]) -> Option<ArrayRef> {
    let read = |at: usize| -> Option<i16> { Some(i16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?])) };
    let ndigits = read(0)? as usize;
    let weight = read(2)?;
    let sign = read(4)? as u16;
    let dscale = read(6)?;
    let mut text = String::new();
    if sign == 0x4000 {
        text.push('-');
    }
    let digits: Vec<i16> = (0..ndigits).map(|i| read(8 + 2 * i)).collect::<Option<_>>()?;
    let mut int_part = String::new();
    let mut frac_part = String::new();
    for (i, d) in digits.iter().enumerate() {
        let position = weight as i32 - i as i32;
        if position >= 0 { int_part.push_str(&format!("{d:04}")) } else { frac_part.push_str(&format!("{d:04}")) }
    }
    for _ in 0..(weight as i32 + 1 - ndigits as i32).max(0) {
        int_part.push_str("0000");
    }
    if weight < -1 {
        frac_part = format!("{}{}", "0000".repeat((-weight - 1) as usize), frac_part);
    }
    let int_part = int_part.trim_start_matches('0');
    text.push_str(if int_part.is_empty() { "0" } else { int_part });
    if dscale > 0 {
        let mut f = frac_part;
        f.truncate(dscale as usize);
        while f.len() < dscale as usize {
            f.push('0');
        }
        text.push('.');
        text.push_str(&f);
    }
    let strings: ArrayRef = Arc::new(arrow::array::StringArray::from(vec![text]));
    arrow::compute::cast(&strings, &DataType::Decimal128(38, dscale.clamp(0, 38) as i8)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_render_like_postgres() {
        assert_eq!(float_text(1.0, false), "1");
        assert_eq!(float_text(0.1, false), "0.1");
        assert_eq!(float_text(1e100, false), "1e+100");
        assert_eq!(float_text(1.5e-5, false), "1.5e-05");
        assert_eq!(float_text(f64::NAN, false), "NaN");
        assert_eq!(float_text(f64::from(0.1f32), true), "0.1");
    }

    #[test]
    fn decimals_and_intervals() {
        assert_eq!(decimal_text(12345, 2), "123.45");
        assert_eq!(decimal_text(-5, 3), "-0.005");
        assert_eq!(trim_decimal(decimal_text(15_000_000_000, 10)), "1.5");
        assert_eq!(interval_text(14, 3, 3_723_500_000), "1 year 2 mons 3 days 01:02:03.5");
        assert_eq!(interval_text(0, 0, 0), "00:00:00");
        assert_eq!(interval_text(0, -1, 0), "-1 days");
    }

    #[test]
    fn timestamptz_in_session_zone() {
        let us = 1_700_000_000_000_000;
        assert_eq!(timestamptz_text(us, TimeZone::Named(chrono_tz::UTC)), "2023-11-14 22:13:20+00");
        assert_eq!(timestamptz_text(us, TimeZone::Named(chrono_tz::Asia::Kolkata)), "2023-11-15 03:43:20+05:30");
    }

    #[test]
    fn numeric_binary_round_trips() {
        for (v, s) in [(12345i128, 2i8), (-5, 3), (0, 0), (10_000_000, 0), (1, 10)] {
            let bytes = numeric_binary(v, s);
            let back = numeric_from_binary(&bytes).unwrap();
            assert_eq!(text_value(&back, 0, TimeZone::Named(chrono_tz::UTC), true).unwrap(), trim_decimal(decimal_text(v, s)));
        }
    }
}
