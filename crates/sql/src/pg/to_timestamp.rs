//! `to_timestamp(text, template)` and `to_date(text, template)`: PostgreSQL's templates read
//! back (not in FX mode): separators in the template match any separator or none, numbers are
//! read up to the field's width, month and day names in any case, `AM`/`PM`, `TZH:TZM`.

use std::sync::Arc;

use arrow::array::{Array, AsArray, Date32Builder, TimestampMicrosecondBuilder};
use arrow::datatypes::DataType;
use chrono::{NaiveDate, NaiveTime};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, Signature};
use eddy_common::{Error, SqlState};

use super::cast::{external, session_zone};
use super::datetime_in::{MICROS_PER_SECOND, WrittenTimestamp, Zone, days_since_epoch};
use super::template::{self, DAY_NAMES, MONTH_NAMES, Node, ROMAN_MONTHS};
use super::udf::{IMMUTABLE, PgFunction, Result, arrays};

/// Fields read from the input; unset ones default as PostgreSQL's do (January 1st, midnight).
#[derive(Debug, Default)]
struct Parsed {
    year: Option<i64>,
    /// `YY`/`YYY`/`Y` years are completed to the one nearest 2020.
    year_digits: usize,
    month: Option<i64>,
    day: Option<i64>,
    day_of_year: Option<i64>,
    hour: Option<i64>,
    twelve_hour: bool,
    pm: Option<bool>,
    minute: i64,
    second: i64,
    micros: i64,
    zone_seconds: Option<i32>,
    julian: Option<i64>,
}

fn invalid(text: &str, message: String) -> Error {
    Error::new(SqlState::INVALID_DATETIME_FORMAT, message).with_detail(format!("input: \"{text}\""))
}

fn out_of_range(text: &str) -> Error {
    Error::new(
        SqlState::DATETIME_FIELD_OVERFLOW,
        format!("date/time field value out of range: \"{text}\""),
    )
}

struct Reader<'a> {
    input: &'a str,
    rest: &'a str,
}

impl<'a> Reader<'a> {
    fn skip_spaces(&mut self) {
        self.rest = self.rest.trim_start();
    }

