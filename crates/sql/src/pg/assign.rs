//! Assignment to a column of a declared PostgreSQL type that Arrow stores as text: what
//! PostgreSQL checks when a value is stored (INSERT, UPDATE, COPY), beyond the Arrow type.
//!
//! - `varchar(n)` and `char(n)`: a longer value is 22001 "value too long for type ...",
//!   unless what passes `n` is blanks, which are cut (an explicit cast truncates instead, see
//!   [`super::cast`]); `char(n)` is kept without its trailing blanks (they are padded back
//!   when shown);
//! - `jsonb` is stored in its normal form and `json` as written, both checked to be JSON.
//!
//! Entry point: [`to_declared`]. Columns of other types are returned unchanged (no copy).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use arrow::datatypes::{DataType, Field};
use eddy_common::{Error, Result, SqlState};

use crate::types::PG_TYPE_KEY;

enum Declared {
    Varchar(usize),
    Bpchar(usize),
    Jsonb,
    Json,
}

fn declared(field: &Field) -> Option<Declared> {
    let name = field.metadata().get(PG_TYPE_KEY)?;
    let length = |prefix: &str| name.strip_prefix(prefix)?.strip_suffix(')')?.parse().ok();
    Some(match name.as_str() {
        "jsonb" => Declared::Jsonb,
        "json" => Declared::Json,
        _ => {
            if let Some(n) = length("character varying(") {
                Declared::Varchar(n)
            } else {
                Declared::Bpchar(length("character(")?)
            }
        }
    })
}

/// `column` as stored in a column declared as `field` says.
pub fn to_declared(column: &ArrayRef, field: &Field) -> Result<ArrayRef> {
    let Some(declared) = declared(field) else {
        return Ok(Arc::clone(column));
    };
    if !matches!(column.data_type(), DataType::Utf8) {
        return Ok(Arc::clone(column));
    }
    let strings = column.as_string::<i32>();
    let mut b = StringBuilder::with_capacity(strings.len(), strings.value_data().len());
    for v in strings.iter() {
        let Some(v) = v else {
            b.append_null();
            continue;
        };
        match declared {
            Declared::Jsonb => b.append_value(super::json::normalize(v)?),
            Declared::Json => {
                super::json::parse(v)?;
                b.append_value(v);
            }
            Declared::Varchar(n) => b.append_value(fit(v, n, "character varying")?),
            Declared::Bpchar(n) => b.append_value(fit(v, n, "character")?.trim_end_matches(' ')),
        }
    }
    Ok(Arc::new(b.finish()))
}

/// `v` cut to `n` characters if only blanks pass them; else 22001.
fn fit<'a>(v: &'a str, n: usize, type_name: &str) -> Result<&'a str> {
    match v.char_indices().nth(n) {
        None => Ok(v),
        Some((at, _)) if v[at..].bytes().all(|b| b == b' ') => Ok(&v[..at]),
        Some(_) => Err(Error::new(
            SqlState::STRING_DATA_RIGHT_TRUNCATION,
            format!("value too long for type {type_name}({n})"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_as_postgres_checks_them() {
        assert_eq!(fit("abc", 3, "character varying").unwrap(), "abc");
        assert_eq!(fit("ab   ", 3, "character varying").unwrap(), "ab ");
        assert_eq!(fit("日本語", 3, "character varying").unwrap(), "日本語");
        let e = fit("abcd", 3, "character varying").unwrap_err();
        assert_eq!(
            (e.state, e.message.as_str()),
            (
                SqlState::STRING_DATA_RIGHT_TRUNCATION,
                "value too long for type character varying(3)"
            )
        );
    }
}
