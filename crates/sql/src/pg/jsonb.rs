//! jsonb values and what PostgreSQL does with them: the operators (`->`, `->>`, `#>`, `#>>`,
//! `@>`, `<@`, `?`, `?|`, `?&`) and functions (`jsonb_build_object`, `jsonb_build_array`,
//! `to_jsonb`, `jsonb_typeof`, `jsonb_array_length`, `jsonb_extract_path[_text]`).
//!
//! Values are stored as their jsonb text ([`super::json`] normalizes on input); each function
//! parses its arguments into [`Json`] and prints results in jsonb's text form. Entry points:
//! [`functions`], and [`operator`] which names the function standing for a jsonb operator.

use std::fmt;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanBuilder, Int32Builder, StringArray, StringBuilder,
};
use arrow::datatypes::{DataType, Field};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, Signature, TypeSignature,
};
use datafusion::sql::sqlparser::ast::BinaryOperator;
use eddy_common::SqlState;

use super::cast::{external, session_zone};
use super::text::{TextOptions, TimeZone, is_null, text_value};
use super::udf::{IMMUTABLE, PgFunction, Result, arrays, operator_name, pg_field};

/// A jsonb value. Objects hold their keys in jsonb's order (shorter first, then bytewise),
/// each once; numbers hold numeric's text of them.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// An object of these pairs: the last of duplicate keys wins, keys in jsonb's order.
    pub fn object(mut pairs: Vec<(String, Json)>) -> Json {
        // A stable sort keeps duplicates in input order; the last of each run is kept.
        pairs.sort_by(|(a, _), (b, _)| {
            a.len()
                .cmp(&b.len())
                .then_with(|| a.as_bytes().cmp(b.as_bytes()))
        });
        let mut out: Vec<(String, Json)> = Vec::with_capacity(pairs.len());
        for (k, v) in pairs {
            match out.last_mut() {
                Some((last, value)) if *last == k => *value = v,
                _ => out.push((k, v)),
            }
        }
        Json::Object(out)
    }

    fn type_name(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "boolean",
            Json::Number(_) => "number",
            Json::String(_) => "string",
            Json::Array(_) => "array",
            Json::Object(_) => "object",
        }
    }

    fn is_scalar(&self) -> bool {
        !matches!(self, Json::Array(_) | Json::Object(_))
    }

    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(pairs) => pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// An array element by index (negative counts from the end), as `->` reads it.
    fn element(&self, index: i64) -> Option<&Json> {
        let Json::Array(items) = self else {
            return None;
        };
        let i = if index < 0 {
            i64::try_from(items.len()).ok()? + index
        } else {
            index
        };
        items.get(usize::try_from(i).ok()?)
    }

    /// A path step: an object key, or an array index written as text (`#>`).
    fn step(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(_) => self.get(key),
            Json::Array(_) => self.element(key.trim().parse().ok()?),
            _ => None,
        }
    }

    /// The text `->>` gives: a string unquoted, JSON null as SQL NULL, others as jsonb text.
    fn as_text(&self) -> Option<String> {
        match self {
            Json::Null => None,
            Json::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        }
    }

    /// Whether a key exists, as `?` asks: an object key or a string element of an array.
    fn has_key(&self, key: &str) -> bool {
        match self {
            Json::Object(_) => self.get(key).is_some(),
            Json::Array(items) => items
                .iter()
                .any(|i| matches!(i, Json::String(s) if s == key)),
            Json::String(s) => s == key,
            _ => false,
        }
    }

    fn same_scalar(&self, other: &Json) -> bool {
        match (self, other) {
            (Json::Number(a), Json::Number(b)) => canonical_number(a) == canonical_number(b),
            (a, b) => a == b,
        }
    }

    /// `self @> other`, as PostgreSQL's JsonbDeepContains: objects contain objects whose
    /// every pair they contain, arrays contain arrays whose every element some element
    /// contains, and a top-level array contains a scalar it holds.
    pub fn contains(&self, other: &Json, top: bool) -> bool {
        match (self, other) {
            (Json::Object(_), Json::Object(pairs)) => pairs.iter().all(|(k, v)| {
                self.get(k).is_some_and(|mine| {
                    if mine.is_scalar() || v.is_scalar() {
                        mine.same_scalar(v)
                    } else {
                        std::mem::discriminant(mine) == std::mem::discriminant(v)
                            && mine.contains(v, false)
                    }
                })
            }),
            (Json::Array(mine), Json::Array(theirs)) => theirs.iter().all(|t| {
                if t.is_scalar() {
                    mine.iter().any(|m| m.is_scalar() && m.same_scalar(t))
                } else {
                    mine.iter().any(|m| {
                        std::mem::discriminant(m) == std::mem::discriminant(t)
                            && m.contains(t, false)
                    })
                }
            }),
            (Json::Array(mine), t) if top && t.is_scalar() => {
                mine.iter().any(|m| m.is_scalar() && m.same_scalar(t))
            }
            (a, b) if a.is_scalar() && b.is_scalar() => a.same_scalar(b),
            _ => false,
        }
    }
}