    /// Up to `width` digits (any number when `width` is 0), with an optional sign.
    fn number(&mut self, keyword: &str, width: usize) -> eddy_common::Result<i64> {
        self.skip_spaces();
        let signed = self.rest.starts_with(['-', '+']);
        let start = usize::from(signed);
        let digits = self.rest[start..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        let take = if width == 0 {
            digits
        } else {
            digits.min(width)
        };
        if take == 0 {
            let found: String = self.rest.chars().take(width.max(1)).collect();
            return Err(invalid(
                self.input,
                format!("invalid value \"{found}\" for \"{keyword}\""),
            ));
        }
        let text = &self.rest[..start + take];
        self.rest = &self.rest[start + take..];
        text.parse().map_err(|_| {
            invalid(
                self.input,
                format!("invalid value \"{text}\" for \"{keyword}\""),
            )
        })
    }

    /// One of `names` (case-insensitive, full or the first `abbreviated` letters); its index.
    fn name(
        &mut self,
        keyword: &str,
        names: &[&str],
        abbreviated: Option<usize>,
    ) -> eddy_common::Result<usize> {
        self.skip_spaces();
        let lower = self.rest.to_lowercase();
        for (i, n) in names.iter().enumerate() {
            let candidate = match abbreviated {
                Some(len) => n[..len.min(n.len())].to_lowercase(),
                None => n.to_lowercase(),
            };
            if lower.starts_with(&candidate) {
                self.rest = &self.rest[candidate.len()..];
                return Ok(i);
            }
        }
        let found: String = self
            .rest
            .chars()
            .take_while(|c| c.is_alphabetic())
            .collect();
        Err(invalid(
            self.input,
            format!("invalid value \"{found}\" for \"{keyword}\""),
        ))
    }

    fn word(&mut self, words: &[&str]) -> Option<usize> {
        self.skip_spaces();
        let lower = self.rest.to_lowercase();
        let i = words
            .iter()
            .position(|w| lower.starts_with(&w.to_lowercase()))?;
        self.rest = &self.rest[words[i].len()..];
        Some(i)
    }
}

/// Whether what follows a field in the template separates it from the next one (PostgreSQL's
/// is_next_separator): then the field reads every digit there is, else exactly its width.
fn next_is_separator(next: Option<&Node>) -> bool {
    match next {
        None => true,
        Some(Node::Keyword { keyword, .. }) => !is_digit_field(keyword),
        Some(Node::Literal(text)) => !text.starts_with(|c: char| c.is_ascii_digit()),
    }
}

fn is_digit_field(keyword: &str) -> bool {
    let k = keyword.to_ascii_uppercase();
    !matches!(
        k.as_str(),
        "MONTH"
            | "MON"
            | "DAY"
            | "DY"
            | "AM"
            | "PM"
            | "A.M."
            | "P.M."
            | "AD"
            | "BC"
            | "A.D."
            | "B.C."
            | "RM"
            | "TZ"
            | "FX"
    )
}

fn read_keyword(
    r: &mut Reader<'_>,
    p: &mut Parsed,
    keyword: &'static str,
    separated: bool,
) -> eddy_common::Result<()> {
    let k = keyword.to_ascii_uppercase();
    // A field read up to its width, or every digit when a separator follows it.
    let width = |w: usize| if separated { 0 } else { w };
    match k.as_str() {
        "YYYY" | "IYYY" => {
            p.year = Some(r.number(keyword, width(4))?);
            p.year_digits = 4;
        }
        "Y,YYY" => {
            let thousands = r.number(keyword, 0)?;
            r.rest = r.rest.strip_prefix(',').unwrap_or(r.rest);
            p.year = Some(thousands * 1000 + r.number(keyword, 3)?);
            p.year_digits = 4;
        }
        "YYY" | "YY" | "Y" | "IYY" | "IY" | "I" => {
            let before = r.rest.len();
            p.year = Some(r.number(keyword, k.trim_start_matches('I').len().max(1))?);
            p.year_digits = before - r.rest.len();
        }
        "MM" => p.month = Some(r.number(keyword, width(2))?),
        "MONTH" => p.month = Some(r.name(keyword, &MONTH_NAMES, None)? as i64 + 1),
        "MON" => p.month = Some(r.name(keyword, &MONTH_NAMES, Some(3))? as i64 + 1),
        "RM" => {
            // Longest numerals first, so VIII is not read as V.
            let mut order: Vec<usize> = (0..12).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(ROMAN_MONTHS[i].len()));
            let names: Vec<&str> = order.iter().map(|&i| ROMAN_MONTHS[i]).collect();
            p.month = Some(order[r.name(keyword, &names, None)?] as i64 + 1);
        }
        "DAY" => drop(r.name(keyword, &DAY_NAMES, None)?),
        "DY" => drop(r.name(keyword, &DAY_NAMES, Some(3))?),
        "DD" => p.day = Some(r.number(keyword, width(2))?),
        "DDD" | "IDDD" => p.day_of_year = Some(r.number(keyword, width(3))?),
        "D" | "ID" | "W" | "Q" => drop(r.number(keyword, 1)?),
        "WW" | "IW" | "CC" => drop(r.number(keyword, 2)?),
        "J" => p.julian = Some(r.number(keyword, 0)?),
        "HH" | "HH12" => {
            p.hour = Some(r.number(keyword, width(2))?);
            p.twelve_hour = true;
        }
        "HH24" => p.hour = Some(r.number(keyword, width(2))?),
        "MI" => p.minute = r.number(keyword, width(2))?,
        "SS" => p.second = r.number(keyword, width(2))?,
        "MS" => p.micros = fraction(r, keyword, 3)?,
        "US" => p.micros = fraction(r, keyword, 6)?,
        k if k.starts_with("FF") => {
            p.micros = fraction(r, keyword, usize::from(k.as_bytes()[2] - b'0'))?
        }
        "SSSS" | "SSSSS" => {
            let s = r.number(keyword, 0)?;
            p.hour = Some(s / 3600);
            p.minute = s / 60 % 60;
            p.second = s % 60;
        }
        "AM" | "PM" | "A.M." | "P.M." => {
            let i = r
                .word(&["AM", "PM", "A.M.", "P.M."])
                .ok_or_else(|| invalid(r.input, format!("invalid value for \"{keyword}\"")))?;
            p.pm = Some(i % 2 == 1);
        }
        "AD" | "BC" | "A.D." | "B.C." => drop(r.word(&["AD", "BC", "A.D.", "B.C."])),
        "TZH" => {
            let h = r.number(keyword, 2)?;
            p.zone_seconds = Some((h * 3600) as i32);
        }
        "TZM" => {
            let m = r.number(keyword, 2)? as i32;
            let sign = if p.zone_seconds.is_some_and(|s| s < 0) {
                -1
            } else {
                1
            };
            p.zone_seconds = Some(p.zone_seconds.unwrap_or(0) + sign * m * 60);
        }
        "FX" => {}
        other => {
            return Err(Error::unsupported(format!(
                "formatting field \"{other}\" is only supported in to_char"
            )));
        }
    }
    Ok(())
}

