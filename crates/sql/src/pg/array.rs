//! PostgreSQL arrays over Arrow lists: the array text input (`'{1,2}'`, `'{"a b",NULL}'`),
//! and the array functions whose PostgreSQL forms differ from DataFusion's (`cardinality`,
//! `array_length`, `array_lower`, `array_upper` are `integer`, as in PostgreSQL).
//!
//! Entry points: [`parse_literal`] reads one array literal into its elements' texts;
//! [`from_text`] reads a column of them into a list column, the elements read with the
//! element type's own text input (so `'{1,x}'::int[]` fails as `'x'::int` does).
//! Invariant: a list column Eddy builds has one dimension; a multidimensional literal is
//! refused with 0A000 rather than flattened.

use std::sync::Arc;

use arrow::array::{Array, ArrayBuilder, ArrayRef, AsArray, Int32Builder, ListArray, StringArray};
use arrow::buffer::{NullBuffer, OffsetBuffer};
use arrow::datatypes::{DataType, FieldRef};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, Signature, TypeSignature,
};
use eddy_common::{Error, Result, SqlState};

use super::cast::external;
use super::udf::{IMMUTABLE, PgFunction, arrays};

fn malformed(text: &str, detail: &str) -> Error {
    Error::new(
        SqlState::INVALID_TEXT_REPRESENTATION,
        format!("malformed array literal: \"{text}\""),
    )
    .with_detail(detail.to_owned())
}

/// The elements of a one-dimensional PostgreSQL array literal, as text (`None` for an
/// unquoted `NULL`). Quoting and backslash escapes follow PostgreSQL's `array_in`; an
/// optional dimension decoration (`[1:2]={...}`) is accepted when its lower bound is 1.
pub fn parse_literal(text: &str) -> Result<Vec<Option<String>>> {
    let mut body = text.trim_start();
    if body.starts_with('[') {
        let Some((dims, rest)) = body.split_once('=') else {
            return Err(malformed(text, "Missing \"=\" after array dimensions."));
        };
        if !dims.trim().starts_with("[1:") || dims.matches('[').count() > 1 {
            return Err(Error::unsupported(
                "arrays with a lower bound other than 1, or of more than one dimension, are not supported",
            ));
        }
        body = rest.trim_start();
    }
    let Some(inner) = body.strip_prefix('{') else {
        return Err(malformed(
            text,
            "Array value must start with \"{\" or dimension information.",
        ));
    };
    let mut chars = inner.char_indices().peekable();
    let mut out = Vec::new();
    let skip_space = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while chars.peek().is_some_and(|(_, c)| c.is_whitespace()) {
            chars.next();
        }
    };
    loop {
        skip_space(&mut chars);
        match chars.peek().map(|(_, c)| *c) {
            None => return Err(malformed(text, "Unexpected end of input.")),
            Some('}') if out.is_empty() => {
                chars.next();
                break;
            }
            Some('{') => {
                return Err(Error::unsupported(
                    "multidimensional arrays are not supported",
                ));
            }
            Some('"') => {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next().map(|(_, c)| c) {
                        None => return Err(malformed(text, "Unexpected end of input.")),
                        Some('"') => break,
                        Some('\\') => s.push(
                            chars
                                .next()
                                .map(|(_, c)| c)
                                .ok_or_else(|| malformed(text, "Unexpected end of input."))?,
                        ),
                        Some(c) => s.push(c),
                    }
                }
                out.push(Some(s));
            }
            Some(_) => {
                let mut s = String::new();
                // Trailing unescaped blanks are not part of an unquoted element.
                let mut kept = 0;
                let mut escaped_any = false;
                while let Some(&(_, c)) = chars.peek() {
                    match c {
                        ',' | '}' => break,
                        '{' | '"' => {
                            return Err(malformed(text, "Unexpected \"{\" or quote character."));
                        }
                        '\\' => {
                            chars.next();
                            s.push(
                                chars
                                    .next()
                                    .map(|(_, c)| c)
                                    .ok_or_else(|| malformed(text, "Unexpected end of input."))?,
                            );
                            kept = s.len();
                            escaped_any = true;
                        }
                        c => {
                            chars.next();
                            s.push(c);
                            if !c.is_whitespace() {
                                kept = s.len();
                            }
                        }
                    }
                }
                s.truncate(kept);
                if s.is_empty() {
                    return Err(malformed(text, "Unexpected \",\" character."));
                }
                out.push(if !escaped_any && s.eq_ignore_ascii_case("null") {
                    None
                } else {
                    Some(s)
                });
            }
        }
        skip_space(&mut chars);
        match chars.next().map(|(_, c)| c) {
            Some(',') => {}
            Some('}') => break,
            None => return Err(malformed(text, "Unexpected end of input.")),
            Some(_) => return Err(malformed(text, "Unexpected array element.")),
        }
    }
    if chars.any(|(_, c)| !c.is_whitespace()) {
        return Err(malformed(text, "Junk after closing right brace."));
    }
    Ok(out)
}

