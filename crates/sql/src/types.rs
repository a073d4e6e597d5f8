//! SQL column types: how a declared type becomes an Arrow type, and back into SQL text.
//!
//! Arrow alone cannot tell `text` from `varchar(20)` or `jsonb`, or an unconstrained `numeric`
//! from `numeric(38,10)`; the declared PostgreSQL type travels in the field's metadata under
//! [`PG_TYPE_KEY`] so the wire layer can report the right type OID and SHOW CREATE TABLE can
//! print what the user wrote.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, IntervalUnit, TimeUnit};
use datafusion::sql::sqlparser::ast::{self, CharacterLength, ExactNumberInfo, TimezoneInfo};
use eddy_common::{Error, Result};

/// Field metadata key holding the declared PostgreSQL type name (`varchar(20)`, `jsonb`, ...).
pub const PG_TYPE_KEY: &str = "eddy.pg_type";

/// Field metadata key holding a table column's `DEFAULT` expression, as SQL text.
pub const DEFAULT_KEY: &str = "eddy.default";

/// Scale used for `numeric` declared without precision: Arrow decimals have a fixed scale.
pub const NUMERIC_DEFAULT_SCALE: i8 = 10;
pub const NUMERIC_PRECISION_MAX: u8 = 38;
/// The time zone Eddy stores `timestamptz` values in; sessions render them in theirs.
pub const UTC: &str = "UTC";

/// A column type: the Arrow type plus the PostgreSQL name to remember.
#[derive(Debug, Clone, PartialEq)]
pub struct ColumnType {
    pub arrow: DataType,
    pub pg_name: String,
}

impl ColumnType {
    fn new(arrow: DataType, pg_name: impl Into<String>) -> Self {
        ColumnType {
            arrow,
            pg_name: pg_name.into(),
        }
    }

    /// The Arrow field for a column of this type.
    pub fn field(&self, name: &str, nullable: bool) -> Field {
        Field::new(name, self.arrow.clone(), nullable).with_metadata(HashMap::from([(
            PG_TYPE_KEY.to_owned(),
            self.pg_name.clone(),
        )]))
    }
}

/// Resolves a type written as text (`bytea`, `timestamptz`, ...).
pub fn column_type_named(name: &str) -> Result<ColumnType> {
    use datafusion::sql::sqlparser::{dialect::PostgreSqlDialect, parser::Parser};
    let data_type = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(name)
        .and_then(|mut p| p.parse_data_type())
        .map_err(|e| eddy_common::Error::internal(format!("type {name}: {e}")))?;
    column_type(&data_type)
}

