//! PostgreSQL's date/time template patterns (`YYYY-MM-DD HH24:MI:SS`, `FMMonth`, `DDth`,
//! `"quoted"`), parsed once into nodes that `to_char` renders and `to_timestamp` / `to_date`
//! read. The keyword table is PostgreSQL's, in its order: the first keyword that is a prefix
//! of the remaining template wins, so `HH24` beats `HH` and `DDD` beats `DD`.

/// The keywords, exactly as PostgreSQL lists them (case matters: `Month` and `MONTH` print
/// differently; `yyyy` is YYYY, `Yyyy` is not a keyword).
const KEYWORDS: &[&str] = &[
    "A.D.", "A.M.", "AD", "AM", "B.C.", "BC", "CC", "DAY", "DDD", "DD", "DY", "Day", "Dy", "D",
    "FF1", "FF2", "FF3", "FF4", "FF5", "FF6", "FX", "HH24", "HH12", "HH", "IDDD", "ID", "IW",
    "IYYY", "IYY", "IY", "I", "J", "MI", "MM", "MONTH", "MON", "MS", "Month", "Mon", "OF", "P.M.",
    "PM", "Q", "RM", "SSSSS", "SSSS", "SS", "TZH", "TZM", "TZ", "US", "WW", "W", "Y,YYY", "YYYY",
    "YYY", "YY", "Y", "a.d.", "a.m.", "ad", "am", "b.c.", "bc", "cc", "day", "ddd", "dd", "dy",
    "d", "ff1", "ff2", "ff3", "ff4", "ff5", "ff6", "fx", "hh24", "hh12", "hh", "iddd", "id", "iw",
    "iyyy", "iyy", "iy", "i", "j", "mi", "mm", "month", "mon", "ms", "of", "p.m.", "pm", "q", "rm",
    "sssss", "ssss", "ss", "tz", "us", "ww", "w", "y,yyy", "yyyy", "yyy", "yy", "y",
];

/// One element of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A template keyword with its modifiers: `FM` (no padding) and `TH`/`th` (ordinal
    /// suffix; `Some(true)` for upper case).
    Keyword {
        keyword: &'static str,
        fill_mode: bool,
        ordinal: Option<bool>,
    },
    /// Text printed as it is (quoted text, separators, anything not a keyword).
    Literal(String),
}

/// Parses a template. Unknown text is literal, as in PostgreSQL; never fails.
pub fn parse(template: &str) -> Vec<Node> {
    let mut nodes = Vec::new();
    let mut rest = template;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('"') {
            let (text, tail) = quoted(after);
            push_literal(&mut nodes, &text);
            rest = tail;
            continue;
        }
        let (fill_mode, after_prefix) =
            match rest.strip_prefix("FM").or_else(|| rest.strip_prefix("fm")) {
                Some(r) => (true, r),
                None => (false, rest),
            };
        // TM (translation mode) prints names in the session's language (Eddy's is English)
        // and, as PostgreSQL does, without padding them.
        let (translated, after_prefix) = match after_prefix
            .strip_prefix("TM")
            .or_else(|| after_prefix.strip_prefix("tm"))
        {
            Some(r) => (true, r),
            None => (false, after_prefix),
        };
        if let Some(keyword) = KEYWORDS.iter().find(|k| after_prefix.starts_with(**k)) {
            let fill_mode = fill_mode || translated;
            let mut tail = &after_prefix[keyword.len()..];
            let ordinal = if let Some(t) = tail.strip_prefix("TH") {
                tail = t;
                Some(true)
            } else if let Some(t) = tail.strip_prefix("th") {
                tail = t;
                Some(false)
            } else {
                None
            };
            nodes.push(Node::Keyword {
                keyword,
                fill_mode,
                ordinal,
            });
            rest = tail;
            continue;
        }
        // Outside quotes a backslash only escapes a double quote.
        let skip = if rest.starts_with("\\\"") { 1 } else { 0 };
        let mut chars = rest[skip..].chars();
        let c = chars.next().unwrap_or_default();
        push_literal(&mut nodes, &c.to_string());
        rest = chars.as_str();
    }
    nodes
}

/// The text of a double-quoted section (backslash quotes the next character) and the rest.
pub(crate) fn quoted(after_quote: &str) -> (String, &str) {
    let mut out = String::new();
    let mut chars = after_quote.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (out, &after_quote[i + 1..]),
            '\\' => match chars.next() {
                Some((_, next)) => out.push(next),
                None => out.push('\\'),
            },
            other => out.push(other),
        }
    }
    (out, "")
}

fn push_literal(nodes: &mut Vec<Node>, text: &str) {
    if let Some(Node::Literal(last)) = nodes.last_mut() {
        last.push_str(text);
    } else {
        nodes.push(Node::Literal(text.to_owned()));
    }
}

/// `st`, `nd`, `rd` or `th` for a number as printed (11th, 12th, 13th; 21st, 22nd).
pub fn ordinal_suffix(digits: &str, upper: bool) -> &'static str {
    let d: Vec<u8> = digits.bytes().filter(u8::is_ascii_digit).collect();
    let last = d.last().copied().unwrap_or(b'0');
    let teen = d.len() >= 2 && d[d.len() - 2] == b'1';
    let s = match (teen, last) {
        (false, b'1') => "st",
        (false, b'2') => "nd",
        (false, b'3') => "rd",
        _ => "th",
    };
    if !upper {
        return s;
    }
    match s {
        "st" => "ST",
        "nd" => "ND",
        "rd" => "RD",
        _ => "TH",
    }
}

pub const MONTH_NAMES: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
pub const DAY_NAMES: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];
pub const ROMAN_MONTHS: [&str; 12] = [
    "I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII",
];

/// A name in the case its keyword asks for: `MONTH` upper, `Month` capitalized, `month` lower.
pub fn cased(name: &str, keyword: &str) -> String {
    let mut letters = keyword.chars().filter(|c| c.is_ascii_alphabetic());
    let first_upper = letters.next().is_some_and(|c| c.is_ascii_uppercase());
    let second_upper = letters.next().is_some_and(|c| c.is_ascii_uppercase());
    match (first_upper, second_upper) {
        (true, true) => name.to_uppercase(),
        (true, false) => name.to_owned(),
        _ => name.to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kw(keyword: &'static str) -> Node {
        Node::Keyword {
            keyword,
            fill_mode: false,
            ordinal: None,
        }
    }

    #[test]
    fn templates_parse_like_postgres() {
        assert_eq!(
            parse("YYYY-MM"),
            vec![kw("YYYY"), Node::Literal("-".into()), kw("MM")]
        );
        assert_eq!(
            parse("HH24:MI"),
            vec![kw("HH24"), Node::Literal(":".into()), kw("MI")]
        );
        assert_eq!(
            parse("FMDDth"),
            vec![Node::Keyword {
                keyword: "DD",
                fill_mode: true,
                ordinal: Some(false)
            }]
        );
        assert_eq!(
            parse("\"Year\" YYYY"),
            vec![Node::Literal("Year ".into()), kw("YYYY")]
        );
        assert_eq!(
            parse("YYYY\\\"MM"),
            vec![kw("YYYY"), Node::Literal("\"".into()), kw("MM")]
        );
        assert_eq!(parse("DDD"), vec![kw("DDD")]);
        assert_eq!(ordinal_suffix("11", false), "th");
        assert_eq!(ordinal_suffix("22", true), "ND");
        assert_eq!(cased("March", "MON"), "MARCH");
        assert_eq!(cased("March", "mon"), "march");
    }
}