/// Array literals to a list column of `element`: every literal's elements in one string
/// column, read by `read_elements` with the element type's input syntax, then cut into lists.
pub fn from_text(
    strings: &StringArray,
    element: &FieldRef,
    read_elements: impl FnOnce(&StringArray, &DataType) -> super::udf::Result<ArrayRef>,
) -> super::udf::Result<ArrayRef> {
    let mut texts: Vec<Option<String>> = Vec::new();
    let mut offsets: Vec<i32> = Vec::with_capacity(strings.len() + 1);
    offsets.push(0);
    for s in strings.iter() {
        if let Some(s) = s {
            texts.extend(parse_literal(s).map_err(external)?);
        }
        let end = i32::try_from(texts.len()).map_err(|_| {
            external(Error::new(
                SqlState::PROGRAM_LIMIT_EXCEEDED,
                "array size exceeds the maximum allowed",
            ))
        })?;
        offsets.push(end);
    }
    let elements = StringArray::from(texts);
    let values = read_elements(&elements, element.data_type())?;
    let nulls = strings.nulls().cloned();
    let list = ListArray::try_new(
        Arc::clone(element),
        OffsetBuffer::new(offsets.into()),
        values,
        nulls,
    )?;
    Ok(Arc::new(list))
}

/// The lists of a list-typed column (`None` for other types).
fn lists(column: &ArrayRef) -> Option<(&OffsetBuffer<i32>, Option<&NullBuffer>)> {
    match column.data_type() {
        DataType::List(_) => {
            let l = column.as_list::<i32>();
            Some((l.offsets(), l.nulls()))
        }
        _ => None,
    }
}

/// `array_length(a, dim)`, `array_lower(a, dim)`, `array_upper(a, dim)`, `cardinality(a)`:
/// integers, NULL for an empty array or a dimension it does not have, as PostgreSQL.
fn dimension_function(name: &'static str, measure: fn(usize) -> i32) -> ScalarUDF {
    let signatures = if name == "cardinality" {
        vec![TypeSignature::Any(1)]
    } else {
        vec![TypeSignature::Any(2)]
    };
    PgFunction::new(
        name,
        Signature::one_of(signatures, IMMUTABLE),
        DataType::Int32,
        move |args| {
            let a = arrays(args)?;
            let column = arrow::compute::cast(&a[0], &DataType::List(list_item(a[0].data_type())))?;
            let (offsets, nulls) = lists(&column)
                .ok_or_else(|| external(Error::internal(format!("{name} of a non-array"))))?;
            let dims = match a.get(1) {
                Some(d) => Some(arrow::compute::cast(d, &DataType::Int64)?),
                None => None,
            };
            let mut b = Int32Builder::with_capacity(column.len());
            for i in 0..column.len() {
                let len = (offsets[i + 1] - offsets[i]) as usize;
                let dim_ok = dims.as_ref().is_none_or(|d| {
                    d.is_valid(i) && d.as_primitive::<arrow::datatypes::Int64Type>().value(i) == 1
                });
                let null = nulls.is_some_and(|n| n.is_null(i));
                if null || !dim_ok || (len == 0 && name != "cardinality") {
                    b.append_null();
                } else {
                    b.append_value(measure(len));
                }
            }
            Ok(ColumnarValue::Array(Arc::new(b.finish())))
        },
    )
    .udf()
}

fn list_item(t: &DataType) -> FieldRef {
    match t {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => Arc::clone(f),
        _ => Arc::new(arrow::datatypes::Field::new_list_field(
            DataType::Null,
            true,
        )),
    }
}

pub const SUBSCRIPTS: &str = "eddy_array_subscripts";

