//! `COPY ... FROM STDIN (FORMAT binary)`: PostgreSQL's binary COPY stream (the `PGCOPY`
//! signature, a header, then per row a field count and each field's length and binary value)
//! decoded into the table's columns, column by column.
//!
//! Common fixed-width types, numerics and text are decoded straight into Arrow buffers; the others go
//! value by value through [`crate::encode::decode_binary_param`], the decoder of binary
//! parameters, so both read PostgreSQL's binary forms the same way.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Date32Array, Float32Array, Float64Array, Int16Array, Int32Array,
    Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::DataType;
use eddy_common::{Error, Result, SqlState};
use eddy_engine::CopyIn;
use pgwire::api::Type;

use crate::encode::{PG_EPOCH_OFFSET_DAYS, PG_EPOCH_OFFSET_US, decode_binary_param, pg_type};

const SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";

fn bad(what: &str) -> Error {
    Error::new(
        SqlState::BAD_COPY_FILE_FORMAT,
        format!("invalid COPY file: {what}"),
    )
}

/// The rows of a binary COPY stream, as the table's rows.
pub fn binary_rows(copy: &CopyIn, data: &[u8]) -> Result<RecordBatch> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8]> {
        let bytes = data
            .get(at..at + n)
            .ok_or_else(|| bad("unexpected end of data"))?;
        at += n;
        Ok(bytes)
    };
    if take(SIGNATURE.len())? != SIGNATURE {
        return Err(bad("COPY signature not recognized"));
    }
    let flags = u32::from_be_bytes(take(4)?.try_into().map_err(|_| bad("header"))?);
    if flags & (1 << 16) != 0 {
        return Err(bad("OIDs in the data are not supported"));
    }
    let extension = u32::from_be_bytes(take(4)?.try_into().map_err(|_| bad("header"))?);
    take(extension as usize)?;
    let width = copy.columns.len();
    let mut fields: Vec<Vec<Option<&[u8]>>> = vec![Vec::new(); width];
    let mut rows = 0usize;
    loop {
        let count = i16::from_be_bytes(take(2)?.try_into().map_err(|_| bad("row"))?);
        if count == -1 {
            break;
        }
        if count as usize != width {
            return Err(bad(&format!(
                "row field count is {count}, expected {width}"
            )));
        }
        for column in fields.iter_mut() {
            let len = i32::from_be_bytes(take(4)?.try_into().map_err(|_| bad("field"))?);
            column.push(if len < 0 {
                None
            } else {
                Some(take(len as usize)?)
            });
        }
        rows += 1;
    }
    let mut decoded = Vec::with_capacity(width);
    for (values, &column) in fields.iter().zip(&copy.columns) {
        let field = copy.schema.field(column);
        let array = decode_column(&pg_type(field), values, field.data_type()).and_then(|a| {
            arrow::compute::cast(&a, field.data_type())
                .map_err(|e| Error::new(SqlState::DATATYPE_MISMATCH, e.to_string()))
        });
        decoded.push(array.map_err(|e| {
            Error::new(e.state, format!("{} (column {})", e.message, field.name()))
        })?);
    }
    copy.assemble(decoded, rows)
}

