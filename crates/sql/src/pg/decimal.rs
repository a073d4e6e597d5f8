//! `numeric` values as Arrow holds them (an `i128` of digits and a fixed scale) and the
//! arithmetic PostgreSQL's numeric does on them: rounding half away from zero, precision
//! checks (22003 "numeric field overflow"), parsing `1.5e3`.

use eddy_common::{Error, Result, SqlState};

pub const PRECISION_MAX: u8 = 38;

pub fn pow10(n: u32) -> Option<i128> {
    10i128.checked_pow(n)
}

/// `value` (at `from` scale) at scale `to`, rounding half away from zero when digits go.
pub fn rescale(value: i128, from: i8, to: i8) -> Option<i128> {
    if to >= from {
        return value.checked_mul(pow10(u32::from((to - from) as u8))?);
    }
    let Some(divisor) = pow10(u32::from((from - to) as u8)) else {
        return Some(0);
    };
    let quotient = value / divisor;
    let remainder = value % divisor;
    // |remainder| * 2 >= divisor rounds away from zero; written to avoid overflow.
    let away = remainder.unsigned_abs() >= divisor.unsigned_abs() - remainder.unsigned_abs();
    Some(if away {
        quotient + value.signum()
    } else {
        quotient
    })
}

/// Whether `value` has at most `precision` digits.
pub fn fits(value: i128, precision: u8) -> bool {
    pow10(u32::from(precision)).is_none_or(|limit| value.unsigned_abs() < limit.unsigned_abs())
}

pub fn overflow() -> Error {
    Error::new(
        SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        "numeric field overflow",
    )
}

/// `value` at scale `from`, as a numeric(precision, to): rounded, then checked.
pub fn to_precision(value: i128, from: i8, precision: u8, to: i8) -> Result<i128> {
    let v = rescale(value, from, to).ok_or_else(overflow)?;
    if fits(v, precision) {
        Ok(v)
    } else {
        Err(overflow())
    }
}

/// Parses PostgreSQL numeric input (`-1.50`, ` 2 `, `1e3`, `.5`) at `scale`, rounding.
pub fn parse(text: &str, scale: i8) -> Result<i128> {
    let invalid = || {
        Error::new(
            SqlState::INVALID_TEXT_REPRESENTATION,
            format!("invalid input syntax for type numeric: \"{text}\""),
        )
    };
    let t = text.trim();
    if matches!(
        t.to_ascii_lowercase().trim_start_matches(['+', '-']),
        "nan" | "infinity" | "inf"
    ) {
        return Err(Error::unsupported(format!(
            "numeric value \"{t}\" is not supported (Eddy's numeric has no NaN or infinity)"
        )));
    }
    let (negative, body) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (
            &body[..i],
            body[i + 1..].parse::<i32>().map_err(|_| invalid())?,
        ),
        None => (body, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return Err(invalid());
    }
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    // The digits are an integer at scale `fraction.len() - exponent`.
    let digit_scale = fraction.len() as i32 - exponent;
    if digits.len() > 60 || digit_scale.abs() > 100 {
        return Err(overflow());
    }
    let mut value: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| overflow())?
    };
    if negative {
        value = -value;
    }
    if digit_scale >= i32::from(i8::MIN) && digit_scale <= i32::from(i8::MAX) {
        return rescale(value, digit_scale as i8, scale).ok_or_else(overflow);
    }
    Err(overflow())
}

/// The exact decimal digits of `v` with `significant` significant digits (PostgreSQL converts
/// float8 to numeric through 15 digits, float4 through 6), at `scale`.
pub fn from_float(v: f64, significant: usize, scale: i8) -> Result<i128> {
    if !v.is_finite() {
        return Err(Error::unsupported(
            "cannot convert NaN or infinity to numeric",
        ));
    }
    let text = format!("{v:.*e}", significant.saturating_sub(1));
    parse(&text, scale)
}

/// As an `f64` (for functions PostgreSQL computes in double precision).
pub fn to_f64(value: i128, scale: i8) -> f64 {
    value as f64 / 10f64.powi(i32::from(scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_and_parsing() {
        assert_eq!(rescale(1005, 3, 2), Some(101));
        assert_eq!(rescale(-1005, 3, 2), Some(-101));
        assert_eq!(rescale(1004, 3, 2), Some(100));
        assert_eq!(rescale(25, 1, 0), Some(3));
        assert_eq!(rescale(-25, 1, 0), Some(-3));
        assert_eq!(parse("1e3", 0).unwrap(), 1000);
        assert_eq!(parse(" -1.50 ", 2).unwrap(), -150);
        assert_eq!(parse(".5", 1).unwrap(), 5);
        assert_eq!(parse("1.5e-3", 4).unwrap(), 15);
        assert!(parse("abc", 0).is_err());
        assert_eq!(from_float(0.1, 15, 10).unwrap(), 1_000_000_000);
        assert_eq!(
            to_precision(100_000, 2, 5, 2).unwrap_err().state,
            SqlState::NUMERIC_VALUE_OUT_OF_RANGE
        );
    }
}