/// The subscripts of an array's dimension as a list (`generate_subscripts` unnests it).
fn subscripts() -> ScalarUDF {
    let item = Arc::new(arrow::datatypes::Field::new_list_field(
        DataType::Int32,
        true,
    ));
    PgFunction::new(
        SUBSCRIPTS,
        Signature::any(2, IMMUTABLE),
        DataType::List(Arc::clone(&item)),
        move |args| {
            let a = arrays(args)?;
            let column = arrow::compute::cast(&a[0], &DataType::List(list_item(a[0].data_type())))?;
            let (offsets, nulls) = lists(&column)
                .ok_or_else(|| external(Error::internal("generate_subscripts of a non-array")))?;
            let dims = arrow::compute::cast(&a[1], &DataType::Int64)?;
            let dims = dims.as_primitive::<arrow::datatypes::Int64Type>();
            let mut values = Int32Builder::new();
            let mut out_offsets = vec![0i32];
            for i in 0..column.len() {
                let valid =
                    nulls.is_none_or(|n| n.is_valid(i)) && dims.is_valid(i) && dims.value(i) == 1;
                if valid {
                    let len = offsets[i + 1] - offsets[i];
                    (1..=len).for_each(|k| values.append_value(k));
                }
                out_offsets.push(i32::try_from(values.len()).unwrap_or(i32::MAX));
            }
            let list = ListArray::try_new(
                Arc::clone(&item),
                OffsetBuffer::new(out_offsets.into()),
                Arc::new(values.finish()),
                None,
            )?;
            Ok(ColumnarValue::Array(Arc::new(list)))
        },
    )
    .udf()
}

/// `array_dims(a)`: `[1:n]`, NULL for an empty array.
fn dims() -> ScalarUDF {
    PgFunction::new(
        "array_dims",
        Signature::any(1, IMMUTABLE),
        DataType::Utf8,
        |args| {
            let a = arrays(args)?;
            let column = arrow::compute::cast(&a[0], &DataType::List(list_item(a[0].data_type())))?;
            let (offsets, nulls) = lists(&column)
                .ok_or_else(|| external(Error::internal("array_dims of a non-array")))?;
            let mut b = arrow::array::StringBuilder::new();
            for i in 0..column.len() {
                let len = offsets[i + 1] - offsets[i];
                if nulls.is_some_and(|n| n.is_null(i)) || len == 0 {
                    b.append_null()
                } else {
                    b.append_value(format!("[1:{len}]"))
                }
            }
            Ok(ColumnarValue::Array(Arc::new(b.finish())))
        },
    )
    .udf()
}

/// `array_position(a, x)`: DataFusion's, as an integer.
fn position(df: Arc<ScalarUDF>) -> ScalarUDF {
    PgFunction::new(
        "array_position",
        Signature::one_of(
            vec![TypeSignature::Any(2), TypeSignature::Any(3)],
            IMMUTABLE,
        ),
        DataType::Int32,
        move |args| {
            let inner = ScalarFunctionArgs {
                return_field: Arc::new(arrow::datatypes::Field::new("", DataType::UInt64, true)),
                ..args.clone()
            };
            let result = df.invoke_with_args(inner)?;
            Ok(ColumnarValue::Array(arrow::compute::cast(
                &result.to_array(args.number_rows)?,
                &DataType::Int32,
            )?))
        },
    )
    .udf()
}

pub fn functions() -> Vec<ScalarUDF> {
    let length = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    vec![
        subscripts(),
        dims(),
        position(datafusion::functions_nested::position::array_position_udf()),
        dimension_function("cardinality", length),
        dimension_function("array_length", length),
        dimension_function("array_upper", length),
        dimension_function("array_lower", |_| 1),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Vec<Option<&'static str>> {
        parse_literal(text)
            .unwrap()
            .into_iter()
            .map(|e| e.map(|s| &*s.leak()))
            .collect()
    }

    #[test]
    fn literals_as_array_in_reads_them() {
        assert_eq!(parsed("{1,2}"), vec![Some("1"), Some("2")]);
        assert_eq!(parsed(" { 1 , 2 } "), vec![Some("1"), Some("2")]);
        assert_eq!(parsed("{}"), Vec::<Option<&str>>::new());
        assert_eq!(
            parsed(r#"{"a b",NULL,c,"NULL",\N\ULL}"#),
            vec![Some("a b"), None, Some("c"), Some("NULL"), Some("NULL")]
        );
        assert_eq!(
            parsed(r#"{"a\"b","x\\y",a b}"#),
            vec![Some("a\"b"), Some("x\\y"), Some("a b")]
        );
        assert_eq!(parsed("[1:2]={5,6}"), vec![Some("5"), Some("6")]);
        assert_eq!(
            parse_literal("1,2").unwrap_err().state,
            SqlState::INVALID_TEXT_REPRESENTATION
        );
        assert_eq!(
            parse_literal("{1,2").unwrap_err().state,
            SqlState::INVALID_TEXT_REPRESENTATION
        );
        assert_eq!(
            parse_literal("{1,,2}").unwrap_err().state,
            SqlState::INVALID_TEXT_REPRESENTATION
        );
        assert_eq!(
            parse_literal("{1} x").unwrap_err().state,
            SqlState::INVALID_TEXT_REPRESENTATION
        );
        assert_eq!(
            parse_literal("{{1,2},{3,4}}").unwrap_err().state,
            SqlState::FEATURE_NOT_SUPPORTED
        );
    }
}
