//! String functions DataFusion lacks, as PostgreSQL defines them: `format`, `quote_ident`,
//! `quote_literal`, `quote_nullable`, `convert_from`; `length` and `octet_length` that also measure bytea.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringBuilder};
use arrow::datatypes::DataType;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, Signature};
use eddy_common::{Error, SqlState};

use super::cast::{external, session_zone};
use super::text::{TextOptions, is_null, text_value};
use super::udf::{IMMUTABLE, PgFunction, Result, arrays};

/// Words PostgreSQL's quote_ident quotes even though they are lower case.
const RESERVED: &[&str] = &[
    "all",
    "analyse",
    "analyze",
    "and",
    "any",
    "array",
    "as",
    "asc",
    "asymmetric",
    "both",
    "case",
    "cast",
    "check",
    "collate",
    "column",
    "constraint",
    "create",
    "current_catalog",
    "current_date",
    "current_role",
    "current_time",
    "current_timestamp",
    "current_user",
    "default",
    "deferrable",
    "desc",
    "distinct",
    "do",
    "else",
    "end",
    "except",
    "false",
    "fetch",
    "for",
    "foreign",
    "from",
    "grant",
    "group",
    "having",
    "in",
    "initially",
    "intersect",
    "into",
    "lateral",
    "leading",
    "limit",
    "localtime",
    "localtimestamp",
    "not",
    "null",
    "offset",
    "on",
    "only",
    "or",
    "order",
    "placing",
    "primary",
    "references",
    "returning",
    "select",
    "session_user",
    "some",
    "symmetric",
    "table",
    "then",
    "to",
    "trailing",
    "true",
    "union",
    "unique",
    "user",
    "using",
    "variadic",
    "when",
    "where",
    "window",
    "with",
];

pub fn quote_ident(s: &str) -> String {
    let plain = s
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !RESERVED.contains(&s);
    if plain {
        s.to_owned()
    } else {
        format!("\"{}\"", s.replace('"', "\"\""))
    }
}

pub fn quote_literal(s: &str) -> String {
    let body = s.replace('\'', "''");
    if s.contains('\\') {
        format!("E'{}'", body.replace('\\', "\\\\"))
    } else {
        format!("'{body}'")
    }
}

fn format_error(message: impl Into<String>) -> datafusion::common::DataFusionError {
    external(Error::new(SqlState::INVALID_PARAMETER_VALUE, message))
}

/// One row of `format(template, args...)`; `arg(i)` is the i-th argument's text (None: NULL).
fn format_row(
    template: &str,
    arg: &dyn Fn(usize) -> Result<Option<String>>,
    count: usize,
) -> Result<String> {
    let mut out = String::new();
    let mut chars = template.chars().peekable();
    let mut next = 0;
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            out.push('%');
            continue;
        }
        // %[position$][-][width]type
        let mut spec = String::new();
        while let Some(&d) = chars.peek() {
            if d.is_ascii_digit() || d == '$' || d == '-' {
                spec.push(d);
                chars.next();
            } else {
                break;
            }
        }
        let kind = chars
            .next()
            .ok_or_else(|| format_error("unterminated format() type specifier"))?;
        let (position, rest) = match spec.split_once('$') {
            Some((p, rest)) => (
                Some(
                    p.parse::<usize>()
                        .map_err(|_| format_error("invalid format() position"))?,
                ),
                rest.to_owned(),
            ),
            None => (None, spec),
        };
        let left = rest.starts_with('-');
        let width: usize = rest.trim_start_matches('-').parse().unwrap_or(0);
        let index = match position {
            Some(0) => {
                return Err(format_error(
                    "format specifies argument 0, but arguments are numbered from 1",
                ));
            }
            Some(p) => p - 1,
            None => next,
        };
        next = index + 1;
        if index >= count {
            return Err(format_error("too few arguments for format()"));
        }
        let value = arg(index)?;
        let text = match (kind, value) {
            ('s', v) => v.unwrap_or_default(),
            ('I', Some(v)) => quote_ident(&v),
            ('I', None) => {
                return Err(external(Error::new(
                    SqlState::NOT_NULL_VIOLATION,
                    "null values cannot be formatted as an SQL identifier",
                )));
            }
            ('L', Some(v)) => quote_literal(&v),
            ('L', None) => "NULL".to_owned(),
            (other, _) => {
                return Err(format_error(format!(
                    "unrecognized format() type specifier \"{other}\""
                )));
            }
        };
        let pad = width.saturating_sub(text.chars().count());
        if left {
            out.push_str(&text);
            out.extend(std::iter::repeat_n(' ', pad));
        } else {
            out.extend(std::iter::repeat_n(' ', pad));
            out.push_str(&text);
        }
    }
    Ok(out)
}