/// A numeric's digits without trailing fractional zeros (`1.50` and `1.5` are one value).
fn canonical_number(n: &str) -> &str {
    if n.contains('.') {
        n.trim_end_matches('0').trim_end_matches('.')
    } else {
        n
    }
}

impl fmt::Display for Json {
    /// jsonb's text form: `", "` between elements, `": "` after keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Json::Null => f.write_str("null"),
            Json::Bool(b) => f.write_str(if *b { "true" } else { "false" }),
            Json::Number(n) => f.write_str(n),
            Json::String(s) => f.write_str(&eddy_common::json_string(s)),
            Json::Array(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Json::Object(pairs) => {
                f.write_str("{")?;
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{}: {v}", eddy_common::json_string(k))?;
                }
                f.write_str("}")
            }
        }
    }
}

/// Each row of a jsonb (or json, or text) column parsed; `None` for NULL.
fn parsed(column: &ArrayRef) -> Result<Vec<Option<Json>>> {
    let text = arrow::compute::cast(column, &DataType::Utf8)?;
    text.as_string::<i32>()
        .iter()
        .map(|v| v.map(super::json::parse).transpose().map_err(external))
        .collect()
}

fn texts(column: &ArrayRef) -> Result<ArrayRef> {
    Ok(arrow::compute::cast(column, &DataType::Utf8)?)
}

fn jsonb_field(_: &ReturnFieldArgs<'_>) -> Result<Field> {
    Ok(pg_field("", DataType::Utf8, "jsonb"))
}

fn jsonb_column(values: impl Iterator<Item = Option<Json>>, n: usize) -> ArrayRef {
    let mut b = StringBuilder::with_capacity(n, n * 16);
    for v in values {
        b.append_option(v.map(|j| j.to_string()));
    }
    Arc::new(b.finish())
}

fn text_column(values: impl Iterator<Item = Option<String>>, n: usize) -> ArrayRef {
    let mut b = StringBuilder::with_capacity(n, n * 8);
    for v in values {
        b.append_option(v);
    }
    Arc::new(b.finish())
}

pub const GET: &str = "eddy_jsonb_get";
pub const GET_TEXT: &str = "eddy_jsonb_get_text";
pub const PATH: &str = "eddy_jsonb_path";
pub const PATH_TEXT: &str = "eddy_jsonb_path_text";
pub const CONTAINS: &str = "eddy_jsonb_contains";
pub const CONTAINED: &str = "eddy_jsonb_contained";
pub const EXISTS: &str = "eddy_jsonb_exists";
pub const EXISTS_ANY: &str = "eddy_jsonb_exists_any";
pub const EXISTS_ALL: &str = "eddy_jsonb_exists_all";

