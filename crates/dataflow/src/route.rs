//! Eddy's routing hash: which shard a row's key belongs to.
//!
//! A shard's checkpointed state holds the keys that hashed to it, so the hash must give the
//! same answer in every build that restores that checkpoint. It is Eddy's own, not
//! DataFusion's `create_hashes` (whose output is not promised across releases): XXH3-64, a
//! specified algorithm, over a canonical encoding of each key value that this module defines —
//! a tag byte (0 NULL, 1 a value) and the value's little-endian bytes (strings and binaries:
//! their bytes, then their length). Each column's value is hashed with the row's hash so far
//! as the seed. Changing any of this changes [`ROUTE_HASH_VERSION`], which checkpoints record;
//! a checkpoint of sharded state taken with another version is not restored (views are
//! rebuilt from the log).
//!
//! Keys are normalized before hashing (`rows::normalize_key`: -0.0 is 0.0, one NaN), so
//! values that compare equal hash equal. Types without a canonical encoding here (nested
//! types) are not sharded by ([`routable`]).

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Date64Type, Decimal128Type, Decimal256Type,
    DurationMicrosecondType, DurationMillisecondType, DurationNanosecondType, DurationSecondType,
    Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, IntervalDayTimeType,
    IntervalMonthDayNanoType, IntervalUnit, IntervalYearMonthType, Time32MillisecondType,
    Time32SecondType, Time64MicrosecondType, Time64NanosecondType, TimeUnit,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use eddy_common::{ChangeBatch, Error, Result};

use crate::plan::Expr;
use twox_hash::XxHash3_64;

/// The version of [`hash_keys`]; recorded with every checkpoint.
///
/// 2: a keyed operator with one input fed through a union (a HOP) is split by the key columns
/// that pass through to its sources, which are routed by them (`source_routes.rs`).
pub const ROUTE_HASH_VERSION: u32 = 2;

/// Whether keys of this type can be routed (have a canonical encoding here).
pub fn routable(data_type: &DataType) -> bool {
    use DataType as D;
    matches!(
        data_type,
        D::Null
            | D::Boolean
            | D::Int8
            | D::Int16
            | D::Int32
            | D::Int64
            | D::UInt8
            | D::UInt16
            | D::UInt32
            | D::UInt64
            | D::Float32
            | D::Float64
            | D::Decimal128(..)
            | D::Decimal256(..)
            | D::Date32
            | D::Date64
            | D::Time32(_)
            | D::Time64(_)
            | D::Timestamp(..)
            | D::Duration(_)
            | D::Interval(_)
            | D::Utf8
            | D::LargeUtf8
            | D::Utf8View
            | D::Binary
            | D::LargeBinary
            | D::BinaryView
            | D::FixedSizeBinary(_)
    )
}

fn mix(hash: &mut u64, bytes: &[u8]) {
    *hash = XxHash3_64::oneshot_with_seed(*hash, bytes);
}

/// A value: its tag and little-endian bytes, mixed into the row's hash.
fn mix_value(hash: &mut u64, value: &[u8]) {
    let mut buf = [0u8; 33];
    if value.len() < buf.len() {
        buf[0] = 1;
        buf[1..=value.len()].copy_from_slice(value);
        mix(hash, &buf[..=value.len()]);
    } else {
        mix(hash, &[1]);
        mix(hash, value);
    }
}

fn primitive<T: ArrowPrimitiveType>(
    column: &ArrayRef,
    hashes: &mut [u64],
    bytes: impl Fn(T::Native, &mut [u8; 32]) -> usize,
) {
    let values = column.as_primitive::<T>();
    let mut buf = [0u8; 32];
    for (i, hash) in hashes.iter_mut().enumerate() {
        if values.is_null(i) {
            mix(hash, &[0]);
        } else {
            let n = bytes(values.value(i), &mut buf);
            mix_value(hash, &buf[..n]);
        }
    }
}

fn le<const N: usize>(bytes: [u8; N], buf: &mut [u8; 32]) -> usize {
    buf[..N].copy_from_slice(&bytes);
    N
}

fn bytes_of(column: &ArrayRef, i: usize) -> Option<&[u8]> {
    if column.is_null(i) {
        return None;
    }
    Some(match column.data_type() {
        DataType::Utf8 => column.as_string::<i32>().value(i).as_bytes(),
        DataType::LargeUtf8 => column.as_string::<i64>().value(i).as_bytes(),
        DataType::Utf8View => column.as_string_view().value(i).as_bytes(),
        DataType::Binary => column.as_binary::<i32>().value(i),
        DataType::LargeBinary => column.as_binary::<i64>().value(i),
        DataType::BinaryView => column.as_binary_view().value(i),
        _ => column.as_fixed_size_binary().value(i),
    })
}