/// One column's binary values as an array.
fn decode_column(pg: &Type, values: &[Option<&[u8]>], target: &DataType) -> Result<ArrayRef> {
    fn fixed<const N: usize>(values: &[Option<&[u8]>]) -> Result<Vec<Option<[u8; N]>>> {
        values
            .iter()
            .map(|v| {
                v.map(|b| {
                    b.try_into()
                        .map_err(|_| bad(&format!("a field of {} bytes where {N} belong", b.len())))
                })
                .transpose()
            })
            .collect()
    }
    let array: ArrayRef = match *pg {
        Type::BOOL => Arc::new(BooleanArray::from(
            fixed::<1>(values)?
                .into_iter()
                .map(|v| v.map(|b| b[0] != 0))
                .collect::<Vec<_>>(),
        )),
        Type::INT2 => Arc::new(Int16Array::from_iter(
            fixed::<2>(values)?
                .into_iter()
                .map(|v| v.map(i16::from_be_bytes)),
        )),
        Type::INT4 => Arc::new(Int32Array::from_iter(
            fixed::<4>(values)?
                .into_iter()
                .map(|v| v.map(i32::from_be_bytes)),
        )),
        Type::INT8 => Arc::new(Int64Array::from_iter(
            fixed::<8>(values)?
                .into_iter()
                .map(|v| v.map(i64::from_be_bytes)),
        )),
        Type::FLOAT4 => Arc::new(Float32Array::from_iter(
            fixed::<4>(values)?
                .into_iter()
                .map(|v| v.map(f32::from_be_bytes)),
        )),
        Type::FLOAT8 => Arc::new(Float64Array::from_iter(
            fixed::<8>(values)?
                .into_iter()
                .map(|v| v.map(f64::from_be_bytes)),
        )),
        Type::DATE => {
            Arc::new(Date32Array::from_iter(fixed::<4>(values)?.into_iter().map(
                |v| v.map(|b| i32::from_be_bytes(b) + PG_EPOCH_OFFSET_DAYS),
            )))
        }
        Type::TIMESTAMP | Type::TIMESTAMPTZ => {
            let micros = TimestampMicrosecondArray::from_iter(
                fixed::<8>(values)?
                    .into_iter()
                    .map(|v| v.map(|b| i64::from_be_bytes(b) + PG_EPOCH_OFFSET_US)),
            );
            if *pg == Type::TIMESTAMPTZ {
                Arc::new(micros.with_timezone("UTC"))
            } else {
                Arc::new(micros)
            }
        }
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => Arc::new(
            values
                .iter()
                .map(|v| {
                    v.map(|b| {
                        std::str::from_utf8(b).map_err(|e| {
                            Error::new(
                                SqlState::CHARACTER_NOT_IN_REPERTOIRE,
                                format!("invalid byte sequence for encoding \"UTF8\": {e}"),
                            )
                        })
                    })
                    .transpose()
                })
                .collect::<Result<StringArray>>()?,
        ),
        Type::NUMERIC => {
            if let DataType::Decimal128(precision, scale) = *target {
                let decoded = values
                    .iter()
                    .map(|v| v.map(|b| numeric_at_scale(b, precision, scale)).transpose())
                    .collect::<Result<Vec<Option<i128>>>>()?;
                let array = arrow::array::Decimal128Array::from(decoded)
                    .with_precision_and_scale(precision, scale)
                    .map_err(|e| Error::internal(e.to_string()))?;
                return Ok(Arc::new(array));
            }
            return slow(pg, values, target);
        }
        _ => return slow(pg, values, target),
    };
    Ok(array)
}

/// A binary numeric (base-10000 digits, weight, sign, display scale) as a `Decimal128` value
/// at `scale`, rounded half away from zero as a cast to `numeric(p, s)` rounds.
fn numeric_at_scale(bytes: &[u8], precision: u8, scale: i8) -> Result<i128> {
    let word = |at: usize| -> Result<i16> {
        Ok(i16::from_be_bytes([
            *bytes.get(at).ok_or_else(|| bad("numeric"))?,
            *bytes.get(at + 1).ok_or_else(|| bad("numeric"))?,
        ]))
    };
    let ndigits = word(0)?.max(0) as usize;
    let weight = i32::from(word(2)?);
    let sign = word(4)? as u16;
    if sign != 0 && sign != 0x4000 {
        return Err(Error::new(
            SqlState::FEATURE_NOT_SUPPORTED,
            "NaN and infinite numerics are not supported",
        ));
    }
    let overflow = || {
        Error::new(
            SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
            format!("numeric field overflow: a value does not fit numeric({precision},{scale})"),
        )
    };
    // Exact at a scale where every digit group is a whole number, then rounded to `scale`.
    let exact_scale = (4 * (ndigits as i32 - weight - 1)).max(i32::from(scale));
    let mut value: i128 = 0;
    for i in 0..ndigits {
        let digit = i128::from(word(8 + 2 * i)?);
        let exponent = 4 * (weight - i as i32) + exact_scale;
        let place = 10i128.checked_pow(exponent as u32).ok_or_else(overflow)?;
        value = digit
            .checked_mul(place)
            .and_then(|d| value.checked_add(d))
            .ok_or_else(overflow)?;
    }
    let drop = 10i128
        .checked_pow((exact_scale - i32::from(scale)) as u32)
        .ok_or_else(overflow)?;
    let (mut rounded, rest) = (value / drop, value % drop);
    if rest * 2 >= drop {
        rounded += 1;
    }
    if rounded >= 10i128.pow(u32::from(precision)) {
        return Err(overflow());
    }
    Ok(if sign == 0x4000 { -rounded } else { rounded })
}

/// Value by value (interval, jsonb, bytea, arrays, ...), each cast to the column's type.
fn slow(pg: &Type, values: &[Option<&[u8]>], target: &DataType) -> Result<ArrayRef> {
    let parts: Vec<ArrayRef> = values
        .iter()
        .map(|value| {
            let one = match value {
                Some(bytes) => decode_binary_param(pg, bytes)?,
                None => arrow::array::new_null_array(target, 1),
            };
            arrow::compute::cast(&one, target)
                .map_err(|e| Error::new(SqlState::DATATYPE_MISMATCH, e.to_string()))
        })
        .collect::<Result<_>>()?;
    if parts.is_empty() {
        return Ok(arrow::array::new_empty_array(target));
    }
    let refs: Vec<&dyn Array> = parts.iter().map(|p| p.as_ref()).collect();
    arrow::compute::concat(&refs).map_err(|e| Error::internal(e.to_string()))
}