/// The function that evaluates a jsonb operator, and the name it prints as.
pub fn operator(op: &BinaryOperator) -> Option<&'static str> {
    Some(match op {
        BinaryOperator::Arrow => GET,
        BinaryOperator::LongArrow => GET_TEXT,
        BinaryOperator::HashArrow => PATH,
        BinaryOperator::HashLongArrow => PATH_TEXT,
        BinaryOperator::AtArrow => CONTAINS,
        BinaryOperator::ArrowAt => CONTAINED,
        BinaryOperator::Question => EXISTS,
        BinaryOperator::QuestionPipe => EXISTS_ANY,
        BinaryOperator::QuestionAnd => EXISTS_ALL,
        _ => return None,
    })
}

/// Whether `->`/`->>` and `#>`/`#>>` take a text[] path on the right.
pub fn takes_path(function: &str) -> bool {
    matches!(function, PATH | PATH_TEXT | EXISTS_ANY | EXISTS_ALL)
}

/// `j -> key` / `j ->> key`: an object's value by key, an array's element by integer.
fn get(args: &ScalarFunctionArgs, as_text: bool) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let values = parsed(&a[0])?;
    let key = &a[1];
    let by_index = matches!(
        key.data_type(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64
    );
    let indexes = if by_index {
        Some(arrow::compute::cast(key, &DataType::Int64)?)
    } else {
        None
    };
    let keys = texts(key)?;
    let keys = keys.as_string::<i32>();
    let found = values.iter().enumerate().map(|(i, v)| {
        let v = v.as_ref()?;
        if key.is_null(i) {
            return None;
        }
        match &indexes {
            Some(ix) => v.element(ix.as_primitive::<arrow::datatypes::Int64Type>().value(i)),
            None => v.get(keys.value(i)),
        }
        .cloned()
    });
    let n = values.len();
    Ok(ColumnarValue::Array(if as_text {
        text_column(found.map(|j| j.and_then(|j| j.as_text())), n)
    } else {
        jsonb_column(found, n)
    }))
}

/// The text elements of a text[] argument's row (`None` for a NULL array).
fn path_at(paths: &ArrayRef, i: usize) -> Option<Vec<Option<String>>> {
    if paths.is_null(i) {
        return None;
    }
    let list = paths.as_list::<i32>().value(i);
    let list = arrow::compute::cast(&list, &DataType::Utf8).ok()?;
    Some(
        list.as_string::<i32>()
            .iter()
            .map(|s| s.map(str::to_owned))
            .collect(),
    )
}

fn text_array(column: &ArrayRef) -> Result<ArrayRef> {
    Ok(arrow::compute::cast(
        column,
        &DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true))),
    )?)
}

/// `j #> path` / `j #>> path`.
fn path(args: &ScalarFunctionArgs, as_text: bool) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let values = parsed(&a[0])?;
    let paths = text_array(&a[1])?;
    let found = values.iter().enumerate().map(|(i, v)| {
        let mut at = v.as_ref()?;
        for step in path_at(&paths, i)? {
            at = at.step(step.as_deref()?)?;
        }
        Some(at.clone())
    });
    let n = values.len();
    Ok(ColumnarValue::Array(if as_text {
        text_column(found.map(|j| j.and_then(|j| j.as_text())), n)
    } else {
        jsonb_column(found, n)
    }))
}

/// `jsonb_extract_path(j, VARIADIC text)`: `#>` with the path as arguments.
fn extract_path(args: &ScalarFunctionArgs, as_text: bool) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let values = parsed(&a[0])?;
    let steps: Vec<ArrayRef> = a[1..].iter().map(texts).collect::<Result<_>>()?;
    let found = values.iter().enumerate().map(|(i, v)| {
        let mut at = v.as_ref()?;
        for s in &steps {
            let s = s.as_string::<i32>();
            if s.is_null(i) {
                return None;
            }
            at = at.step(s.value(i))?;
        }
        Some(at.clone())
    });
    let n = values.len();
    Ok(ColumnarValue::Array(if as_text {
        text_column(found.map(|j| j.and_then(|j| j.as_text())), n)
    } else {
        jsonb_column(found, n)
    }))
}