/// Each row's routing hash over the values of `keys` (equal lengths, `rows` rows).
pub fn hash_keys(keys: &[ArrayRef], rows: usize) -> Result<Vec<u64>> {
    let mut hashes = vec![0u64; rows];
    for column in keys {
        if column.len() != rows {
            return Err(Error::internal(
                "routing keys of another length than the batch",
            ));
        }
        hash_column(column, &mut hashes)?;
    }
    Ok(hashes)
}

/// Each row's shard of `n`: the routing hash of its key values. A row whose key cannot be
/// evaluated (a data exception such as division by zero) fails the same way in any shard; it
/// goes to shard 0, which sets it aside as the unsharded operator would.
pub(crate) fn shard_of(batch: &ChangeBatch, keys: &[Expr], n: usize) -> Result<Vec<u32>> {
    let of = |hash: u64| (hash % n as u64) as u32;
    match crate::rows::evaluate_keys(keys, batch.rows()) {
        Ok(values) => Ok(hash_keys(&values, batch.len())?
            .into_iter()
            .map(of)
            .collect()),
        Err(e) if e.state.is_data_exception() => (0..batch.len())
            .map(|i| {
                let row = batch.rows().slice(i, 1);
                match crate::rows::evaluate_keys(keys, &row) {
                    Ok(values) => Ok(hash_keys(&values, 1)?.first().map_or(0, |h| of(*h))),
                    Err(e) if e.state.is_data_exception() => Ok(0),
                    Err(e) => Err(e),
                }
            })
            .collect(),
        Err(e) => Err(e),
    }
}

/// The rows of `changes` by the shard of `n` their key picks ([`shard_of`]): one selection
/// per shard, taken once (rows of one shard keep their order); shards without rows are left
/// out, and a batch whose rows all pick one shard goes there whole.
pub(crate) fn split(
    changes: &ChangeBatch,
    keys: &[Expr],
    n: usize,
) -> Result<Vec<(usize, ChangeBatch)>> {
    if n <= 1 || changes.is_empty() {
        return Ok(vec![(0, changes.clone())]);
    }
    let part = shard_of(changes, keys, n)?;
    if let Some(&first) = part.first()
        && part.iter().all(|p| *p == first)
    {
        return Ok(vec![(first as usize, changes.clone())]);
    }
    Ok(crate::rows::split_by(changes, &part, n)?
        .into_iter()
        .enumerate()
        .filter(|(_, c)| !c.is_empty())
        .collect())
}

