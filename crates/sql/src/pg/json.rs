//! `json` and `jsonb` values, kept as text: `::json` checks the text is JSON and keeps it as
//! written; `::jsonb` stores PostgreSQL's normalized form (keys sorted shortest first, the
//! last of duplicate keys kept, `": "` and `", "` separators, numbers as numeric prints them).

use std::sync::Arc;

use arrow::array::{Array, AsArray, StringBuilder};
use arrow::datatypes::DataType;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, Signature};
use eddy_common::{Error, Result, SqlState};

use super::cast::external;
use super::udf::{IMMUTABLE, PgFunction, arrays, pg_field};

pub use super::jsonb::Json;

fn invalid(text: &str) -> Error {
    Error::new(
        SqlState::INVALID_TEXT_REPRESENTATION,
        "invalid input syntax for type json",
    )
    .with_detail(format!("Input: {text}"))
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Parser<'a> {
    fn skip_whitespace(&mut self) {
        while self
            .bytes
            .get(self.at)
            .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<()> {
        self.skip_whitespace();
        if self.bytes.get(self.at) == Some(&byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(invalid(self.text))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json> {
        if depth > DEPTH_MAX {
            return Err(Error::new(
                SqlState::PROGRAM_LIMIT_EXCEEDED,
                "json value nested too deeply",
            ));
        }
        self.skip_whitespace();
        match self.bytes.get(self.at) {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(Json::String(self.string()?)),
            Some(b't') => self.word("true", Json::Bool(true)),
            Some(b'f') => self.word("false", Json::Bool(false)),
            Some(b'n') => self.word("null", Json::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(invalid(self.text)),
        }
    }

    fn word(&mut self, word: &str, value: Json) -> Result<Json> {
        if self.text[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(value)
        } else {
            Err(invalid(self.text))
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json> {
        self.at += 1;
        let mut pairs: Vec<(String, Json)> = Vec::new();
        self.skip_whitespace();
        if self.bytes.get(self.at) == Some(&b'}') {
            self.at += 1;
        } else {
            loop {
                self.skip_whitespace();
                if self.bytes.get(self.at) != Some(&b'"') {
                    return Err(invalid(self.text));
                }
                let key = self.string()?;
                self.expect(b':')?;
                let value = self.value(depth + 1)?;
                pairs.push((key, value));
                self.skip_whitespace();
                match self.bytes.get(self.at) {
                    Some(b',') => self.at += 1,
                    Some(b'}') => {
                        self.at += 1;
                        break;
                    }
                    _ => return Err(invalid(self.text)),
                }
            }
        }
        Ok(Json::object(pairs))
    }

    fn array(&mut self, depth: usize) -> Result<Json> {
        self.at += 1;
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.bytes.get(self.at) == Some(&b']') {
            self.at += 1;
            return Ok(Json::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.skip_whitespace();
            match self.bytes.get(self.at) {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Json::Array(items));
                }
                _ => return Err(invalid(self.text)),
            }
        }
    }

    fn string(&mut self) -> Result<String> {
        self.at += 1;
        let mut s = String::new();
        loop {
            let rest = &self.text[self.at..];
            let mut chars = rest.chars();
            let c = chars.next().ok_or_else(|| invalid(self.text))?;
            self.at += c.len_utf8();
            match c {
                '"' => return Ok(s),
                '\\' => {
                    let e = chars.next().ok_or_else(|| invalid(self.text))?;
                    self.at += 1;
                    match e {
                        '"' | '\\' | '/' => s.push(e),
                        'b' => s.push('\u{8}'),
                        'f' => s.push('\u{c}'),
                        'n' => s.push('\n'),
                        'r' => s.push('\r'),
                        't' => s.push('\t'),
                        'u' => s.push(self.unicode_escape()?),
                        _ => return Err(invalid(self.text)),
                    }
                }
                c if (c as u32) < 0x20 => return Err(invalid(self.text)),
                c => s.push(c),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32> {
        let digits = self
            .text
            .get(self.at..self.at + 4)
            .ok_or_else(|| invalid(self.text))?;
        self.at += 4;
        u32::from_str_radix(digits, 16).map_err(|_| invalid(self.text))
    }

    fn unicode_escape(&mut self) -> Result<char> {
        let first = self.hex4()?;
        let code = if (0xD800..0xDC00).contains(&first) && self.text[self.at..].starts_with("\\u") {
            self.at += 2;
            let second = self.hex4()?;
            0x10000 + ((first - 0xD800) << 10) + (second.wrapping_sub(0xDC00) & 0x3FF)
        } else {
            first
        };
        if code == 0 {
            return Err(Error::new(
                SqlState::INVALID_TEXT_REPRESENTATION,
                "unsupported Unicode escape sequence",
            )
            .with_detail("\\u0000 cannot be converted to text."));
        }
        char::from_u32(code).ok_or_else(|| invalid(self.text))
    }

    fn number(&mut self) -> Result<Json> {
        let start = self.at;
        let is_number_byte =
            |b: &u8| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E');
        while self.bytes.get(self.at).is_some_and(is_number_byte) {
            self.at += 1;
        }
        let text = &self.text[start..self.at];
        Ok(Json::Number(
            normalize_number(text).ok_or_else(|| invalid(self.text))?,
        ))
    }
}

const DEPTH_MAX: usize = 1000;

/// A JSON number as PostgreSQL's numeric prints it: `1e3` is `1000`, `1.50` stays `1.50`,
/// `-0` is `0`.
fn normalize_number(text: &str) -> Option<String> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, text),
    };
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], body[i + 1..].parse::<i64>().ok()?),
        None => (body, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let json_shape = !whole.is_empty()
        && whole.bytes().all(|b| b.is_ascii_digit())
        && (whole == "0" || !whole.starts_with('0'))
        && fraction.bytes().all(|b| b.is_ascii_digit())
        && (!mantissa.contains('.') || !fraction.is_empty());
    if !json_shape || exponent.abs() > 1000 {
        return None;
    }
    let digits: String = format!("{whole}{fraction}");
    // The value is digits × 10^(exponent - fraction digits); numeric keeps that many decimals.
    let point = whole.len() as i64 + exponent;
    let scale = (fraction.len() as i64 - exponent).max(0) as usize;
    let mut int_part: String;
    let mut frac_part: String;
    if point <= 0 {
        int_part = "0".into();
        frac_part = format!("{}{}", "0".repeat((-point) as usize), digits);
    } else if point as usize >= digits.len() {
        int_part = format!("{}{}", digits, "0".repeat(point as usize - digits.len()));
        frac_part = String::new();
    } else {
        int_part = digits[..point as usize].to_owned();
        frac_part = digits[point as usize..].to_owned();
    }
    int_part = int_part.trim_start_matches('0').to_owned();
    if int_part.is_empty() {
        int_part = "0".into();
    }
    frac_part.truncate(scale);
    while frac_part.len() < scale {
        frac_part.push('0');
    }
    let zero = int_part == "0" && frac_part.bytes().all(|b| b == b'0');
    let sign = if negative && !zero { "-" } else { "" };
    Some(if scale == 0 {
        format!("{sign}{int_part}")
    } else {
        format!("{sign}{int_part}.{frac_part}")
    })
}

/// Parses JSON text into its jsonb value (keys ordered, the last of duplicates kept).
pub fn parse(text: &str) -> Result<Json> {
    let mut p = Parser {
        text,
        bytes: text.as_bytes(),
        at: 0,
    };
    let value = p.value(0)?;
    p.skip_whitespace();
    if p.at != text.len() {
        return Err(invalid(text));
    }
    Ok(value)
}

/// Parses JSON text; returns PostgreSQL's jsonb form of it.
pub fn normalize(text: &str) -> Result<String> {
    Ok(parse(text)?.to_string())
}

fn convert(
    args: &ScalarFunctionArgs,
    normalized: bool,
) -> datafusion::common::Result<ColumnarValue> {
    let input = &arrays(args)?[0];
    let text = arrow::compute::cast(input, &DataType::Utf8)?;
    let mut b = StringBuilder::with_capacity(text.len(), text.len() * 16);
    for v in text.as_string::<i32>().iter() {
        match v {
            None => b.append_null(),
            Some(t) => {
                let json = normalize(t).map_err(external)?;
                b.append_value(if normalized { json.as_str() } else { t });
            }
        }
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

pub fn functions() -> Vec<ScalarUDF> {
    let to = |name: &str, pg: &'static str, normalized: bool| {
        PgFunction::with_return(
            name,
            Signature::any(1, IMMUTABLE),
            move |args| {
                // Only text becomes JSON here; other types would need to_jsonb().
                let t = args.arg_fields[0].data_type();
                if !matches!(
                    t,
                    DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
                ) {
                    return Err(super::udf::error(
                        SqlState::FEATURE_NOT_SUPPORTED,
                        format!(
                            "cannot cast {} to {pg}",
                            crate::types::pg_type_name(&args.arg_fields[0])
                        ),
                    ));
                }
                Ok(pg_field("", DataType::Utf8, pg))
            },
            move |args| convert(args, normalized),
        )
        .udf()
    };
    vec![
        to(super::ast::TO_JSONB, "jsonb", true),
        to(super::ast::TO_JSON, "json", false),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonb_normal_form() {
        assert_eq!(
            normalize(r#"{"b": 2, "a": 1}"#).unwrap(),
            r#"{"a": 1, "b": 2}"#
        );
        assert_eq!(
            normalize(r#"{"a":1,"b":[1,2]}"#).unwrap(),
            r#"{"a": 1, "b": [1, 2]}"#
        );
        assert_eq!(
            normalize(r#"{"aa": 1, "b": 2, "a": 0, "a": 3}"#).unwrap(),
            r#"{"a": 3, "b": 2, "aa": 1}"#
        );
        assert_eq!(
            normalize("[1e3, 1.50, -0, 1E-2, 2.5e1]").unwrap(),
            "[1000, 1.50, 0, 0.01, 25]"
        );
        assert_eq!(normalize(r#""a\u00e9\n""#).unwrap(), "\"aé\\n\"");
        assert!(normalize("not json").is_err());
        assert!(normalize("{\"a\":}").is_err());
        assert!(normalize("01").is_err());
    }
}