fn booleans(values: impl Iterator<Item = Option<bool>>, n: usize) -> ArrayRef {
    let mut b = BooleanBuilder::with_capacity(n);
    for v in values {
        b.append_option(v);
    }
    Arc::new(b.finish())
}

fn contains(args: &ScalarFunctionArgs, reversed: bool) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let (left, right) = (parsed(&a[0])?, parsed(&a[1])?);
    let n = left.len();
    let out = left.iter().zip(&right).map(|(l, r)| {
        let (l, r) = (l.as_ref()?, r.as_ref()?);
        Some(if reversed {
            r.contains(l, true)
        } else {
            l.contains(r, true)
        })
    });
    Ok(ColumnarValue::Array(booleans(out, n)))
}

/// `j ? key`, `j ?| keys`, `j ?& keys`.
fn exists(args: &ScalarFunctionArgs, mode: Exists) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let values = parsed(&a[0])?;
    let n = values.len();
    let out: ArrayRef = match mode {
        Exists::One => {
            let keys = texts(&a[1])?;
            let keys = keys.as_string::<i32>();
            booleans(
                values.iter().enumerate().map(|(i, v)| {
                    Some(
                        v.as_ref()?
                            .has_key(keys.is_valid(i).then(|| keys.value(i))?),
                    )
                }),
                n,
            )
        }
        Exists::Any | Exists::All => {
            let paths = text_array(&a[1])?;
            booleans(
                values.iter().enumerate().map(|(i, v)| {
                    let v = v.as_ref()?;
                    // NULL keys are ignored, as in PostgreSQL.
                    let keys: Vec<String> = path_at(&paths, i)?.into_iter().flatten().collect();
                    Some(if mode == Exists::Any {
                        keys.iter().any(|k| v.has_key(k))
                    } else {
                        keys.iter().all(|k| v.has_key(k))
                    })
                }),
                n,
            )
        }
    };
    Ok(ColumnarValue::Array(out))
}

#[derive(Clone, Copy, PartialEq)]
enum Exists {
    One,
    Any,
    All,
}

/// Every value of a column as to_jsonb makes it (SQL NULL becomes JSON null).
pub fn to_json_values(column: &ArrayRef, field: &Field, zone: TimeZone) -> Result<Vec<Json>> {
    let n = column.len();
    let declared = field
        .metadata()
        .get(crate::types::PG_TYPE_KEY)
        .map(String::as_str);
    let options = TextOptions::output_of(field, zone);
    let text = |i: usize| text_value(column, i, options).map_err(external);
    let mut out = Vec::with_capacity(n);
    match column.data_type() {
        DataType::List(element) => {
            let list = column.as_list::<i32>();
            let values = to_json_values(list.values(), element, zone)?;
            for i in 0..n {
                let (start, end) = (
                    list.value_offsets()[i] as usize,
                    list.value_offsets()[i + 1] as usize,
                );
                out.push(if list.is_null(i) {
                    Json::Null
                } else {
                    Json::Array(values[start..end].to_vec())
                });
            }
            return Ok(out);
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            if matches!(declared, Some("jsonb" | "json")) =>
        {
            return Ok(parsed(column)?
                .into_iter()
                .map(|v| v.unwrap_or(Json::Null))
                .collect());
        }
        _ => {}
    }
    for i in 0..n {
        if is_null(column, i) {
            out.push(Json::Null);
            continue;
        }
        out.push(match column.data_type() {
            DataType::Boolean => Json::Bool(column.as_boolean().value(i)),
            t if t.is_integer() || matches!(t, DataType::Decimal128(..)) => Json::Number(text(i)?),
            DataType::Float32 | DataType::Float64 => {
                let t = text(i)?;
                match super::json::parse(&t) {
                    Ok(number @ Json::Number(_)) => number,
                    _ => Json::String(t),
                }
            }
            DataType::Timestamp(_, zoned) => {
                let t = text(i)?.replacen(' ', "T", 1);
                // ISO 8601 offsets have minutes: +02 is +02:00.
                let offset_hours_only = zoned.is_some()
                    && t.len() > 3
                    && t.as_bytes()[t.len() - 3].is_ascii_punctuation()
                    && t[t.len() - 3..].starts_with(['+', '-']);
                Json::String(if offset_hours_only {
                    format!("{t}:00")
                } else {
                    t
                })
            }
            _ => Json::String(text(i)?),
        });
    }
    Ok(out)
}

fn to_jsonb(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let values = to_json_values(&a[0], &args.arg_fields[0], session_zone(args))?;
    let n = values.len();
    Ok(ColumnarValue::Array(jsonb_column(
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| (!is_null(&a[0], i)).then_some(v)),
        n,
    )))
}

