//! Arithmetic with PostgreSQL's failure modes, as the functions [`super::rules::CheckedArithmetic`]
//! puts in place of DataFusion's operators: integer `+ - *` and negation fail with 22003
//! instead of wrapping; float arithmetic fails on overflow (22003) and division by zero
//! (22012); numeric division keeps at least 16 decimals, as PostgreSQL does for quotients of
//! ordinary size.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Decimal128Builder};
use arrow::datatypes::{DataType, Decimal128Type, Float64Type, i256};
use datafusion::common::Result;
use datafusion::logical_expr::{ColumnarValue, Operator, ScalarUDF, Signature};
use eddy_common::SqlState;

use super::udf::{IMMUTABLE, PgFunction, arrays, error, first_argument_type, operator_name};

fn int_name(t: &DataType) -> &'static str {
    match t {
        DataType::Int16 => "smallint",
        DataType::Int32 => "integer",
        _ => "bigint",
    }
}

/// Integer `+ - *` with arrow's checked kernels: overflow is 22003 "integer out of range".
fn symbol(op: Operator) -> &'static str {
    match op {
        Operator::Plus => "+",
        Operator::Minus => "-",
        Operator::Multiply => "*",
        _ => "/",
    }
}

/// An integer kernel's result, its overflow reported as PostgreSQL does.
fn integer_result(
    result: std::result::Result<ArrayRef, arrow::error::ArrowError>,
    t: &DataType,
) -> Result<ColumnarValue> {
    match result {
        Ok(out) => Ok(ColumnarValue::Array(out)),
        Err(arrow::error::ArrowError::ArithmeticOverflow(_)) => Err(error(
            SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
            format!("{} out of range", int_name(t)),
        )),
        Err(other) => Err(other.into()),
    }
}

fn checked_int(name: &'static str, op: Operator) -> ScalarUDF {
    PgFunction::with_return(
        name,
        Signature::any(2, IMMUTABLE),
        first_argument_type,
        move |args| {
            let a = arrays(args)?;
            let kernel = match op {
                Operator::Plus => arrow::compute::kernels::numeric::add,
                Operator::Minus => arrow::compute::kernels::numeric::sub,
                _ => arrow::compute::kernels::numeric::mul,
            };
            integer_result(kernel(&a[0], &a[1]), a[0].data_type())
        },
    )
    .named(operator_name(symbol(op)))
    .udf()
}

/// Float arithmetic that fails where PostgreSQL's does: a finite result overflowing to
/// infinity (22003) and division by zero (22012). NaN and infinite inputs pass through.
fn checked_float(name: &'static str, op: Operator) -> ScalarUDF {
    PgFunction::with_return(
        name,
        Signature::any(2, IMMUTABLE),
        first_argument_type,
        move |args| {
            let a = arrays(args)?;
            let (x, y) = (as_f64(&a[0])?, as_f64(&a[1])?);
            let mut out = Vec::with_capacity(x.len());
            for i in 0..x.len() {
                if x.is_null(i) || y.is_null(i) {
                    out.push(None);
                    continue;
                }
                let (l, r) = (x.value(i), y.value(i));
                let v = match op {
                    Operator::Plus => l + r,
                    Operator::Minus => l - r,
                    Operator::Multiply => l * r,
                    _ if r == 0.0 => {
                        return Err(error(SqlState::DIVISION_BY_ZERO, "division by zero"));
                    }
                    _ => l / r,
                };
                let single = a[0].data_type() == &DataType::Float32;
                let overflowed = if single {
                    (v as f32).is_infinite()
                } else {
                    v.is_infinite()
                };
                if overflowed && l.is_finite() && r.is_finite() {
                    return Err(error(
                        SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                        "value out of range: overflow",
                    ));
                }
                out.push(Some(v));
            }
            let result: ArrayRef = Arc::new(arrow::array::Float64Array::from(out));
            Ok(ColumnarValue::Array(arrow::compute::cast(
                &result,
                a[0].data_type(),
            )?))
        },
    )
    .named(operator_name(symbol(op)))
    .udf()
}

fn as_f64(array: &ArrayRef) -> Result<arrow::array::Float64Array> {
    Ok(arrow::compute::cast(array, &DataType::Float64)?
        .as_primitive::<Float64Type>()
        .clone())
}

fn checked_negate() -> ScalarUDF {
    PgFunction::with_return(
        "eddy_int_negate",
        Signature::any(1, IMMUTABLE),
        first_argument_type,
        |args| {
            let a = arrays(args)?;
            integer_result(
                arrow::compute::kernels::numeric::neg(&a[0]),
                a[0].data_type(),
            )
        },
    )
    .named(operator_name("-"))
    .udf()
}