fn hash_column(column: &ArrayRef, hashes: &mut [u64]) -> Result<()> {
    use DataType as D;
    match column.data_type() {
        D::Null => hashes.iter_mut().for_each(|h| mix(h, &[0])),
        D::Boolean => {
            let values = column.as_boolean();
            for (i, hash) in hashes.iter_mut().enumerate() {
                if values.is_null(i) {
                    mix(hash, &[0]);
                } else {
                    mix_value(hash, &[u8::from(values.value(i))]);
                }
            }
        }
        D::Int8 => primitive::<Int8Type>(column, hashes, |v, b| le(v.to_le_bytes(), b)),
        D::Int16 => primitive::<Int16Type>(column, hashes, |v, b| le(v.to_le_bytes(), b)),
        D::Int32 => primitive::<Int32Type>(column, hashes, |v, b| le(v.to_le_bytes(), b)),
        D::Int64 => primitive::<Int64Type>(column, hashes, |v, b| le(v.to_le_bytes(), b)),
        D::UInt8 => primitive::<UInt8Type>(column, hashes, |v, b| le(v.to_le_bytes(), b)),
        D::UInt16 => primitive::<UInt16Type>(column, hashes, |v, b| le(v.to_le_bytes(), b)),
        D::UInt32 => primitive::<UInt32Type>(column, hashes, |v, b| le(v.to_le_bytes(), b)),
        D::UInt64 => primitive::<UInt64Type>(column, hashes, |v, b| le(v.to_le_bytes(), b)),
        D::Float32 => primitive::<Float32Type>(column, hashes, |v, b| le(v.to_le_bytes(), b)),
        D::Float64 => primitive::<Float64Type>(column, hashes, |v, b| le(v.to_le_bytes(), b)),
        D::Decimal128(..) => {
            primitive::<Decimal128Type>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Decimal256(..) => {
            primitive::<Decimal256Type>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Date32 => primitive::<Date32Type>(column, hashes, |v, b| le(v.to_le_bytes(), b)),
        D::Date64 => primitive::<Date64Type>(column, hashes, |v, b| le(v.to_le_bytes(), b)),
        D::Time32(TimeUnit::Second) => {
            primitive::<Time32SecondType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Time32(_) => {
            primitive::<Time32MillisecondType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Time64(TimeUnit::Microsecond) => {
            primitive::<Time64MicrosecondType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Time64(_) => {
            primitive::<Time64NanosecondType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Timestamp(TimeUnit::Second, _) => {
            primitive::<TimestampSecondType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Timestamp(TimeUnit::Millisecond, _) => {
            primitive::<TimestampMillisecondType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Timestamp(TimeUnit::Microsecond, _) => {
            primitive::<TimestampMicrosecondType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Timestamp(TimeUnit::Nanosecond, _) => {
            primitive::<TimestampNanosecondType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Duration(TimeUnit::Second) => {
            primitive::<DurationSecondType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Duration(TimeUnit::Millisecond) => {
            primitive::<DurationMillisecondType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Duration(TimeUnit::Microsecond) => {
            primitive::<DurationMicrosecondType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Duration(TimeUnit::Nanosecond) => {
            primitive::<DurationNanosecondType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Interval(IntervalUnit::YearMonth) => {
            primitive::<IntervalYearMonthType>(column, hashes, |v, b| le(v.to_le_bytes(), b))
        }
        D::Interval(IntervalUnit::DayTime) => {
            primitive::<IntervalDayTimeType>(column, hashes, |v, b| {
                b[..4].copy_from_slice(&v.days.to_le_bytes());
                b[4..8].copy_from_slice(&v.milliseconds.to_le_bytes());
                8
            })
        }
        D::Interval(IntervalUnit::MonthDayNano) => {
            primitive::<IntervalMonthDayNanoType>(column, hashes, |v, b| {
                b[..4].copy_from_slice(&v.months.to_le_bytes());
                b[4..8].copy_from_slice(&v.days.to_le_bytes());
                b[8..16].copy_from_slice(&v.nanoseconds.to_le_bytes());
                16
            })
        }
        D::Utf8
        | D::LargeUtf8
        | D::Utf8View
        | D::Binary
        | D::LargeBinary
        | D::BinaryView
        | D::FixedSizeBinary(_) => {
            for (i, hash) in hashes.iter_mut().enumerate() {
                match bytes_of(column, i) {
                    None => mix(hash, &[0]),
                    Some(value) => {
                        mix(hash, &[1]);
                        mix(hash, value);
                        mix(hash, &(value.len() as u64).to_le_bytes());
                    }
                }
            }
        }
        other => {
            return Err(Error::internal(format!(
                "keys of type {other} have no routing hash"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};

    use super::*;

    /// The hash is part of the checkpoint format: these values may only change together with
    /// [`ROUTE_HASH_VERSION`].
    #[test]
    fn the_routing_hash_is_stable() {
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None, Some(-7)]));
        let texts: ArrayRef = Arc::new(StringArray::from(vec![Some("a"), Some(""), None]));
        let hashes = hash_keys(&[ints, texts], 3).unwrap();
        assert_eq!(ROUTE_HASH_VERSION, 2);
        assert_eq!(hashes, PINNED, "{hashes:x?}");
    }

    const PINNED: [u64; 3] = [
        0xe5f1_fe39_db11_95d6,
        0xd9d8_e423_5dd5_c744,
        0x6a32_2f4e_453a_6688,
    ];

    #[test]
    fn equal_keys_hash_equal_and_types_keep_apart() {
        let a: ArrayRef = Arc::new(StringArray::from(vec!["ab", "ab", "a"]));
        let b: ArrayRef = Arc::new(StringArray::from(vec!["c", "c", "bc"]));
        let h = hash_keys(&[a, b], 3).unwrap();
        assert_eq!(h[0], h[1]);
        assert_ne!(h[0], h[2], "(ab, c) and (a, bc) are different keys");
        let null: ArrayRef = Arc::new(Int64Array::from(vec![None, Some(0)]));
        let h = hash_keys(&[null], 2).unwrap();
        assert_ne!(h[0], h[1], "NULL is not 0");
    }
}
