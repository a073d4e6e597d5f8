//! `to_char(number, template)` with PostgreSQL's numeric templates: `9 0 . , D G S PR MI PL
//! SG L EEEE RN TH FM`. A port of the to_char half of PostgreSQL's `NUM_processor`, so signs,
//! blanks, `#` overflow and fill mode land where PostgreSQL puts them (locale C: `.`, `,`,
//! a blank currency symbol).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, StringArray, StringBuilder};
use arrow::datatypes::{DataType, Decimal128Type, Float64Type, Int64Type};
use datafusion::logical_expr::ColumnarValue;
use eddy_common::SqlState;

use super::decimal;
use super::template::ordinal_suffix;
use super::text::decimal_text;
use super::udf::{Result, error};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Nine,
    Zero,
    Point,
    Comma,
    Group,
    Sign,
    Bracket,
    Minus,
    Plus,
    PlusMinus,
    Currency,
    Exponent,
    Roman { upper: bool },
    Ordinal { upper: bool },
    Multiply,
    FillMode,
    Blank,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Token(Token),
    Literal(String),
}

/// Where `S` puts the sign: before the digits or after them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SignAt {
    None,
    Before,
    After,
}

/// A parsed numeric template (PostgreSQL's NUMDesc).
#[derive(Debug, Clone)]
struct Format {
    nodes: Vec<Node>,
    pre: usize,
    post: usize,
    decimal: bool,
    zero: bool,
    /// The first integer digit position printed as `0`.
    zero_start: usize,
    zero_end: usize,
    fill_mode: bool,
    bracket: bool,
    minus: bool,
    plus: bool,
    sign_at: SignAt,
    pre_sign_digits: usize,
    exponent: bool,
    roman: bool,
}

fn bad(message: &str) -> datafusion::common::DataFusionError {
    error(SqlState::SYNTAX_ERROR, message.to_owned())
}

const TOKENS: &[(&str, Token)] = &[
    ("EEEE", Token::Exponent),
    ("eeee", Token::Exponent),
    ("FM", Token::FillMode),
    ("fm", Token::FillMode),
    ("PR", Token::Bracket),
    ("pr", Token::Bracket),
    ("PL", Token::Plus),
    ("pl", Token::Plus),
    ("SG", Token::PlusMinus),
    ("sg", Token::PlusMinus),
    ("MI", Token::Minus),
    ("mi", Token::Minus),
    ("RN", Token::Roman { upper: true }),
    ("rn", Token::Roman { upper: false }),
    ("TH", Token::Ordinal { upper: true }),
    ("th", Token::Ordinal { upper: false }),
    ("9", Token::Nine),
    ("0", Token::Zero),
    (".", Token::Point),
    (",", Token::Comma),
    ("D", Token::Point),
    ("d", Token::Point),
    ("G", Token::Group),
    ("g", Token::Group),
    ("S", Token::Sign),
    ("s", Token::Sign),
    ("L", Token::Currency),
    ("l", Token::Currency),
    ("V", Token::Multiply),
    ("v", Token::Multiply),
    ("B", Token::Blank),
    ("b", Token::Blank),
];

fn parse(template: &str) -> Result<Format> {
    let mut f = Format {
        nodes: Vec::new(),
        pre: 0,
        post: 0,
        decimal: false,
        zero: false,
        zero_start: 0,
        zero_end: 0,
        fill_mode: false,
        bracket: false,
        minus: false,
        plus: false,
        sign_at: SignAt::None,
        pre_sign_digits: 0,
        exponent: false,
        roman: false,
    };
    let mut rest = template;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('"') {
            let (text, tail) = super::template::quoted(after);
            f.nodes.push(Node::Literal(text));
            rest = tail;
        } else if let Some((text, token)) = TOKENS.iter().find(|(t, _)| rest.starts_with(t)) {
            rest = &rest[text.len()..];
            if f.exponent && !matches!(token, Token::FillMode) {
                return Err(bad("\"EEEE\" must be the last pattern used"));
            }
            f.prepare(*token)?;
            f.nodes.push(Node::Token(*token));
        } else {
            // Outside quotes a backslash only escapes a double quote, as in date templates.
            let skip = usize::from(rest.starts_with("\\\""));
            let mut chars = rest[skip..].chars();
            let c = chars.next().unwrap_or_default();
            f.nodes.push(Node::Literal(c.to_string()));
            rest = chars.as_str();
        }
    }
    if f.exponent
        && (f.fill_mode || f.sign_at != SignAt::None || f.bracket || f.plus || f.minus || f.roman)
    {
        return Err(bad("\"EEEE\" is incompatible with other formats"));
    }
    Ok(f)
}