fn build_array(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let zone = session_zone(args);
    let columns: Vec<Vec<Json>> = a
        .iter()
        .zip(&args.arg_fields)
        .map(|(c, f)| to_json_values(c, f, zone))
        .collect::<Result<_>>()?;
    let n = args.number_rows;
    let rows = (0..n).map(|i| Some(Json::Array(columns.iter().map(|c| c[i].clone()).collect())));
    Ok(ColumnarValue::Array(jsonb_column(rows, n)))
}

/// The (key, value) pairs of each row of `jsonb_build_object` / `json_build_object`'s
/// arguments, in the order given.
// Row by row across the argument columns: indexes read clearer than zipped iterators here.
#[allow(clippy::needless_range_loop)]
fn object_pairs(args: &ScalarFunctionArgs) -> Result<Vec<Vec<(String, Json)>>> {
    let a = arrays(args)?;
    if a.len() % 2 != 0 {
        return Err(super::udf::error(
            SqlState::INVALID_PARAMETER_VALUE,
            "argument list must have even number of elements",
        ));
    }
    let zone = session_zone(args);
    let columns: Vec<Vec<Json>> = a
        .iter()
        .zip(&args.arg_fields)
        .map(|(c, f)| to_json_values(c, f, zone))
        .collect::<Result<_>>()?;
    let mut rows = Vec::with_capacity(args.number_rows);
    for i in 0..args.number_rows {
        let mut pairs = Vec::with_capacity(a.len() / 2);
        for k in (0..a.len()).step_by(2) {
            let key = match &columns[k][i] {
                Json::Null => {
                    return Err(super::udf::error(
                        SqlState::INVALID_PARAMETER_VALUE,
                        format!("argument {}: key must not be null", k + 1),
                    ));
                }
                Json::String(s) => s.clone(),
                other => other.to_string(),
            };
            pairs.push((key, columns[k + 1][i].clone()));
        }
        rows.push(pairs);
    }
    Ok(rows)
}

fn build_object(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let rows = object_pairs(args)?;
    let n = rows.len();
    Ok(ColumnarValue::Array(jsonb_column(
        rows.into_iter().map(|pairs| Some(Json::object(pairs))),
        n,
    )))
}

/// `json_build_object`: a `json` text as PostgreSQL writes it, keys in the order given and
/// repeated keys kept, `"key" : value` pairs (values in their jsonb text form).
fn build_json_object(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let rows = object_pairs(args)?;
    let n = rows.len();
    let texts = rows.into_iter().map(|pairs| {
        let pairs: Vec<String> = pairs
            .into_iter()
            .map(|(key, value)| format!("{} : {value}", Json::String(key)))
            .collect();
        Some(format!("{{{}}}", pairs.join(", ")))
    });
    Ok(ColumnarValue::Array(text_column(texts, n)))
}

fn typeof_(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let values = parsed(&arrays(args)?[0])?;
    let n = values.len();
    Ok(ColumnarValue::Array(text_column(
        values
            .iter()
            .map(|v| v.as_ref().map(|j| j.type_name().to_owned())),
        n,
    )))
}

