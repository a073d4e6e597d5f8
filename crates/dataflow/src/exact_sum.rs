//! Exact sums of doubles that can be retracted.
//!
//! A float sum kept as an `f64` cannot take a value back: after `1e20 + 1 - 1e20` it holds 0,
//! and after a NaN or an infinity it holds NaN forever, while the query recomputed over the
//! rows left answers 1 (or a number). [`ExactFloatSum`] keeps the sum of the finite values as
//! an exact big integer in units of 2^-1074 (the smallest subnormal), NaNs and infinities as
//! counts, and rounds once, to the nearest double, when it is read. Adding a value and its
//! retraction leaves it exactly as it was, in any order.
//!
//! The integer is a sparse list of base-2^32 digits held in `i128`s (a group's values usually
//! touch one or two digits); a digit past 2^100 carries into the next, so no digit overflows.

/// The sum of finite values in digits of 32 bits, plus counts of NaN and infinities.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ExactFloatSum {
    /// (digit index, value): the sum is Σ value · 2^(32·index − 1074); sorted by index.
    digits: Vec<(u16, i128)>,
    nan: i64,
    positive_infinity: i64,
    negative_infinity: i64,
}

const DIGIT_BITS: u32 = 32;
/// Digits are carried once they pass this magnitude (a 116-bit addend shifted by 31 bits fits
/// well below `i128::MAX` on top of it).
const CARRY_AT: i128 = 1 << 100;
/// Digits past which an addition normalizes the sum (values of one magnitude touch two or three).
const COMPACT_AT_DIGITS: usize = 6;

impl ExactFloatSum {
    /// Adds `x`, `weight` times (a negative weight retracts).
    pub(crate) fn add(&mut self, x: f64, weight: i64) {
        if x.is_nan() {
            self.nan += weight;
            return;
        }
        if x.is_infinite() {
            if x > 0.0 {
                self.positive_infinity += weight
            } else {
                self.negative_infinity += weight
            }
            return;
        }
        if x == 0.0 || weight == 0 {
            return;
        }
        let bits = x.to_bits();
        let exponent = ((bits >> 52) & 0x7ff) as u32;
        let fraction = bits & ((1 << 52) - 1);
        // x = ±mantissa · 2^(shift − 1074)
        let (mantissa, shift) = if exponent == 0 {
            (fraction, 0)
        } else {
            (fraction | (1 << 52), exponent - 1)
        };
        let sign: i128 = if x < 0.0 { -1 } else { 1 };
        // |mantissa · weight| < 2^116: split at 2^64 so that each part, shifted, fits.
        let value = i128::from(mantissa) * i128::from(weight) * sign;
        let (index, offset) = ((shift / DIGIT_BITS) as u16, shift % DIGIT_BITS);
        let low = value & i128::from(u64::MAX);
        let high = value >> 64;
        self.add_digit(index, low << offset);
        self.add_digit(index + 2, high << offset);
        // Digits of mixed signs can cancel without vanishing: keep the list short.
        if self.digits.len() > COMPACT_AT_DIGITS {
            self.normalize();
        }
    }

    /// Rewrites the digits in their one canonical form (each in [0, 2^32) but the top one,
    /// which carries the sign; no zero digits): a sum back at zero holds no digits.
    pub(crate) fn normalize(&mut self) {
        let dense = normalized(&self.digits);
        self.digits = dense
            .into_iter()
            .enumerate()
            .filter(|(_, d)| *d != 0)
            .map(|(i, d)| (i as u16, d))
            .collect();
    }

    fn add_digit(&mut self, index: u16, value: i128) {
        if value == 0 {
            return;
        }
        let at = match self.digits.binary_search_by_key(&index, |(i, _)| *i) {
            Ok(at) => {
                self.digits[at].1 += value;
                at
            }
            Err(at) => {
                self.digits.insert(at, (index, value));
                at
            }
        };
        let digit = self.digits[at].1;
        if digit == 0 {
            self.digits.remove(at);
        } else if digit.abs() >= CARRY_AT {
            let carry = digit >> DIGIT_BITS;
            self.digits[at].1 = digit - (carry << DIGIT_BITS);
            self.add_digit(index + 1, carry);
        }
    }