impl Format {
    /// PostgreSQL's NUM_prepare: the counts and flags one token adds, and its checks.
    fn prepare(&mut self, token: Token) -> Result<()> {
        let sign_conflict =
            || bad("cannot use \"S\" together with \"PL\", \"MI\", \"SG\" or \"PR\"");
        match token {
            Token::Nine | Token::Zero if self.bracket => {
                return Err(bad("\"9\" must be ahead of \"PR\""));
            }
            Token::Nine => {
                if self.decimal {
                    self.post += 1
                } else {
                    self.pre += 1
                }
            }
            Token::Zero => {
                if !self.zero && !self.decimal {
                    self.zero = true;
                    self.zero_start = self.pre;
                }
                if self.decimal {
                    self.post += 1
                } else {
                    self.pre += 1
                }
                self.zero_end = self.pre + self.post;
            }
            Token::Point if self.decimal => return Err(bad("multiple decimal points")),
            Token::Point => self.decimal = true,
            Token::FillMode => self.fill_mode = true,
            Token::Sign if self.sign_at != SignAt::None => {
                return Err(bad("cannot use \"S\" twice"));
            }
            Token::Sign if self.plus || self.minus || self.bracket => return Err(sign_conflict()),
            Token::Sign => {
                self.sign_at = if self.decimal {
                    SignAt::After
                } else {
                    SignAt::Before
                };
                self.pre_sign_digits = self.pre;
            }
            Token::Minus | Token::Plus | Token::PlusMinus if self.sign_at != SignAt::None => {
                return Err(sign_conflict());
            }
            Token::Minus => self.minus = true,
            Token::Plus => self.plus = true,
            Token::PlusMinus => {
                self.minus = true;
                self.plus = true;
            }
            Token::Bracket if self.sign_at != SignAt::None || self.plus || self.minus => {
                return Err(sign_conflict());
            }
            Token::Bracket => self.bracket = true,
            Token::Roman { .. } => self.roman = true,
            Token::Exponent if self.exponent => return Err(bad("cannot use \"EEEE\" twice")),
            Token::Exponent if self.bracket || self.plus || self.minus || self.roman => {
                return Err(bad("\"EEEE\" is incompatible with other formats"));
            }
            Token::Exponent => self.exponent = true,
            Token::Multiply | Token::Blank => {
                return Err(error(
                    SqlState::FEATURE_NOT_SUPPORTED,
                    "the to_char patterns \"V\" and \"B\" are not supported",
                ));
            }
            Token::Comma | Token::Group | Token::Currency | Token::Ordinal { .. } => {}
        }
        Ok(())
    }
}

fn roman(n: i64) -> Option<String> {
    if !(1..=3999).contains(&n) {
        return None;
    }
    const PARTS: [(i64, &str); 13] = [
        (1000, "M"),
        (900, "CM"),
        (500, "D"),
        (400, "CD"),
        (100, "C"),
        (90, "XC"),
        (50, "L"),
        (40, "XL"),
        (10, "X"),
        (9, "IX"),
        (5, "V"),
        (4, "IV"),
        (1, "I"),
    ];
    let mut n = n;
    let mut out = String::new();
    for (value, letters) in PARTS {
        while n >= value {
            out.push_str(letters);
            n -= value;
        }
    }
    Some(out)
}

/// `1.23e+03`: scientific notation with `post` digits, two exponent digits at least.
fn scientific(v: f64, post: usize) -> String {
    let s = format!("{:.*e}", post, v.abs());
    let Some((mantissa, exp)) = s.split_once('e') else {
        return s;
    };
    let exponent: i32 = exp.parse().unwrap_or(0);
    let sign = if v.is_sign_negative() { "-" } else { " " };
    format!(
        "{sign}{mantissa}e{}{:02}",
        if exponent < 0 { '-' } else { '+' },
        exponent.abs()
    )
}

