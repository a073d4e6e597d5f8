//! Arrow values on the PostgreSQL wire: type OIDs, text rendering as PostgreSQL prints values,
//! and the binary formats drivers ask for.
//!
//! Arrow's own display differs from PostgreSQL's (`true` vs `t`, `2.0` vs `2`, timestamptz
//! offsets), so every type is rendered here, column by column (no per-value dispatch on type).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Field, Float32Type, Float64Type, Int8Type, Int16Type,
    Int32Type, Int64Type, IntervalMonthDayNanoType, IntervalUnit, Time64MicrosecondType, TimeUnit,
    UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use bytes::{BufMut, BytesMut};
use eddy_common::{Error, Result};
use eddy_engine::{PG_TYPE_KEY, TimeZone};
use eddy_sql::pg::text::{TextOptions, is_null, text_value, timestamp_us};
use pgwire::api::Type;
use pgwire::api::results::{FieldFormat, FieldInfo};
use pgwire::messages::data::DataRow;

/// Microseconds between 1970-01-01 and PostgreSQL's epoch 2000-01-01.
pub(crate) const PG_EPOCH_OFFSET_US: i64 = 946_684_800_000_000;
pub(crate) const PG_EPOCH_OFFSET_DAYS: i32 = 10_957;

/// The PostgreSQL type of an Arrow field.
pub fn pg_type(field: &Field) -> Type {
    if let Some(declared) = field.metadata().get(PG_TYPE_KEY) {
        // The catalogs' own types (crates/sql/src/pg_catalog/spec.rs).
        match (declared.as_str(), field.data_type()) {
            ("\"char\"", DataType::Utf8) => return Type::CHAR,
            ("oid", DataType::UInt32) => return Type::OID,
            _ => {}
        }
    }
    if let Some(declared) = field
        .metadata()
        .get(PG_TYPE_KEY)
        .and_then(|d| declared_type(d))
    {
        return declared;
    }
    match field.data_type() {
        DataType::Boolean => Type::BOOL,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => Type::INT2,
        DataType::Int32 | DataType::UInt16 => Type::INT4,
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => Type::INT8,
        DataType::Float16 | DataType::Float32 => Type::FLOAT4,
        DataType::Float64 => Type::FLOAT8,
        DataType::Decimal128(..) | DataType::Decimal256(..) => Type::NUMERIC,
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => Type::BYTEA,
        DataType::Date32 | DataType::Date64 => Type::DATE,
        DataType::Time32(_) | DataType::Time64(_) => Type::TIME,
        DataType::Timestamp(_, None) => Type::TIMESTAMP,
        DataType::Timestamp(_, Some(_)) => Type::TIMESTAMPTZ,
        DataType::Interval(_) | DataType::Duration(_) => Type::INTERVAL,
        // A multidimensional array is an array of its innermost element type, as in PostgreSQL.
        DataType::List(element)
        | DataType::LargeList(element)
        | DataType::FixedSizeList(element, _) => {
            let element = pg_type(element);
            if element_of(&element).is_some() {
                element
            } else {
                array_of(&element).unwrap_or(Type::TEXT)
            }
        }
        _ => Type::TEXT,
    }
}

/// The PostgreSQL types Arrow cannot tell apart from another (`jsonb` and `varchar(n)` are
/// Arrow strings), by the name declared in a field's metadata; `None` where the Arrow type
/// decides.
fn declared_type(declared: &str) -> Option<Type> {
    if let Some(element) = declared.strip_suffix("[]") {
        return declared_type(element).and_then(|t| array_of(&t));
    }
    Some(match declared {
        "jsonb" => Type::JSONB,
        "json" => Type::JSON,
        "name" => Type::NAME,
        "int2vector" => Type::INT2_VECTOR,
        "oidvector" => Type::OID_VECTOR,
        d if d.starts_with("character varying") => Type::VARCHAR,
        d if d.starts_with("character(") => Type::BPCHAR,
        _ => return None,
    })
}