    /// The sum, rounded to the nearest double (NaN with a NaN, or with both infinities).
    pub(crate) fn value(&self) -> f64 {
        match (
            self.nan > 0,
            self.positive_infinity > 0,
            self.negative_infinity > 0,
        ) {
            (true, _, _) | (_, true, true) => return f64::NAN,
            (_, true, false) => return f64::INFINITY,
            (_, false, true) => return f64::NEG_INFINITY,
            _ => {}
        }
        let mut digits = normalized(&self.digits);
        let negative = digits.last().is_some_and(|d| *d < 0);
        if negative {
            for d in &mut digits {
                *d = -*d;
            }
            digits = normalized(
                &digits
                    .iter()
                    .enumerate()
                    .map(|(i, d)| (i as u16, *d))
                    .collect::<Vec<_>>(),
            );
        }
        let magnitude = round_to_double(&digits);
        if negative { -magnitude } else { magnitude }
    }

    /// Bytes of its state.
    pub(crate) fn size(&self) -> usize {
        std::mem::size_of::<Self>() + self.digits.len() * std::mem::size_of::<(u16, i128)>()
    }

    /// The state as bytes, little-endian: the three counts, then (index u16, digit i128) pairs.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        for n in [self.nan, self.positive_infinity, self.negative_infinity] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        let mut canonical = self.clone();
        canonical.normalize();
        for (i, d) in &canonical.digits {
            out.extend_from_slice(&i.to_le_bytes());
            out.extend_from_slice(&d.to_le_bytes());
        }
    }

    /// The inverse of [`ExactFloatSum::encode`]; `None` when the bytes are not one.
    pub(crate) fn decode(bytes: &[u8]) -> Option<ExactFloatSum> {
        let (counts, mut rest) = bytes.split_at_checked(24)?;
        let count = |i: usize| {
            counts
                .get(i * 8..i * 8 + 8)
                .and_then(|b| b.try_into().ok())
                .map(i64::from_le_bytes)
        };
        let mut sum = ExactFloatSum {
            digits: Vec::new(),
            nan: count(0)?,
            positive_infinity: count(1)?,
            negative_infinity: count(2)?,
        };
        while !rest.is_empty() {
            let (pair, next) = rest.split_at_checked(18)?;
            let index = u16::from_le_bytes(pair[..2].try_into().ok()?);
            let digit = i128::from_le_bytes(pair[2..].try_into().ok()?);
            if sum.digits.last().is_some_and(|(i, _)| *i >= index) {
                return None;
            }
            sum.digits.push((index, digit));
            rest = next;
        }
        Some(sum)
    }
}

/// Dense digits, each in [0, 2^32) but the last, which carries the sign; no leading zeros.
fn normalized(sparse: &[(u16, i128)]) -> Vec<i128> {
    let top = sparse.last().map_or(0, |(i, _)| *i as usize);
    let mut dense = vec![0i128; top + 8];
    for (i, d) in sparse {
        dense[*i as usize] += d;
    }
    for i in 0..dense.len() - 1 {
        let carry = dense[i] >> DIGIT_BITS;
        dense[i] -= carry << DIGIT_BITS;
        dense[i + 1] += carry;
    }
    while dense.len() > 1 && dense.last() == Some(&0) {
        dense.pop();
    }
    dense
}