/// A numeric in `EEEE` form as PostgreSQL's numeric_out_sci writes it: the exponent is taken
/// before rounding, so 9.96 with one decimal is `10.0e+00`.
fn decimal_scientific(v: i128, scale: i8, post: usize) -> String {
    let digits = v.unsigned_abs().to_string();
    let exponent = if v == 0 {
        0
    } else {
        digits.len() as i32 - 1 - i32::from(scale)
    };
    let significand = decimal::rescale(
        v,
        (i32::from(scale) + exponent).clamp(-127, 127) as i8,
        post as i8,
    )
    .unwrap_or(0);
    let sign = if v < 0 { "-" } else { " " };
    format!(
        "{sign}{}e{}{:02}",
        decimal_text(significand.abs(), post as i8),
        if exponent < 0 { '-' } else { '+' },
        exponent.abs()
    )
}

/// What one number renders from: its digits (rounded, without sign), its sign, its
/// integral value (for roman numerals) and its `EEEE` form.
struct Digits {
    digits: String,
    negative: bool,
    whole: Option<i64>,
    scientific: String,
}

fn render(f: &Format, d: Digits) -> String {
    let Digits {
        digits,
        negative,
        whole: roman_value,
        scientific,
    } = d;
    if f.exponent {
        return scientific;
    }
    if f.roman {
        let numeral = roman_value
            .and_then(roman)
            .unwrap_or_else(|| "#".repeat(15));
        let upper = f
            .nodes
            .iter()
            .any(|n| matches!(n, Node::Token(Token::Roman { upper: true })));
        let numeral = if upper {
            numeral
        } else {
            numeral.to_lowercase()
        };
        return if f.fill_mode {
            numeral
        } else {
            format!("{numeral:>15}")
        };
    }
    NumberWriter::new(f, digits, negative).write()
}

/// The state of PostgreSQL's NUMProc while writing one number.
struct NumberWriter<'a> {
    f: &'a Format,
    number: Vec<u8>,
    at: usize,
    negative: bool,
    out: String,
    sign_wrote: bool,
    num_in: bool,
    num_curr: usize,
    pre_spaces: usize,
    /// Fill mode: the last fraction digit worth printing (trailing zeros go).
    last_relevant: Option<usize>,
    sign_at: SignAt,
    bracket: bool,
    /// Position (in numeric tokens) of the last one, where PR closes and a trailing S goes.
    last_numeric: usize,
}

impl<'a> NumberWriter<'a> {
    fn new(f: &'a Format, digits: String, negative: bool) -> Self {
        let integer_len = digits.find('.').unwrap_or(digits.len());
        let (number, pre_spaces) = if integer_len > f.pre {
            // Overflow: every digit position is '#'.
            let mut hashes = "#".repeat(f.pre + f.post + 1).into_bytes();
            hashes[f.pre] = b'.';
            (hashes, 0)
        } else {
            (digits.into_bytes(), f.pre - integer_len)
        };
        let mut sign_at = f.sign_at;
        let mut bracket = f.bracket;
        if !negative && f.fill_mode {
            bracket = false;
        }
        // With PL alone the number still writes its own sign; MI or SG write it for the number.
        let sign_wrote = if f.plus || f.minus {
            f.minus
        } else {
            !negative && f.fill_mode && sign_at == SignAt::None
        };
        if sign_at == SignAt::Before && f.pre == f.pre_sign_digits {
            sign_at = SignAt::After;
        }
        let mut last_relevant = None;
        if f.fill_mode
            && f.decimal
            && let Some(point) = number.iter().position(|&b| b == b'.')
        {
            let mut relevant = point;
            for (i, &b) in number.iter().enumerate().skip(point + 1) {
                if b != b'0' {
                    relevant = i;
                }
            }
            // Digits written as '0' in the template are kept.
            if f.zero_end > pre_spaces {
                relevant = relevant.max(f.zero_end - pre_spaces);
            }
            last_relevant = Some(relevant);
        }
        let numeric_tokens = f
            .nodes
            .iter()
            .filter(|n| matches!(n, Node::Token(Token::Nine | Token::Zero | Token::Point)))
            .count();
        NumberWriter {
            f,
            number,
            at: 0,
            negative,
            out: String::new(),
            sign_wrote,
            num_in: false,
            num_curr: 0,
            pre_spaces,
            last_relevant,
            sign_at,
            bracket,
            last_numeric: numeric_tokens.saturating_sub(1),
        }
    }