/// Resolves a declared SQL type. Unsupported types are refused with 0A000 naming them.
pub fn column_type(sql: &ast::DataType) -> Result<ColumnType> {
    use ast::DataType as T;
    let t = match sql {
        T::Bool | T::Boolean => ColumnType::new(DataType::Boolean, "boolean"),
        T::SmallInt(_) | T::Int2(_) => ColumnType::new(DataType::Int16, "smallint"),
        T::Int(_) | T::Integer(_) | T::Int4(_) => ColumnType::new(DataType::Int32, "integer"),
        T::BigInt(_) | T::Int8(_) => ColumnType::new(DataType::Int64, "bigint"),
        T::Real | T::Float4 => ColumnType::new(DataType::Float32, "real"),
        T::DoublePrecision | T::Float8 | T::Double(ExactNumberInfo::None) => {
            ColumnType::new(DataType::Float64, "double precision")
        }
        T::Float(ExactNumberInfo::Precision(p)) if *p <= 24 => {
            ColumnType::new(DataType::Float32, "real")
        }
        T::Float(_) => ColumnType::new(DataType::Float64, "double precision"),
        T::Numeric(info) | T::Decimal(info) | T::Dec(info) => numeric(info)?,
        T::Text | T::String(None) => ColumnType::new(DataType::Utf8, "text"),
        T::Varchar(len) | T::CharacterVarying(len) | T::CharVarying(len) => match len {
            Some(CharacterLength::IntegerLength { length, .. }) => {
                ColumnType::new(DataType::Utf8, format!("character varying({length})"))
            }
            _ => ColumnType::new(DataType::Utf8, "character varying"),
        },
        T::Char(len) | T::Character(len) => match len {
            Some(CharacterLength::IntegerLength { length, .. }) => {
                ColumnType::new(DataType::Utf8, format!("character({length})"))
            }
            _ => ColumnType::new(DataType::Utf8, "character(1)"),
        },
        T::Bytea => ColumnType::new(DataType::Binary, "bytea"),
        T::Date => ColumnType::new(DataType::Date32, "date"),
        T::Time(_, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => ColumnType::new(
            DataType::Time64(TimeUnit::Microsecond),
            "time without time zone",
        ),
        T::Timestamp(_, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => ColumnType::new(
            DataType::Timestamp(TimeUnit::Microsecond, None),
            "timestamp without time zone",
        ),
        T::Timestamp(_, TimezoneInfo::WithTimeZone | TimezoneInfo::Tz) => ColumnType::new(
            DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
            "timestamp with time zone",
        ),
        T::Interval { .. } => {
            ColumnType::new(DataType::Interval(IntervalUnit::MonthDayNano), "interval")
        }
        T::Array(
            ast::ArrayElemTypeDef::SquareBracket(element, _)
            | ast::ArrayElemTypeDef::AngleBracket(element)
            | ast::ArrayElemTypeDef::Parenthesis(element),
        ) => {
            let element = column_type(element)?;
            if matches!(element.arrow, DataType::List(_)) {
                return Err(Error::unsupported(
                    "multidimensional array types are not supported",
                ));
            }
            ColumnType::new(
                DataType::List(Arc::new(Field::new_list_field(element.arrow, true))),
                format!("{}[]", element.pg_name),
            )
        }
        T::JSON => ColumnType::new(DataType::Utf8, "json"),
        T::JSONB => ColumnType::new(DataType::Utf8, "jsonb"),
        T::Custom(name, _) => match name.to_string().to_lowercase().as_str() {
            "timestamptz" => ColumnType::new(
                DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
                "timestamp with time zone",
            ),
            "serial" | "bigserial" => {
                return Err(Error::unsupported(format!(
                    "type {name} is not supported yet: declare the column BIGINT and supply the values"
                )));
            }
            other => {
                return Err(Error::unsupported(format!(
                    "type \"{other}\" is not supported"
                )));
            }
        },
        other => {
            return Err(Error::unsupported(format!(
                "type \"{other}\" is not supported"
            )));
        }
    };
    Ok(t)
}

fn numeric(info: &ExactNumberInfo) -> Result<ColumnType> {
    let (precision, scale, name) = match *info {
        ExactNumberInfo::None => (
            NUMERIC_PRECISION_MAX,
            NUMERIC_DEFAULT_SCALE,
            "numeric".to_owned(),
        ),
        ExactNumberInfo::Precision(p) => (
            u8::try_from(p).unwrap_or(u8::MAX),
            0,
            format!("numeric({p},0)"),
        ),
        ExactNumberInfo::PrecisionAndScale(p, s) => {
            let s = i8::try_from(s).map_err(|_| {
                Error::invalid_parameter(format!("NUMERIC scale {s} is out of range"))
            })?;
            (
                u8::try_from(p).unwrap_or(u8::MAX),
                s,
                format!("numeric({p},{s})"),
            )
        }
    };
    if precision == 0 || precision > NUMERIC_PRECISION_MAX {
        return Err(Error::unsupported(format!(
            "NUMERIC precision {precision} is not supported: it must be between 1 and {NUMERIC_PRECISION_MAX}"
        )));
    }
    if scale < 0 || scale as u8 > precision {
        return Err(Error::invalid_parameter(format!(
            "NUMERIC scale {scale} must be between 0 and precision {precision}"
        )));
    }
    Ok(ColumnType::new(
        DataType::Decimal128(precision, scale),
        name,
    ))
}

/// The PostgreSQL name of a field's type: the declared one if known, else derived from Arrow.
pub fn pg_type_name(field: &Field) -> String {
    if let Some(name) = field.metadata().get(PG_TYPE_KEY) {
        return name.clone();
    }
    match field.data_type() {
        DataType::Boolean => "boolean".into(),
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => "smallint".into(),
        DataType::Int32 | DataType::UInt16 => "integer".into(),
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => "bigint".into(),
        DataType::Float16 | DataType::Float32 => "real".into(),
        DataType::Float64 => "double precision".into(),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => format!("numeric({p},{s})"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "text".into(),
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => "bytea".into(),
        DataType::Date32 | DataType::Date64 => "date".into(),
        DataType::Time32(_) | DataType::Time64(_) => "time without time zone".into(),
        DataType::Timestamp(_, None) => "timestamp without time zone".into(),
        DataType::Timestamp(_, Some(_)) => "timestamp with time zone".into(),
        DataType::Interval(_) | DataType::Duration(_) => "interval".into(),
        DataType::Null => "text".into(),
        DataType::List(element)
        | DataType::LargeList(element)
        | DataType::FixedSizeList(element, _) => format!("{}[]", pg_type_name(element)),
        other => other.to_string().to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_statements;

    #[test]
    fn declared_types_map_to_arrow() {
        let sql = "CREATE TABLE t (a int, b numeric(10,2), c numeric, d varchar(5), e timestamptz, \
                   f timestamp with time zone, g jsonb, h double precision, i interval, j bytea)";
        let parsed = parse_statements(sql).unwrap();
        let crate::Statement::CreateTable(t) = &parsed[0].statement else {
            panic!()
        };
        let types: Vec<String> = t
            .columns
            .iter()
            .map(|c| column_type(&c.data_type).unwrap().pg_name)
            .collect();
        insta::assert_snapshot!(types.join(", "), @"integer, numeric(10,2), numeric, character varying(5), timestamp with time zone, timestamp with time zone, jsonb, double precision, interval, bytea");
        assert_eq!(
            column_type(&t.columns[1].data_type).unwrap().arrow,
            DataType::Decimal128(10, 2)
        );
    }
}