fn format(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let options = TextOptions::output(session_zone(args));
    let text = |column: &ArrayRef, i: usize| -> Result<Option<String>> {
        if is_null(column, i) {
            Ok(None)
        } else {
            text_value(column, i, options).map(Some).map_err(external)
        }
    };
    let mut b = StringBuilder::with_capacity(args.number_rows, args.number_rows * 16);
    for row in 0..args.number_rows {
        match text(&a[0], row)? {
            None => b.append_null(),
            Some(template) => b.append_value(format_row(
                &template,
                &|k| text(&a[k + 1], row),
                a.len() - 1,
            )?),
        }
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

fn map_text(
    args: &ScalarFunctionArgs,
    null: Option<&str>,
    f: fn(&str) -> String,
) -> Result<ColumnarValue> {
    let input = &arrays(args)?[0];
    let options = TextOptions {
        bool_words: true,
        ..TextOptions::output(session_zone(args))
    };
    let mut b = StringBuilder::with_capacity(input.len(), input.len() * 8);
    for i in 0..input.len() {
        if is_null(input, i) {
            match null {
                Some(s) => b.append_value(s),
                None => b.append_null(),
            }
        } else {
            b.append_value(f(&text_value(input, i, options).map_err(external)?));
        }
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

/// `length` and `octet_length` of text (characters, bytes) and of bytea (bytes).
fn length(args: &ScalarFunctionArgs, bytes: bool) -> Result<ColumnarValue> {
    let input = &arrays(args)?[0];
    let out: arrow::array::Int32Array = match input.data_type() {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
            let b = arrow::compute::cast(input, &DataType::Binary)?;
            b.as_binary::<i32>()
                .iter()
                .map(|v| v.map(|v| v.len() as i32))
                .collect()
        }
        _ => {
            let s = arrow::compute::cast(input, &DataType::Utf8)?;
            s.as_string::<i32>()
                .iter()
                .map(|v| {
                    v.map(|v| {
                        if bytes {
                            v.len() as i32
                        } else {
                            v.chars().count() as i32
                        }
                    })
                })
                .collect()
        }
    };
    Ok(ColumnarValue::Array(Arc::new(out)))
}

fn length_type(
    name: &'static str,
) -> impl Fn(&datafusion::logical_expr::ReturnFieldArgs<'_>) -> Result<arrow::datatypes::Field> {
    move |args| {
        let t = args.arg_fields[0].data_type();
        if matches!(
            t,
            DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Utf8View
                | DataType::Binary
                | DataType::LargeBinary
                | DataType::BinaryView
                | DataType::Null
        ) {
            Ok(arrow::datatypes::Field::new("", DataType::Int32, true))
        } else {
            Err(super::udf::no_such_function(name, std::slice::from_ref(t)))
        }
    }
}

/// `convert_from(bytes, 'UTF8')`: bytea as text (Eddy's only encoding is UTF-8).
fn convert_from(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let bytes = arrow::compute::cast(&a[0], &DataType::Binary)?;
    let encodings = arrow::compute::cast(&a[1], &DataType::Utf8)?;
    let encodings = encodings.as_string::<i32>();
    let mut b = StringBuilder::with_capacity(bytes.len(), bytes.len() * 8);
    for (i, v) in bytes.as_binary::<i32>().iter().enumerate() {
        let Some(v) = v.filter(|_| !encodings.is_null(i)) else {
            b.append_null();
            continue;
        };
        let encoding = encodings
            .value(i)
            .to_ascii_uppercase()
            .replace(['-', '_'], "");
        if encoding != "UTF8" {
            return Err(external(Error::new(
                SqlState::INVALID_PARAMETER_VALUE,
                format!("invalid source encoding name \"{}\"", encodings.value(i)),
            )));
        }
        let text = std::str::from_utf8(v).map_err(|_| {
            external(Error::new(
                SqlState::CHARACTER_NOT_IN_REPERTOIRE,
                "invalid byte sequence for encoding \"UTF8\"",
            ))
        })?;
        b.append_value(text);
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

/// A LIKE pattern written with escape character `escape` (`LIKE p ESCAPE '/'`), rewritten
/// to the backslash escapes DataFusion's LIKE reads: `/x` is `\x`, a bare backslash is a
/// literal one (`\\`). An empty escape means none (every backslash literal).
pub(crate) const LIKE_ESCAPE: &str = "eddy_like_escape";

fn like_escape(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let patterns = arrow::compute::cast(&a[0], &DataType::Utf8)?;
    let escapes = arrow::compute::cast(&a[1], &DataType::Utf8)?;
    let (patterns, escapes) = (patterns.as_string::<i32>(), escapes.as_string::<i32>());
    let mut b = StringBuilder::with_capacity(patterns.len(), patterns.len() * 8);
    for i in 0..patterns.len() {
        if patterns.is_null(i) || escapes.is_null(i) {
            b.append_null();
            continue;
        }
        let mut chars = escapes.value(i).chars();
        let escape = match (chars.next(), chars.next()) {
            (None, _) => None,
            (Some(c), None) => Some(c),
            _ => {
                return Err(external(
                    Error::new(SqlState::INVALID_ESCAPE_SEQUENCE, "invalid escape string")
                        .with_hint("Escape string must be empty or one character."),
                ));
            }
        };
        let mut out = String::with_capacity(patterns.value(i).len());
        let mut pattern = patterns.value(i).chars();
        while let Some(c) = pattern.next() {
            if Some(c) == escape {
                match pattern.next() {
                    Some(next) => {
                        out.push('\\');
                        out.push(next);
                    }
                    None => {
                        return Err(external(Error::new(
                            SqlState::INVALID_ESCAPE_SEQUENCE,
                            "LIKE pattern must not end with escape character",
                        )));
                    }
                }
            } else if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        b.append_value(out);
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

pub fn functions() -> Vec<ScalarUDF> {
    vec![
        PgFunction::new(
            "convert_from",
            Signature::any(2, IMMUTABLE),
            DataType::Utf8,
            convert_from,
        )
        .udf(),
        PgFunction::new(
            LIKE_ESCAPE,
            Signature::any(2, IMMUTABLE),
            DataType::Utf8,
            like_escape,
        )
        .udf(),
        PgFunction::with_return(
            "length",
            Signature::any(1, IMMUTABLE),
            length_type("length"),
            |args| length(args, false),
        )
        .udf(),
        PgFunction::with_return(
            "octet_length",
            Signature::any(1, IMMUTABLE),
            length_type("octet_length"),
            |args| length(args, true),
        )
        .udf(),
        PgFunction::new(
            "format",
            Signature::variadic_any(IMMUTABLE),
            DataType::Utf8,
            format,
        )
        .udf(),
        PgFunction::new(
            "quote_ident",
            Signature::any(1, IMMUTABLE),
            DataType::Utf8,
            |args| map_text(args, None, quote_ident),
        )
        .udf(),
        PgFunction::new(
            "quote_literal",
            Signature::any(1, IMMUTABLE),
            DataType::Utf8,
            |args| map_text(args, None, quote_literal),
        )
        .udf(),
        PgFunction::new(
            "quote_nullable",
            Signature::any(1, IMMUTABLE),
            DataType::Utf8,
            |args| map_text(args, Some("NULL"), quote_literal),
        )
        .udf(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_and_quoting() {
        let args = ["a".to_owned(), "1".to_owned()];
        let arg = |i: usize| -> Result<Option<String>> { Ok(args.get(i).cloned()) };
        assert_eq!(format_row("%s-%s", &arg, 2).unwrap(), "a-1");
        assert_eq!(format_row("%2$s %1$s %%", &arg, 2).unwrap(), "1 a %");
        assert_eq!(format_row("[%5s|%-3s]", &arg, 2).unwrap(), "[    a|1  ]");
        assert_eq!(quote_ident("my col"), "\"my col\"");
        assert_eq!(quote_ident("select"), "\"select\"");
        assert_eq!(quote_ident("abc_1"), "abc_1");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal("a\\b"), "E'a\\\\b'");
    }
}