    fn current(&self) -> u8 {
        self.number.get(self.at).copied().unwrap_or(0)
    }

    /// "0.1" with "9.9" prints " .1": the integer zero of a fraction is a blank.
    fn predecimal_space(&self) -> bool {
        !self.f.zero && self.at == 0 && self.number.first() == Some(&b'0') && self.f.post != 0
    }

    fn last_relevant_is_point(&self) -> bool {
        self.last_relevant
            .is_some_and(|i| self.number.get(i) == Some(&b'.'))
    }

    fn write_sign(&mut self) {
        let starts =
            self.num_curr >= self.pre_spaces || self.f.zero && self.f.zero_start == self.num_curr;
        if self.sign_wrote || !starts || self.predecimal_space() && !self.last_relevant_is_point() {
            return;
        }
        if self.sign_at != SignAt::None {
            if self.sign_at == SignAt::Before {
                self.out.push(if self.negative { '-' } else { '+' });
                self.sign_wrote = true;
            }
        } else if self.bracket {
            self.out.push(if self.negative { '<' } else { ' ' });
            self.sign_wrote = true;
        } else if !self.negative {
            if !self.f.fill_mode {
                self.out.push(' ');
            }
            self.sign_wrote = true;
        } else {
            self.out.push('-');
            self.sign_wrote = true;
        }
    }

    /// PostgreSQL's NUM_numpart_to_char: one `9`, `0` or decimal point.
    fn numeric_part(&mut self, token: Token) {
        self.write_sign();
        let f = self.f;
        if self.num_curr < self.pre_spaces && (f.zero_start > self.num_curr || !f.zero) {
            if !f.fill_mode {
                self.out.push(' ');
            }
        } else if f.zero && self.num_curr < self.pre_spaces && f.zero_start <= self.num_curr {
            self.out.push('0');
            self.num_in = true;
        } else {
            let c = self.current();
            if c == b'.' {
                self.out.push('.');
            } else if self.last_relevant.is_some_and(|r| self.at > r) && token != Token::Zero {
                // Fill mode drops this trailing zero.
            } else if self.predecimal_space() {
                if !f.fill_mode {
                    self.out.push(' ');
                } else if self.last_relevant_is_point() {
                    self.out.push('0');
                }
            } else if c != 0 {
                self.out.push(char::from(c));
                self.num_in = true;
            }
            if c != 0 {
                self.at += 1;
            }
        }
        let mut last = self.last_numeric;
        if self.last_relevant.is_some_and(|r| r + 1 == self.at) && self.f.fill_mode {
            last = last.min(self.num_curr);
        }
        if self.num_curr == last {
            if self.sign_wrote && self.bracket {
                self.out.push(if self.negative { '>' } else { ' ' });
            } else if self.sign_at == SignAt::After {
                self.out.push(if self.negative { '-' } else { '+' });
            }
        }
        self.num_curr += 1;
    }

    fn write(mut self) -> String {
        for node in &self.f.nodes {
            match node {
                Node::Literal(text) => self.out.push_str(text),
                Node::Token(token) => self.token(*token),
            }
        }
        self.out
    }

    fn token(&mut self, token: Token) {
        let f = self.f;
        match token {
            Token::Nine | Token::Zero | Token::Point => self.numeric_part(token),
            Token::Comma | Token::Group => {
                if self.num_in {
                    self.out.push(',');
                } else if !f.fill_mode {
                    self.out.push(' ');
                }
            }
            Token::Currency => self.out.push(' '),
            Token::Ordinal { upper }
                if !self.negative && !f.decimal && self.number.first() != Some(&b'#') =>
            {
                let digits = String::from_utf8_lossy(&self.number).into_owned();
                self.out.push_str(ordinal_suffix(&digits, upper));
            }
            Token::Minus => {
                if self.negative {
                    self.out.push('-');
                } else if !f.fill_mode {
                    self.out.push(' ');
                }
            }
            Token::Plus => {
                if !self.negative {
                    self.out.push('+');
                } else if !f.fill_mode {
                    self.out.push(' ');
                }
            }
            Token::PlusMinus => self.out.push(if self.negative { '-' } else { '+' }),
            _ => {}
        }
    }
}

