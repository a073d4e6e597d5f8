//! Decimal arithmetic of aggregates, as PostgreSQL's numeric does it: the quotient of a sum and
//! a count rounded half away from zero at the result's scale (never truncated).

/// `sum / count`, with `sum` at some scale and the result `shift` decimal places finer,
/// rounded half away from zero; `None` when it does not fit in 128 bits.
pub fn average(sum: i128, count: i64, shift: u32) -> Option<i128> {
    if count <= 0 {
        return None;
    }
    let count = i128::from(count);
    let factor = 10i128.checked_pow(shift)?;
    // sum = q·count + r with |r| < count: the result is q·10^shift + r·10^shift / count.
    let (q, r) = (sum / count, sum % count);
    let scaled = r.checked_mul(factor)?;
    let (mut fraction, remainder) = (scaled / count, scaled % count);
    if 2 * remainder.abs() >= count {
        fraction += scaled.signum();
    }
    q.checked_mul(factor)?.checked_add(fraction)
}

#[cfg(test)]
mod tests {
    use super::average;

    #[test]
    fn rounds_half_away_from_zero() {
        // avg(1, 2, 2) at 16 decimals: 1.6666666666666667, as PostgreSQL prints it.
        assert_eq!(average(5, 3, 16), Some(16_666_666_666_666_667));
        assert_eq!(average(-5, 3, 16), Some(-16_666_666_666_666_667));
        assert_eq!(average(1, 2, 0), Some(1));
        assert_eq!(average(-1, 2, 0), Some(-1));
        assert_eq!(average(1, 3, 0), Some(0));
        assert_eq!(average(7, 1, 2), Some(700));
        assert_eq!(average(1, 0, 2), None);
        assert_eq!(average(i128::MAX, 1, 16), None);
    }
}