/// The non-negative integer `digits` (base 2^32, each in [0, 2^32)) times 2^-1074, rounded to
/// the nearest double, ties to even. (A result below 2^-1022 may round twice: once to 53 bits,
/// once when scaled into the subnormal range.)
fn round_to_double(digits: &[i128]) -> f64 {
    let Some(top) = digits.iter().rposition(|d| *d != 0) else {
        return 0.0;
    };
    // The top three digits hold the 64 leading bits; any bit below them is sticky.
    let digit = |i: usize| digits.get(i).map_or(0u128, |d| *d as u128);
    let head = (digit(top) << 64)
        | (digit(top.wrapping_sub(1)) << 32)
        | if top >= 2 { digit(top - 2) } else { 0 };
    let below = if top >= 3 {
        digits[..top - 2].iter().any(|d| *d != 0)
    } else {
        false
    };
    let lead = head.leading_zeros();
    let aligned = head << lead;
    let mut mantissa = (aligned >> 64) as u64;
    if below || (aligned as u64) != 0 {
        mantissa |= 1;
    }
    // value = mantissa · 2^(exponent)
    let exponent = DIGIT_BITS as i32 * (top as i32 - 2) + 64 - lead as i32 - 1074;
    scale(mantissa as f64, exponent)
}

/// `x · 2^exponent`, in steps that stay within the range of doubles.
fn scale(mut x: f64, mut exponent: i32) -> f64 {
    while exponent > 1000 {
        x *= 2f64.powi(1000);
        exponent -= 1000;
    }
    while exponent < -1000 {
        x *= 2f64.powi(-1000);
        exponent += 1000;
    }
    x * 2f64.powi(exponent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn retracting_leaves_what_was_there() {
        let mut sum = ExactFloatSum::default();
        sum.add(1e20, 1);
        sum.add(1.0, 1);
        sum.add(1e20, -1);
        assert_eq!(sum.value(), 1.0);
        sum.add(f64::NAN, 1);
        assert!(sum.value().is_nan());
        sum.add(f64::NAN, -1);
        sum.add(f64::INFINITY, 2);
        assert_eq!(sum.value(), f64::INFINITY);
        sum.add(f64::NEG_INFINITY, 1);
        assert!(sum.value().is_nan());
        sum.add(f64::INFINITY, -2);
        sum.add(f64::NEG_INFINITY, -1);
        assert_eq!(sum.value(), 1.0);
        sum.add(1.0, -1);
        assert_eq!(sum.value(), 0.0);
        sum.normalize();
        assert_eq!(sum, ExactFloatSum::default());
        sum.add(f64::MAX, 1);
        sum.add(f64::MAX, 1);
        assert_eq!(sum.value(), f64::INFINITY);
        sum.add(f64::MAX, -1);
        assert_eq!(sum.value(), f64::MAX);
        sum.add(f64::MAX, -1);
        sum.add(5e-324, 3);
        sum.add(-2.5, 1);
        assert_eq!(sum.value(), -2.5);
        let back = ExactFloatSum::decode(&{
            let mut b = Vec::new();
            sum.encode(&mut b);
            b
        });
        sum.normalize();
        assert_eq!(back.as_ref(), Some(&sum));
    }

    proptest! {
        /// Values that are multiples of 2^-20 below 2^60 sum exactly in an i128 (in units of
        /// 2^-20): the accumulator must equal that sum rounded once, whatever the order, the
        /// weights and the retractions.
        #[test]
        fn equals_the_exact_sum_rounded_once(values in prop::collection::vec((-(1i64 << 40)..(1i64 << 40), -20i32..20, -3i64..4), 1..40)) {
            let mut sum = ExactFloatSum::default();
            let mut exact: i128 = 0;
            for (m, e, weight) in &values {
                let x = *m as f64 * 2f64.powi(*e);
                sum.add(x, *weight);
                exact += i128::from(*m) * (1i128 << (e + 20)) * i128::from(*weight);
            }
            let want = exact as f64 / (1u64 << 20) as f64;
            prop_assert_eq!(sum.value(), want);
            for (m, e, weight) in values.iter().rev() {
                sum.add(*m as f64 * 2f64.powi(*e), -weight);
            }
            prop_assert_eq!(sum.value(), 0.0);
            sum.normalize();
            prop_assert_eq!(sum, ExactFloatSum::default());
        }
    }
}