/// The digits PostgreSQL's to_char starts from, per input type, rounded to the template's
/// fraction digits.
fn float_scientific(v: f64, post: usize) -> String {
    if v.is_finite() {
        scientific(v, post)
    } else {
        format!(" {v}")
    }
}

fn digits_of(column: &ArrayRef, i: usize, f: &Format) -> Result<Digits> {
    Ok(match column.data_type() {
        DataType::Decimal128(_, scale) => {
            let v = column.as_primitive::<Decimal128Type>().value(i);
            let rounded = decimal::rescale(v, *scale, f.post as i8).ok_or_else(|| {
                error(
                    SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                    "numeric field overflow",
                )
            })?;
            let text = decimal_text(rounded.abs(), f.post as i8);
            let whole = decimal::rescale(v, *scale, 0).and_then(|w| i64::try_from(w).ok());
            Digits {
                digits: text,
                negative: rounded < 0,
                whole,
                scientific: decimal_scientific(v, *scale, f.post),
            }
        }
        DataType::Float32 | DataType::Float64 => {
            let floats = arrow::compute::cast(&column.slice(i, 1), &DataType::Float64)?;
            let v = floats.as_primitive::<Float64Type>().value(0);
            let significant = if column.data_type() == &DataType::Float32 {
                6
            } else {
                15
            };
            let integer_len = format!("{:.0}", v.abs()).len();
            let post = if integer_len >= significant {
                0
            } else {
                f.post.min(significant - integer_len)
            };
            let text = format!("{:.*}", post, v.abs());
            let text = if post < f.post && f.decimal {
                format!(
                    "{text}{}{}",
                    if post == 0 { "." } else { "" },
                    "0".repeat(f.post - post)
                )
            } else {
                text
            };
            Digits {
                digits: text,
                negative: v.is_sign_negative() && !v.is_nan(),
                whole: Some(v.round() as i64),
                scientific: float_scientific(v, f.post),
            }
        }
        _ => {
            let ints = arrow::compute::cast(&column.slice(i, 1), &DataType::Int64)?;
            let v = ints.as_primitive::<Int64Type>().value(0);
            let mut text = v.unsigned_abs().to_string();
            if f.post > 0 {
                text.push('.');
                text.push_str(&"0".repeat(f.post));
            }
            Digits {
                digits: text,
                negative: v < 0,
                whole: Some(v),
                scientific: float_scientific(v as f64, f.post),
            }
        }
    })
}

/// `to_char` over a numeric column and a template column.
pub fn to_char(values: &ArrayRef, templates: &StringArray) -> Result<ColumnarValue> {
    let mut b = StringBuilder::with_capacity(values.len(), values.len() * 12);
    let mut parsed: Option<(String, Format)> = None;
    for i in 0..values.len() {
        if values.is_null(i) || templates.is_null(i) {
            b.append_null();
            continue;
        }
        let template = templates.value(i);
        if parsed.as_ref().is_none_or(|(t, _)| t != template) {
            parsed = Some((template.to_owned(), parse(template)?));
        }
        let Some((_, format)) = &parsed else { continue };
        b.append_value(render(format, digits_of(values, i, format)?));
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to_char_int(v: i64, template: &str) -> String {
        let f = parse(template).unwrap();
        let mut text = v.unsigned_abs().to_string();
        if f.post > 0 {
            text = format!("{text}.{}", "0".repeat(f.post));
        }
        render(
            &f,
            Digits {
                digits: text,
                negative: v < 0,
                whole: Some(v),
                scientific: float_scientific(v as f64, f.post),
            },
        )
    }

    #[test]
    fn integers_like_postgres() {
        assert_eq!(to_char_int(12, "999"), "  12");
        assert_eq!(to_char_int(-12, "999"), " -12");
        assert_eq!(to_char_int(-12, "S999"), " -12");
        assert_eq!(to_char_int(12, "S999"), " +12");
        assert_eq!(to_char_int(-12, "999PR"), " <12>");
        assert_eq!(to_char_int(-12, "999MI"), " 12-");
        assert_eq!(to_char_int(12345, "999"), " ###");
        assert_eq!(to_char_int(0, "9999"), "    0");
        assert_eq!(to_char_int(42, "FM999th"), "42nd");
        assert_eq!(to_char_int(12, "0009"), " 0012");
    }
}