/// The array type of an element type (`text[]` of `text`), for the types Eddy produces.
pub fn array_of(element: &Type) -> Option<Type> {
    Some(match *element {
        Type::BOOL => Type::BOOL_ARRAY,
        Type::INT2 => Type::INT2_ARRAY,
        Type::INT4 => Type::INT4_ARRAY,
        Type::INT8 => Type::INT8_ARRAY,
        Type::FLOAT4 => Type::FLOAT4_ARRAY,
        Type::FLOAT8 => Type::FLOAT8_ARRAY,
        Type::NUMERIC => Type::NUMERIC_ARRAY,
        Type::TEXT => Type::TEXT_ARRAY,
        Type::VARCHAR => Type::VARCHAR_ARRAY,
        Type::BPCHAR => Type::BPCHAR_ARRAY,
        Type::NAME => Type::NAME_ARRAY,
        Type::JSON => Type::JSON_ARRAY,
        Type::BYTEA => Type::BYTEA_ARRAY,
        Type::DATE => Type::DATE_ARRAY,
        Type::TIME => Type::TIME_ARRAY,
        Type::TIMESTAMP => Type::TIMESTAMP_ARRAY,
        Type::TIMESTAMPTZ => Type::TIMESTAMPTZ_ARRAY,
        Type::INTERVAL => Type::INTERVAL_ARRAY,
        Type::JSONB => Type::JSONB_ARRAY,
        _ => return None,
    })
}

/// PostgreSQL's binary array: dimensions, a NULL flag, the element type, then each element
/// with its length (-1 for NULL) in the element type's binary form.
fn array_binary(column: &ArrayRef, i: usize, element: &Field, tz: TimeZone) -> Result<Vec<u8>> {
    let values = match column.data_type() {
        DataType::List(_) => column.as_list::<i32>().value(i),
        DataType::LargeList(_) => column.as_list::<i64>().value(i),
        _ => column.as_fixed_size_list().value(i),
    };
    let element_oid = pg_type(element).oid() as i32;
    let has_null = (0..values.len()).any(|k| is_null(&values, k));
    let mut out = Vec::with_capacity(20 + values.len() * 8);
    out.extend_from_slice(&i32::from(!values.is_empty()).to_be_bytes());
    out.extend_from_slice(&i32::from(has_null).to_be_bytes());
    out.extend_from_slice(&element_oid.to_be_bytes());
    if !values.is_empty() {
        out.extend_from_slice(&(values.len() as i32).to_be_bytes());
        out.extend_from_slice(&1i32.to_be_bytes());
    }
    for k in 0..values.len() {
        if is_null(&values, k) {
            out.extend_from_slice(&(-1i32).to_be_bytes());
        } else {
            let bytes = binary_value(&values, k, tz)?;
            out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
            out.extend_from_slice(&bytes);
        }
    }
    Ok(out)
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
        _ => match element_of(pg) {
            Some(element) => {
                DataType::List(Arc::new(Field::new_list_field(arrow_type(&element), true)))
            }
            None => DataType::Utf8,
        },
    }
}

/// The element type of an array type (`int4` of `int4[]`), the inverse of [`array_of`].
pub fn element_of(array: &Type) -> Option<Type> {
    const ELEMENTS: [Type; 19] = [
        Type::BOOL,
        Type::INT2,
        Type::INT4,
        Type::INT8,
        Type::FLOAT4,
        Type::FLOAT8,
        Type::NUMERIC,
        Type::TEXT,
        Type::VARCHAR,
        Type::BPCHAR,
        Type::NAME,
        Type::BYTEA,
        Type::DATE,
        Type::TIME,
        Type::TIMESTAMP,
        Type::TIMESTAMPTZ,
        Type::INTERVAL,
        Type::JSON,
        Type::JSONB,
    ];
    ELEMENTS
        .into_iter()
        .find(|e| array_of(e).as_ref() == Some(array))
}

pub fn field_infos(
    schema: &arrow::datatypes::Schema,
    format_for: impl Fn(usize) -> FieldFormat,
) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| FieldInfo::new(f.name().clone(), None, None, pg_type(f), format_for(i)))
        .collect()
}