/// Digits of a fraction of a second (`MS` 3, `US` 6), as microseconds.
fn fraction(r: &mut Reader<'_>, keyword: &str, width: usize) -> eddy_common::Result<i64> {
    let before = r.rest.len();
    let v = r.number(keyword, width)?;
    let read = before - r.rest.len();
    // The digits read are a fraction: `.5` is 500 ms whether read by MS or US.
    let places = if keyword.eq_ignore_ascii_case("MS") {
        3
    } else {
        6
    };
    let scaled = v * 10i64.pow((places - read.min(places)) as u32);
    Ok(if places == 3 { scaled * 1000 } else { scaled })
}

/// Matches a literal part of the template: separators match any run of separators (or
/// none), other characters skip one input character each.
fn read_literal(r: &mut Reader<'_>, literal: &str) {
    for c in literal.chars() {
        if c.is_whitespace() {
            r.skip_spaces();
        } else if !c.is_alphanumeric() {
            if r.rest
                .starts_with(|x: char| !x.is_alphanumeric() && !x.is_whitespace())
            {
                let mut chars = r.rest.chars();
                chars.next();
                r.rest = chars.as_str();
            }
        } else {
            let mut chars = r.rest.chars();
            chars.next();
            r.rest = chars.as_str();
        }
    }
}

fn read(text: &str, nodes: &[Node]) -> eddy_common::Result<Parsed> {
    let mut r = Reader {
        input: text,
        rest: text.trim_start(),
    };
    let mut p = Parsed::default();
    for (i, node) in nodes.iter().enumerate() {
        match node {
            Node::Literal(literal) => read_literal(&mut r, literal),
            Node::Keyword { keyword, .. } => {
                if r.rest.trim().is_empty() {
                    break;
                }
                read_keyword(&mut r, &mut p, keyword, next_is_separator(nodes.get(i + 1)))?;
            }
        }
    }
    Ok(p)
}