/// `numeric / numeric` at scale max(16, both scales), rounded half away from zero: the
/// scale PostgreSQL gives quotients between 1 and 10,000 (it picks a scale per value; Arrow
/// keeps one per column). Division by zero is 22012.
fn numeric_divide() -> ScalarUDF {
    PgFunction::with_return(
        NUMERIC_DIVIDE,
        Signature::any(2, IMMUTABLE),
        |args| match (
            args.arg_fields[0].data_type(),
            args.arg_fields[1].data_type(),
        ) {
            (DataType::Decimal128(_, s1), DataType::Decimal128(_, s2)) => Ok(
                super::text::numeric_field_at_scale((*s1).max(*s2).max(QUOTIENT_SCALE)),
            ),
            (l, r) => Err(super::udf::no_such_function(
                NUMERIC_DIVIDE,
                &[l.clone(), r.clone()],
            )),
        },
        |args| {
            let a = arrays(args)?;
            let scale = |t: &DataType| match t {
                DataType::Decimal128(_, s) => *s,
                _ => 0,
            };
            let (s1, s2) = (scale(a[0].data_type()), scale(a[1].data_type()));
            let DataType::Decimal128(p, target) = args.return_type().clone() else {
                return Err(error(
                    SqlState::INTERNAL_ERROR,
                    "numeric division result is not numeric",
                ));
            };
            // l / r at `target` = l * 10^(target + s2 - s1) / r, in 256 bits, rounded.
            let shift = i32::from(target) + i32::from(s2) - i32::from(s1);
            let ten = i256::from_i128(10);
            let (x, y) = (
                a[0].as_primitive::<Decimal128Type>(),
                a[1].as_primitive::<Decimal128Type>(),
            );
            let mut b =
                Decimal128Builder::with_capacity(x.len()).with_precision_and_scale(p, target)?;
            for i in 0..x.len() {
                if x.is_null(i) || y.is_null(i) {
                    b.append_null();
                    continue;
                }
                let (l, r) = (i256::from_i128(x.value(i)), i256::from_i128(y.value(i)));
                if r == i256::ZERO {
                    return Err(error(SqlState::DIVISION_BY_ZERO, "division by zero"));
                }
                let (mut numerator, mut denominator) = (l, r);
                if shift >= 0 {
                    numerator = numerator
                        .checked_mul(ten.checked_pow(shift as u32).ok_or_else(overflow)?)
                        .ok_or_else(overflow)?;
                } else {
                    denominator = denominator
                        .checked_mul(ten.checked_pow((-shift) as u32).ok_or_else(overflow)?)
                        .ok_or_else(overflow)?;
                }
                let (q, rem) = (numerator / denominator, numerator % denominator);
                let twice = rem
                    .wrapping_abs()
                    .checked_mul(i256::from_i128(2))
                    .ok_or_else(overflow)?;
                let rounded = if twice >= denominator.wrapping_abs() {
                    if (numerator < i256::ZERO) != (denominator < i256::ZERO) {
                        q - i256::ONE
                    } else {
                        q + i256::ONE
                    }
                } else {
                    q
                };
                let value = rounded
                    .to_i128()
                    .filter(|v| super::decimal::fits(*v, p))
                    .ok_or_else(overflow)?;
                b.append_value(value);
            }
            Ok(ColumnarValue::Array(Arc::new(b.finish()) as ArrayRef))
        },
    )
    .named(operator_name("/"))
    .udf()
}

fn overflow() -> datafusion::common::DataFusionError {
    error(
        SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        "numeric field overflow",
    )
}

pub const NUMERIC_DIVIDE: &str = "eddy_numeric_divide";
const QUOTIENT_SCALE: i8 = 16;

/// The functions [`super::rules::CheckedArithmetic`] calls, built once per session.
#[derive(Debug)]
pub struct ArithmeticFunctions {
    pub output_text: Arc<ScalarUDF>,
    pub cast: Arc<ScalarUDF>,
    pub int: [Arc<ScalarUDF>; 3],
    pub float: [Arc<ScalarUDF>; 4],
    pub negate: Arc<ScalarUDF>,
    pub numeric_divide: Arc<ScalarUDF>,
}

/// The checked operators, registered under their names (so plans can be displayed and
/// views restored) and handed to [`super::rules::CheckedArithmetic`].
pub fn arithmetic_functions(
    output_text: Arc<ScalarUDF>,
    cast: Arc<ScalarUDF>,
) -> ArithmeticFunctions {
    ArithmeticFunctions {
        output_text,
        cast,
        int: [
            Arc::new(checked_int("eddy_int_add", Operator::Plus)),
            Arc::new(checked_int("eddy_int_subtract", Operator::Minus)),
            Arc::new(checked_int("eddy_int_multiply", Operator::Multiply)),
        ],
        float: [
            Arc::new(checked_float("eddy_float_add", Operator::Plus)),
            Arc::new(checked_float("eddy_float_subtract", Operator::Minus)),
            Arc::new(checked_float("eddy_float_multiply", Operator::Multiply)),
            Arc::new(checked_float("eddy_float_divide", Operator::Divide)),
        ],
        negate: Arc::new(checked_negate()),
        numeric_divide: Arc::new(numeric_divide()),
    }
}

impl ArithmeticFunctions {
    pub fn all(&self) -> Vec<Arc<ScalarUDF>> {
        let mut out: Vec<Arc<ScalarUDF>> =
            self.int.iter().chain(self.float.iter()).cloned().collect();
        out.push(Arc::clone(&self.negate));
        out.push(Arc::clone(&self.numeric_divide));
        out
    }
}