/// Encodes every row of a batch into DataRows.
pub fn encode_batch(
    batch: &RecordBatch,
    formats: &[FieldFormat],
    tz: TimeZone,
) -> Result<Vec<DataRow>> {
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

pub(crate) fn encode_column(
    column: &ArrayRef,
    field: &Field,
    format: FieldFormat,
    tz: TimeZone,
) -> Result<Vec<Option<Vec<u8>>>> {
    let n = column.len();
    let mut out = Vec::with_capacity(n);
    let options = TextOptions::output_of(field, tz);
    // A blank-padded character(n) is its padded text in binary too.
    let format = if options.blank_pad.is_some() {
        FieldFormat::Text
    } else {
        format
    };
    match format {
        FieldFormat::Text => {
            for i in 0..n {
                out.push(if is_null(column, i) {
                    None
                } else {
                    Some(text_value(column, i, options)?.into_bytes())
                });
            }
        }
        FieldFormat::Binary if pg_type(field) == Type::OID => {
            // An OID is 4 bytes unsigned on the wire (other UInt32 columns go out as int8).
            let oids = column.as_primitive::<UInt32Type>();
            out.extend(
                (0..n).map(|i| (!is_null(column, i)).then(|| oids.value(i).to_be_bytes().to_vec())),
            );
        }
        FieldFormat::Binary => {
            // jsonb's binary form is a version byte, 1, then its text.
            let version: &[u8] = if pg_type(field) == Type::JSONB {
                &[1]
            } else {
                &[]
            };
            for i in 0..n {
                out.push(if is_null(column, i) {
                    None
                } else {
                    Some([version, &binary_value(column, i, tz)?].concat())
                });
            }
        }
    }
    Ok(out)
}

/// PostgreSQL's binary form of one value.
fn binary_value(column: &ArrayRef, i: usize, tz: TimeZone) -> Result<Vec<u8>> {
    let v = match column.data_type() {
        DataType::Boolean => vec![u8::from(column.as_boolean().value(i))],
        DataType::Int8 => i16::from(column.as_primitive::<Int8Type>().value(i))
            .to_be_bytes()
            .to_vec(),
        DataType::UInt8 => i16::from(column.as_primitive::<UInt8Type>().value(i))
            .to_be_bytes()
            .to_vec(),
        DataType::Int16 => column
            .as_primitive::<Int16Type>()
            .value(i)
            .to_be_bytes()
            .to_vec(),
        DataType::UInt16 => i32::from(column.as_primitive::<UInt16Type>().value(i))
            .to_be_bytes()
            .to_vec(),
        DataType::Int32 => column
            .as_primitive::<Int32Type>()
            .value(i)
            .to_be_bytes()
            .to_vec(),
        DataType::UInt32 => i64::from(column.as_primitive::<UInt32Type>().value(i))
            .to_be_bytes()
            .to_vec(),
        DataType::Int64 => column
            .as_primitive::<Int64Type>()
            .value(i)
            .to_be_bytes()
            .to_vec(),
        DataType::UInt64 => (column.as_primitive::<UInt64Type>().value(i) as i64)
            .to_be_bytes()
            .to_vec(),
        DataType::Float32 => column
            .as_primitive::<Float32Type>()
            .value(i)
            .to_be_bytes()
            .to_vec(),
        DataType::Float64 => column
            .as_primitive::<Float64Type>()
            .value(i)
            .to_be_bytes()
            .to_vec(),
        DataType::Decimal128(_, scale) => {
            numeric_binary(column.as_primitive::<Decimal128Type>().value(i), *scale)
        }
        DataType::Binary => column.as_binary::<i32>().value(i).to_vec(),
        DataType::LargeBinary => column.as_binary::<i64>().value(i).to_vec(),
        DataType::BinaryView => column.as_binary_view().value(i).to_vec(),
        DataType::Date32 => (column.as_primitive::<Date32Type>().value(i) - PG_EPOCH_OFFSET_DAYS)
            .to_be_bytes()
            .to_vec(),
        DataType::Time64(TimeUnit::Microsecond) => column
            .as_primitive::<Time64MicrosecondType>()
            .value(i)
            .to_be_bytes()
            .to_vec(),
        DataType::Timestamp(unit, _) => (timestamp_us(column, i, *unit) - PG_EPOCH_OFFSET_US)
            .to_be_bytes()
            .to_vec(),
        DataType::Interval(IntervalUnit::MonthDayNano) => {
            let v = column.as_primitive::<IntervalMonthDayNanoType>().value(i);
            let mut out = Vec::with_capacity(16);
            out.extend_from_slice(&(v.nanoseconds / 1000).to_be_bytes());
            out.extend_from_slice(&v.days.to_be_bytes());
            out.extend_from_slice(&v.months.to_be_bytes());
            out
        }
        DataType::List(element)
        | DataType::LargeList(element)
        | DataType::FixedSizeList(element, _)
            if array_of(&pg_type(element)).is_some() =>
        {
            array_binary(column, i, element, tz)?
        }
        // Text-typed values (text, varchar, json) are their UTF-8 bytes in binary too.
        _ => text_value(column, i, TextOptions::output(tz))?.into_bytes(),
    };
    Ok(v)
}

/// PostgreSQL's binary numeric: base-10000 digits with a weight, sign and display scale.
pub fn numeric_binary(value: i128, scale: i8) -> Vec<u8> {
    let scale = scale.max(0) as usize;
    let negative = value < 0;
    let digits = value.unsigned_abs().to_string();
    let (int_part, frac_part) = if digits.len() > scale {
        (
            digits[..digits.len() - scale].to_owned(),
            digits[digits.len() - scale..].to_owned(),
        )
    } else {
        (
            "0".to_owned(),
            format!("{}{}", "0".repeat(scale - digits.len()), digits),
        )
    };
    let int_part = int_part.trim_start_matches('0');
    // Group the integer part from the right, the fraction from the left, in 4-digit groups.
    let int_pad = (4 - int_part.len() % 4) % 4;
    let int_digits = format!("{}{}", "0".repeat(int_pad), int_part);
    let frac_pad = (4 - frac_part.len() % 4) % 4;
    let frac_digits = format!("{}{}", frac_part, "0".repeat(frac_pad));
    let mut groups: Vec<i16> = Vec::new();
    for chunk in int_digits
        .as_bytes()
        .chunks(4)
        .chain(frac_digits.as_bytes().chunks(4))
    {
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
    out.extend_from_slice(
        &(if negative && !groups.is_empty() {
            0x4000u16
        } else {
            0
        })
        .to_be_bytes(),
    );
    out.extend_from_slice(&(scale as u16).to_be_bytes());
    for g in groups {
        out.extend_from_slice(&g.to_be_bytes());
    }
    out
}

/// Decodes a binary parameter of PostgreSQL type `pg` into a one-row Arrow array.
pub fn decode_binary_param(pg: &Type, bytes: &[u8]) -> Result<ArrayRef> {
    use arrow::array::*;
    let bad = || {
        Error::new(
            eddy_common::SqlState::INVALID_BINARY_REPRESENTATION,
            format!("incorrect binary data format for a {pg} parameter"),
        )
    };
    let fixed = |n: usize| -> Result<&[u8]> {
        if bytes.len() == n {
            Ok(bytes)
        } else {
            Err(bad())
        }
    };
    let array: ArrayRef = match *pg {
        Type::BOOL => Arc::new(BooleanArray::from(vec![fixed(1)?[0] != 0])),
        Type::INT2 => Arc::new(Int16Array::from(vec![i16::from_be_bytes(
            fixed(2)?.try_into().map_err(|_| bad())?,
        )])),
        Type::INT4 | Type::OID => Arc::new(Int32Array::from(vec![i32::from_be_bytes(
            fixed(4)?.try_into().map_err(|_| bad())?,
        )])),
        Type::INT8 => Arc::new(Int64Array::from(vec![i64::from_be_bytes(
            fixed(8)?.try_into().map_err(|_| bad())?,
        )])),
        Type::FLOAT4 => Arc::new(Float32Array::from(vec![f32::from_be_bytes(
            fixed(4)?.try_into().map_err(|_| bad())?,
        )])),
        Type::FLOAT8 => Arc::new(Float64Array::from(vec![f64::from_be_bytes(
            fixed(8)?.try_into().map_err(|_| bad())?,
        )])),
        Type::BYTEA => Arc::new(BinaryArray::from(vec![bytes])),
        Type::DATE => Arc::new(Date32Array::from(vec![
            i32::from_be_bytes(fixed(4)?.try_into().map_err(|_| bad())?) + PG_EPOCH_OFFSET_DAYS,
        ])),
        Type::TIMESTAMP => Arc::new(TimestampMicrosecondArray::from(vec![
            i64::from_be_bytes(fixed(8)?.try_into().map_err(|_| bad())?) + PG_EPOCH_OFFSET_US,
        ])),
        Type::TIMESTAMPTZ => Arc::new(
            TimestampMicrosecondArray::from(vec![
                i64::from_be_bytes(fixed(8)?.try_into().map_err(|_| bad())?) + PG_EPOCH_OFFSET_US,
            ])
            .with_timezone("UTC"),
        ),
        Type::TIME => Arc::new(Time64MicrosecondArray::from(vec![i64::from_be_bytes(
            fixed(8)?.try_into().map_err(|_| bad())?,
        )])),
        Type::NUMERIC => return numeric_from_binary(bytes).ok_or_else(bad),
        // jsonb's binary form: version 1, then the text.
        Type::JSONB => match bytes.split_first() {
            Some((1, text)) => Arc::new(StringArray::from(vec![
                std::str::from_utf8(text).map_err(|_| bad())?,
            ])),
            _ => return Err(bad()),
        },
        _ if element_of(pg).is_some() => return array_from_binary(pg, bytes).ok_or_else(bad)?,
        _ => Arc::new(StringArray::from(vec![
            std::str::from_utf8(bytes).map_err(|_| bad())?,
        ])),
    };
    Ok(array)
}

/// PostgreSQL's binary array (see [`array_binary`]) of one dimension (or none) as a one-row
/// list; `None` when the bytes are not one.
fn array_from_binary(pg: &Type, bytes: &[u8]) -> Option<Result<ArrayRef>> {
    let int = |at: usize| -> Option<i32> {
        Some(i32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
    };
    let dimensions = int(0)?;
    let element = element_of(pg)?;
    let item = Arc::new(Field::new_list_field(arrow_type(&element), true));
    let (length, mut at) = match dimensions {
        0 => (0, 12),
        1 => (usize::try_from(int(12)?).ok()?, 20),
        _ => {
            return Some(Err(Error::unsupported(
                "multidimensional arrays are not supported",
            )));
        }
    };
    let mut values: Vec<ArrayRef> = Vec::with_capacity(length);
    for _ in 0..length {
        let size = int(at)?;
        at += 4;
        if size < 0 {
            values.push(arrow::array::new_null_array(item.data_type(), 1));
            continue;
        }
        let value = bytes.get(at..at + size as usize)?;
        at += size as usize;
        match decode_binary_param(&element, value).and_then(|v| {
            arrow::compute::cast(&v, item.data_type()).map_err(|e| Error::internal(e.to_string()))
        }) {
            Ok(v) => values.push(v),
            Err(e) => return Some(Err(e)),
        }
    }
    let refs: Vec<&dyn Array> = values.iter().map(|v| v.as_ref()).collect();
    let flat = if refs.is_empty() {
        arrow::array::new_empty_array(item.data_type())
    } else {
        arrow::compute::concat(&refs).ok()?
    };
    let offsets =
        arrow::buffer::OffsetBuffer::new(vec![0i32, i32::try_from(flat.len()).ok()?].into());
    Some(
        arrow::array::ListArray::try_new(item, offsets, flat, None)
            .map(|l| Arc::new(l) as ArrayRef)
            .map_err(|e| Error::internal(e.to_string())),
    )
}

fn numeric_from_binary(bytes: &[u8]) -> Option<ArrayRef> {
    let read = |at: usize| -> Option<i16> {
        Some(i16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
    };
    let ndigits = read(0)? as usize;
    let weight = read(2)?;
    let sign = read(4)? as u16;
    let dscale = read(6)?;
    let mut text = String::new();
    if sign == 0x4000 {
        text.push('-');
    }
    let digits: Vec<i16> = (0..ndigits)
        .map(|i| read(8 + 2 * i))
        .collect::<Option<_>>()?;
    let mut int_part = String::new();
    let mut frac_part = String::new();
    for (i, d) in digits.iter().enumerate() {
        let position = weight as i32 - i as i32;
        if position >= 0 {
            int_part.push_str(&format!("{d:04}"))
        } else {
            frac_part.push_str(&format!("{d:04}"))
        }
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
    arrow::compute::cast(
        &strings,
        &DataType::Decimal128(38, dscale.clamp(0, 38) as i8),
    )
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_binary_round_trips() {
        use eddy_sql::pg::text::{decimal_text, trim_decimal};
        for (v, s) in [(12345i128, 2i8), (-5, 3), (0, 0), (10_000_000, 0), (1, 10)] {
            let bytes = numeric_binary(v, s);
            let back = numeric_from_binary(&bytes).unwrap();
            let options = TextOptions {
                trim_numeric: true,
                ..TextOptions::output(TimeZone::UTC)
            };
            assert_eq!(
                text_value(&back, 0, options).unwrap(),
                trim_decimal(decimal_text(v, s))
            );
        }
    }
}