/// The date and time the fields name, and the zone offset if one was read.
fn assemble(text: &str, p: &Parsed) -> eddy_common::Result<(NaiveDate, i64, Option<i32>)> {
    let mut year = p.year.unwrap_or(1);
    if p.year_digits > 0 && p.year_digits < 4 {
        // Toward 2020, as PostgreSQL's adjust_partial_year_to_2020: '69' is 2069, '70' 1970.
        year = match year {
            y if y < 70 => y + 2000,
            y if y < 100 => y + 1900,
            y if y < 520 => y + 2000,
            y if y < 1000 => y + 1000,
            y => y,
        };
    }
    let date = if let Some(j) = p.julian {
        NaiveDate::from_num_days_from_ce_opt(
            i32::try_from(j - 1_721_425).map_err(|_| out_of_range(text))?,
        )
    } else if let (Some(doy), None) = (p.day_of_year, p.month) {
        NaiveDate::from_yo_opt(
            i32::try_from(year).map_err(|_| out_of_range(text))?,
            u32::try_from(doy).map_err(|_| out_of_range(text))?,
        )
    } else {
        let (month, day) = (p.month.unwrap_or(1), p.day.unwrap_or(1));
        i32::try_from(year).ok().and_then(|y| {
            NaiveDate::from_ymd_opt(y, u32::try_from(month).ok()?, u32::try_from(day).ok()?)
        })
    }
    .ok_or_else(|| out_of_range(text))?;
    let mut hour = p.hour.unwrap_or(0);
    if p.twelve_hour || p.pm.is_some() {
        if !(1..=12).contains(&hour) && p.hour.is_some() {
            return Err(Error::new(
                SqlState::INVALID_DATETIME_FORMAT,
                format!("hour \"{hour}\" is invalid for the 12-hour clock"),
            )
            .with_hint("Use the 24-hour clock, or give an hour between 1 and 12."));
        }
        hour %= 12;
        if p.pm == Some(true) {
            hour += 12;
        }
    }
    if hour > 24 || p.minute > 59 || p.second > 60 {
        return Err(out_of_range(text));
    }
    let micros = ((hour * 60 + p.minute) * 60 + p.second) * MICROS_PER_SECOND + p.micros;
    Ok((date, micros, p.zone_seconds))
}

fn parse_rows(
    args: &ScalarFunctionArgs,
    mut each: impl FnMut(Option<(NaiveDate, i64, Option<i32>)>) -> Result<()>,
) -> Result<()> {
    let a = arrays(args)?;
    let texts = arrow::compute::cast(&a[0], &DataType::Utf8)?;
    let templates = arrow::compute::cast(&a[1], &DataType::Utf8)?;
    let (texts, templates) = (texts.as_string::<i32>(), templates.as_string::<i32>());
    let mut parsed_template: Option<(String, Vec<Node>)> = None;
    for i in 0..texts.len() {
        if texts.is_null(i) || templates.is_null(i) {
            each(None)?;
            continue;
        }
        let t = templates.value(i);
        if parsed_template.as_ref().is_none_or(|(text, _)| text != t) {
            parsed_template = Some((t.to_owned(), template::parse(t)));
        }
        let nodes = parsed_template
            .as_ref()
            .map_or(&[][..], |(_, n)| n.as_slice());
        let text = texts.value(i);
        let fields = read(text, nodes)
            .and_then(|p| assemble(text, &p))
            .map_err(external)?;
        each(Some(fields))?;
    }
    Ok(())
}

/// `to_timestamp(text, template)`: a timestamptz, in the session's zone unless the text
/// gave an offset.
pub fn to_timestamp(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let zone = session_zone(args);
    let mut b = TimestampMicrosecondBuilder::with_capacity(args.number_rows);
    parse_rows(args, |fields| {
        match fields {
            None => b.append_null(),
            Some((date, micros, offset)) => {
                let local = date.and_time(NaiveTime::MIN) + chrono::Duration::microseconds(micros);
                let written = WrittenTimestamp {
                    local,
                    zone: offset.map(Zone::Offset),
                };
                let us = written
                    .utc_micros(zone)
                    .ok_or_else(|| external(out_of_range("")))?;
                b.append_value(us);
            }
        }
        Ok(())
    })?;
    Ok(ColumnarValue::Array(Arc::new(
        b.finish().with_timezone(crate::types::UTC),
    )))
}

fn to_date(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let mut b = Date32Builder::with_capacity(args.number_rows);
    parse_rows(args, |fields| {
        b.append_option(fields.map(|(date, _, _)| days_since_epoch(date)));
        Ok(())
    })?;
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

pub fn functions() -> Vec<ScalarUDF> {
    vec![
        PgFunction::new(
            "to_date",
            Signature::exact(vec![DataType::Utf8, DataType::Utf8], IMMUTABLE),
            DataType::Date32,
            to_date,
        )
        .udf(),
    ]
}