fn array_length(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let values = parsed(&arrays(args)?[0])?;
    let mut b = Int32Builder::with_capacity(values.len());
    for v in &values {
        match v {
            None => b.append_null(),
            Some(Json::Array(items)) => {
                b.append_value(i32::try_from(items.len()).unwrap_or(i32::MAX))
            }
            Some(Json::Object(_)) => {
                return Err(super::udf::error(
                    SqlState::INVALID_PARAMETER_VALUE,
                    "cannot get array length of a non-array",
                ));
            }
            Some(_) => {
                return Err(super::udf::error(
                    SqlState::INVALID_PARAMETER_VALUE,
                    "cannot get array length of a scalar",
                ));
            }
        }
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

/// The elements of a jsonb array as a list (`jsonb_array_elements` unnests it), and an
/// object's keys (`jsonb_object_keys`).
fn elements(args: &ScalarFunctionArgs, keys: bool, as_text: bool) -> Result<ColumnarValue> {
    let values = parsed(&arrays(args)?[0])?;
    let mut texts: Vec<Option<String>> = Vec::new();
    let mut offsets = vec![0i32];
    for v in &values {
        match (v, keys) {
            (None, _) => {}
            (Some(Json::Array(items)), false) if as_text => {
                texts.extend(items.iter().map(Json::as_text))
            }
            (Some(Json::Array(items)), false) => {
                texts.extend(items.iter().map(|j| Some(j.to_string())))
            }
            (Some(Json::Object(pairs)), true) => {
                texts.extend(pairs.iter().map(|(k, _)| Some(k.clone())))
            }
            (Some(_), false) => {
                return Err(super::udf::error(
                    SqlState::INVALID_PARAMETER_VALUE,
                    "cannot extract elements from a scalar",
                ));
            }
            (Some(_), true) => {
                return Err(super::udf::error(
                    SqlState::INVALID_PARAMETER_VALUE,
                    "cannot call jsonb_object_keys on a scalar",
                ));
            }
        }
        offsets.push(i32::try_from(texts.len()).unwrap_or(i32::MAX));
    }
    let item = element_field(keys || as_text);
    let values: ArrayRef = Arc::new(StringArray::from(texts));
    let list = arrow::array::ListArray::try_new(
        item,
        arrow::buffer::OffsetBuffer::new(offsets.into()),
        values,
        None,
    )?;
    Ok(ColumnarValue::Array(Arc::new(list)))
}

fn element_field(keys: bool) -> Arc<Field> {
    Arc::new(if keys {
        Field::new_list_field(DataType::Utf8, true)
    } else {
        pg_field("item", DataType::Utf8, "jsonb")
    })
}

pub const ELEMENTS: &str = "eddy_jsonb_elements";
pub const ELEMENTS_TEXT: &str = "eddy_jsonb_elements_text";
pub const OBJECT_KEYS: &str = "eddy_jsonb_object_keys";

pub fn functions() -> Vec<ScalarUDF> {
    let two = || Signature::any(2, IMMUTABLE);
    let jsonb = |name: &str,
                 signature: Signature,
                 invoke: fn(&ScalarFunctionArgs) -> Result<ColumnarValue>| {
        PgFunction::with_return(name, signature, jsonb_field, invoke)
    };
    let text = |name: &str,
                signature: Signature,
                invoke: fn(&ScalarFunctionArgs) -> Result<ColumnarValue>| {
        PgFunction::new(name, signature, DataType::Utf8, invoke)
    };
    let boolean = |name: &str, invoke: fn(&ScalarFunctionArgs) -> Result<ColumnarValue>| {
        PgFunction::new(
            name,
            Signature::any(2, IMMUTABLE),
            DataType::Boolean,
            invoke,
        )
    };
    let variadic = || {
        Signature::one_of(
            vec![TypeSignature::Nullary, TypeSignature::VariadicAny],
            IMMUTABLE,
        )
    };
    vec![
        jsonb(GET, two(), |a| get(a, false))
            .named(operator_name("->"))
            .udf(),
        text(GET_TEXT, two(), |a| get(a, true))
            .named(operator_name("->>"))
            .udf(),
        jsonb(PATH, two(), |a| path(a, false))
            .named(operator_name("#>"))
            .udf(),
        text(PATH_TEXT, two(), |a| path(a, true))
            .named(operator_name("#>>"))
            .udf(),
        boolean(CONTAINS, |a| contains(a, false))
            .named(operator_name("@>"))
            .udf(),
        boolean(CONTAINED, |a| contains(a, true))
            .named(operator_name("<@"))
            .udf(),
        boolean(EXISTS, |a| exists(a, Exists::One))
            .named(operator_name("?"))
            .udf(),
        boolean(EXISTS_ANY, |a| exists(a, Exists::Any))
            .named(operator_name("?|"))
            .udf(),
        boolean(EXISTS_ALL, |a| exists(a, Exists::All))
            .named(operator_name("?&"))
            .udf(),
        jsonb(
            "jsonb_extract_path",
            Signature::variadic_any(IMMUTABLE),
            |a| extract_path(a, false),
        )
        .udf(),
        text(
            "jsonb_extract_path_text",
            Signature::variadic_any(IMMUTABLE),
            |a| extract_path(a, true),
        )
        .udf(),
        jsonb("to_jsonb", Signature::any(1, IMMUTABLE), to_jsonb).udf(),
        jsonb("jsonb_build_array", variadic(), build_array).udf(),
        jsonb("jsonb_build_object", variadic(), build_object).udf(),
        PgFunction::with_return(
            "json_build_object",
            variadic(),
            |_| Ok(pg_field("", DataType::Utf8, "json")),
            build_json_object,
        )
        .udf(),
        text("jsonb_typeof", Signature::any(1, IMMUTABLE), typeof_).udf(),
        PgFunction::new(
            "jsonb_array_length",
            Signature::any(1, IMMUTABLE),
            DataType::Int32,
            array_length,
        )
        .udf(),
        PgFunction::with_return(
            ELEMENTS,
            Signature::any(1, IMMUTABLE),
            |_| Ok(Field::new("", DataType::List(element_field(false)), true)),
            |a| elements(a, false, false),
        )
        .udf(),
        PgFunction::new(
            ELEMENTS_TEXT,
            Signature::any(1, IMMUTABLE),
            DataType::List(element_field(true)),
            |a| elements(a, false, true),
        )
        .udf(),
        PgFunction::new(
            OBJECT_KEYS,
            Signature::any(1, IMMUTABLE),
            DataType::List(element_field(true)),
            |a| elements(a, true, false),
        )
        .udf(),
    ]
}

/// Whether a field holds jsonb (or json) values.
pub fn is_json(field: &Field) -> bool {
    matches!(
        field
            .metadata()
            .get(crate::types::PG_TYPE_KEY)
            .map(String::as_str),
        Some("jsonb" | "json")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(text: &str) -> Json {
        super::super::json::parse(text).unwrap()
    }

    #[test]
    fn containment_as_postgres() {
        assert!(j(r#"{"a": 1, "b": [1, 2]}"#).contains(&j(r#"{"b": [2]}"#), true));
        assert!(!j(r#"{"a": [1, 2]}"#).contains(&j(r#"{"a": 1}"#), true));
        assert!(j("[1, 2, [3]]").contains(&j("[[3], 1]"), true));
        assert!(j("[1, 2]").contains(&j("1"), true));
        assert!(!j("[[1, 2]]").contains(&j("[1]"), true));
        assert!(j(r#"{"a": 1.0}"#).contains(&j(r#"{"a": 1}"#), true));
    }

    #[test]
    fn objects_keep_the_last_duplicate() {
        let o = Json::object(vec![
            ("bb".into(), Json::Null),
            ("a".into(), Json::Bool(true)),
            ("a".into(), Json::Bool(false)),
        ]);
        assert_eq!(o.to_string(), r#"{"a": false, "bb": null}"#);
        assert_eq!(j("[1, 2, 3]").element(-1), Some(&Json::Number("3".into())));
        assert_eq!(
            j(r#"{"a": [10, 20]}"#).step("a").and_then(|a| a.step("1")),
            Some(&Json::Number("20".into()))
        );
    }
}
