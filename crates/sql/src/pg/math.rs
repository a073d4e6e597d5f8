//! Rounding and integer-division functions with PostgreSQL's types and rules: on numerics
//! they stay numeric (DataFusion goes through double precision) and round half away from
//! zero; on doubles `round` is `rint` (half to even); integers go to double precision, as
//! PostgreSQL resolves `round(5)`. `div` and `mod` divide by zero with 22012. The double
//! precision functions (`sqrt`, `ln`, `power`, ...) fail with PostgreSQL's errors where
//! DataFusion returns NaN or infinity.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Decimal128Builder, Float64Array};
use arrow::datatypes::{DataType, Decimal128Type, Field, Float64Type, Int64Type};
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, Signature,
};
use eddy_common::SqlState;

use super::decimal;
use super::udf::{
    IMMUTABLE, PgFunction, Result, arrays, constant, error, first_argument_type, no_such_function,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rounding {
    Round,
    Trunc,
    Ceil,
    Floor,
}

impl Rounding {
    fn name(self) -> &'static str {
        match self {
            Rounding::Round => "round",
            Rounding::Trunc => "trunc",
            Rounding::Ceil => "ceil",
            Rounding::Floor => "floor",
        }
    }

    fn float(self, v: f64) -> f64 {
        match self {
            Rounding::Round => v.round_ties_even(),
            Rounding::Trunc => v.trunc(),
            Rounding::Ceil => v.ceil(),
            Rounding::Floor => v.floor(),
        }
    }

    /// `value` at `from` scale, rounded to `to` decimals (to may be negative: tens, hundreds).
    fn decimal(self, value: i128, from: i8, to: i8) -> Option<i128> {
        if to >= from {
            return Some(value);
        }
        let divisor = decimal::pow10(u32::from((from - to) as u8))?;
        let (q, r) = (value / divisor, value % divisor);
        let rounded = match self {
            Rounding::Round => {
                return decimal::rescale(value, from, to).and_then(|v| v.checked_mul(divisor));
            }
            Rounding::Trunc => q,
            Rounding::Ceil => q + i128::from(r > 0),
            Rounding::Floor => q - i128::from(r < 0),
        };
        rounded.checked_mul(divisor)
    }
}

fn is_integer(t: &DataType) -> bool {
    t.is_integer()
}

/// The decimals a `round(x, n)` result keeps: a constant `n`, or the input's scale.
fn places(args: &ReturnFieldArgs<'_>, input_scale: i8) -> i8 {
    match constant(args, 1) {
        Some(ScalarValue::Int64(Some(n))) => (*n).clamp(0, 38) as i8,
        Some(ScalarValue::Int32(Some(n))) => (*n).clamp(0, 38) as i8,
        Some(_) => 0,
        None if args.arg_fields.len() > 1 => input_scale.max(0),
        None => 0,
    }
}

fn rounding(kind: Rounding) -> ScalarUDF {
    let returns = move |args: &ReturnFieldArgs<'_>| {
        let t = args.arg_fields[0].data_type();
        let with_places = args.arg_fields.len() > 1;
        let out = match t {
            DataType::Decimal128(_, s) => DataType::Decimal128(38, places(args, *s)),
            // PostgreSQL has round(numeric, int) but no round(double precision, int).
            DataType::Float32 | DataType::Float64 if with_places => {
                return Err(no_such_function(kind.name(), &[t.clone(), DataType::Int32]));
            }
            t if is_integer(t) && with_places => DataType::Decimal128(38, places(args, 0)),
            t if t.is_numeric() || t == &DataType::Null => DataType::Float64,
            t => return Err(no_such_function(kind.name(), std::slice::from_ref(t))),
        };
        Ok(Field::new("", out, true))
    };
    let evaluate = move |args: &ScalarFunctionArgs| -> Result<ColumnarValue> {
        let a = arrays(args)?;
        let out: ArrayRef = match args.return_type() {
            DataType::Decimal128(p, target) => {
                let (p, target) = (*p, *target);
                let input = arrow::compute::cast(
                    &a[0],
                    &DataType::Decimal128(
                        38,
                        match a[0].data_type() {
                            DataType::Decimal128(_, s) => *s,
                            _ => 0,
                        },
                    ),
                )?;
                let from = match input.data_type() {
                    DataType::Decimal128(_, s) => *s,
                    _ => 0,
                };
                let digits = a
                    .get(1)
                    .map(|d| arrow::compute::cast(d, &DataType::Int64))
                    .transpose()?;
                let mut b = Decimal128Builder::with_capacity(input.len())
                    .with_precision_and_scale(p, target)?;
                for (i, v) in input.as_primitive::<Decimal128Type>().iter().enumerate() {
                    let n = match &digits {
                        Some(d) if d.is_null(i) => None,
                        Some(d) => {
                            Some(d.as_primitive::<Int64Type>().value(i).clamp(-38, 38) as i8)
                        }
                        None => Some(0),
                    };
                    let value = match (v, n) {
                        (Some(v), Some(n)) => {
                            let rounded = kind.decimal(v, from, n).ok_or_else(overflow)?;
                            Some(decimal::rescale(rounded, from, target).ok_or_else(overflow)?)
                        }
                        _ => None,
                    };
                    b.append_option(value);
                }
                Arc::new(b.finish())
            }
            _ => {
                let floats = arrow::compute::cast(&a[0], &DataType::Float64)?;
                let out: Float64Array = floats
                    .as_primitive::<Float64Type>()
                    .iter()
                    .map(|v| v.map(|v| kind.float(v)))
                    .collect();
                Arc::new(out)
            }
        };
        Ok(ColumnarValue::Array(out))
    };
    let signature = Signature::one_of(
        vec![
            datafusion::logical_expr::TypeSignature::Any(1),
            datafusion::logical_expr::TypeSignature::Any(2),
        ],
        IMMUTABLE,
    );
    let f = PgFunction::with_return(kind.name(), signature, returns, evaluate);
    if kind == Rounding::Ceil {
        f.alias("ceiling")
    } else {
        f
    }
    .udf()
}

fn overflow() -> datafusion::common::DataFusionError {
    error(
        SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        "numeric field overflow",
    )
}

fn division_by_zero() -> datafusion::common::DataFusionError {
    error(SqlState::DIVISION_BY_ZERO, "division by zero")
}

/// The common type of two numbers for `mod` and `div`: a numeric if either is one, else the
/// wider integer.
fn common(args: &[DataType]) -> Result<Vec<DataType>> {
    let [a, b] = args else {
        return Err(no_such_function("mod", args));
    };
    let t = match (a, b) {
        (DataType::Decimal128(_, s1), DataType::Decimal128(_, s2)) => {
            DataType::Decimal128(38, (*s1).max(*s2))
        }
        (DataType::Decimal128(_, s), t) | (t, DataType::Decimal128(_, s)) if is_integer(t) => {
            DataType::Decimal128(38, *s)
        }
        (a, b) if is_integer(a) && is_integer(b) => {
            let width = |t: &DataType| t.primitive_width().unwrap_or(8);
            if width(a) >= width(b) {
                a.clone()
            } else {
                b.clone()
            }
        }
        _ => return Err(no_such_function("mod", args)),
    };
    Ok(vec![t.clone(), t])
}

fn modulo(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    match arrow::compute::kernels::numeric::rem(&a[0], &a[1]) {
        Ok(out) => Ok(ColumnarValue::Array(out)),
        Err(arrow::error::ArrowError::DivideByZero) => Err(division_by_zero()),
        Err(e) => Err(e.into()),
    }
}

/// `div(a, b)`: the integer quotient, truncated toward zero, as a numeric.
fn div(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let a = arrays(args)?;
    let x = arrow::compute::cast(
        &a[0],
        &DataType::Decimal128(
            38,
            match a[0].data_type() {
                DataType::Decimal128(_, s) => *s,
                _ => 0,
            },
        ),
    )?;
    let y = arrow::compute::cast(&a[1], x.data_type())?;
    let mut b = Decimal128Builder::with_capacity(x.len()).with_precision_and_scale(38, 0)?;
    for (l, r) in x
        .as_primitive::<Decimal128Type>()
        .iter()
        .zip(y.as_primitive::<Decimal128Type>().iter())
    {
        match (l, r) {
            (Some(_), Some(0)) => return Err(division_by_zero()),
            (Some(l), Some(r)) => b.append_value(l / r),
            _ => b.append_null(),
        }
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

fn sign(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let input = &arrays(args)?[0];
    let out: ArrayRef = match input.data_type() {
        DataType::Decimal128(..) => {
            let mut b =
                Decimal128Builder::with_capacity(input.len()).with_precision_and_scale(1, 0)?;
            for v in input.as_primitive::<Decimal128Type>().iter() {
                b.append_option(v.map(i128::signum));
            }
            Arc::new(b.finish())
        }
        _ => {
            let floats = arrow::compute::cast(input, &DataType::Float64)?;
            let out: Float64Array = floats
                .as_primitive::<Float64Type>()
                .iter()
                .map(|v| {
                    v.map(|v| {
                        if v == 0.0 || v.is_nan() {
                            v
                        } else {
                            v.signum()
                        }
                    })
                })
                .collect();
            Arc::new(out)
        }
    };
    Ok(ColumnarValue::Array(out))
}

/// Evaluates a double-precision function row by row, failing where PostgreSQL's does
/// (`ln(0)`, `sqrt(-1)`, `exp(1000)`) instead of returning NaN or infinity.
fn evaluate_floats(
    args: &ScalarFunctionArgs,
    f: fn(&[f64]) -> FloatResult,
) -> Result<ColumnarValue> {
    let columns: Vec<Float64Array> = arrays(args)?
        .iter()
        .map(|c| {
            arrow::compute::cast(c, &DataType::Float64)
                .map(|c| c.as_primitive::<Float64Type>().clone())
        })
        .collect::<std::result::Result<_, _>>()?;
    let mut out = Vec::with_capacity(args.number_rows);
    let mut values = vec![0.0; columns.len()];
    for row in 0..args.number_rows {
        if columns.iter().any(|c| c.is_null(row)) {
            out.push(None);
            continue;
        }
        for (k, c) in columns.iter().enumerate() {
            values[k] = c.value(row);
        }
        let v = f(&values).map_err(|(state, message)| error(state, message))?;
        if v.is_infinite() && values.iter().all(|x| x.is_finite()) {
            return Err(error(
                SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                "value out of range: overflow",
            ));
        }
        out.push(Some(v));
    }
    Ok(ColumnarValue::Array(Arc::new(Float64Array::from(out))))
}

fn float_function(name: &'static str, arity: usize, f: fn(&[f64]) -> FloatResult) -> ScalarUDF {
    let signature = Signature::uniform(arity, vec![DataType::Float64], IMMUTABLE);
    PgFunction::new(name, signature, DataType::Float64, move |args| {
        evaluate_floats(args, f)
    })
    .udf()
}

type FloatResult = std::result::Result<f64, (SqlState, &'static str)>;

fn logarithm(x: f64) -> FloatResult {
    if x == 0.0 {
        Err((
            SqlState::INVALID_ARGUMENT_FOR_LOGARITHM,
            "cannot take logarithm of zero",
        ))
    } else if x < 0.0 {
        Err((
            SqlState::INVALID_ARGUMENT_FOR_LOGARITHM,
            "cannot take logarithm of a negative number",
        ))
    } else {
        Ok(x)
    }
}

fn power(v: &[f64]) -> FloatResult {
    let (a, b) = (v[0], v[1]);
    if a == 0.0 && b < 0.0 {
        return Err((
            SqlState::INVALID_ARGUMENT_FOR_POWER_FUNCTION,
            "zero raised to a negative power is undefined",
        ));
    }
    if a < 0.0 && b.fract() != 0.0 && b.is_finite() {
        return Err((
            SqlState::INVALID_ARGUMENT_FOR_POWER_FUNCTION,
            "a negative number raised to a non-integer power yields a complex result",
        ));
    }
    Ok(a.powf(b))
}

fn float_functions() -> Vec<ScalarUDF> {
    vec![
        float_function("sqrt", 1, |v| {
            if v[0] < 0.0 {
                Err((
                    SqlState::INVALID_ARGUMENT_FOR_POWER_FUNCTION,
                    "cannot take square root of a negative number",
                ))
            } else {
                Ok(v[0].sqrt())
            }
        }),
        float_function("cbrt", 1, |v| Ok(v[0].cbrt())),
        float_function("exp", 1, |v| Ok(v[0].exp())),
        float_function("ln", 1, |v| logarithm(v[0]).map(f64::ln)),
        float_function("log10", 1, |v| logarithm(v[0]).map(f64::log10)),
        // log(x) is log10; log(b, x) the logarithm of x to base b.
        PgFunction::new(
            "log",
            Signature::one_of(
                vec![
                    datafusion::logical_expr::TypeSignature::Uniform(1, vec![DataType::Float64]),
                    datafusion::logical_expr::TypeSignature::Uniform(2, vec![DataType::Float64]),
                ],
                IMMUTABLE,
            ),
            DataType::Float64,
            |args| {
                if args.args.len() == 1 {
                    return evaluate_floats(args, |v| logarithm(v[0]).map(f64::log10));
                }
                evaluate_floats(args, |v| {
                    let (base, x) = (logarithm(v[0])?, logarithm(v[1])?);
                    if base == 1.0 {
                        Err((SqlState::DIVISION_BY_ZERO, "division by zero"))
                    } else {
                        Ok(x.ln() / base.ln())
                    }
                })
            },
        )
        .udf(),
        float_function("power", 2, power).with_aliases(["pow"]),
    ]
}

/// `to_hex` of an integer's two's complement in its own width (`to_hex(-1)` is `ffffffff`).
fn to_hex(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let input = &arrays(args)?[0];
    let wide = arrow::compute::cast(input, &DataType::Int64)?;
    let narrow = input.data_type() != &DataType::Int64;
    let out: arrow::array::StringArray = wide
        .as_primitive::<Int64Type>()
        .iter()
        .map(|v| {
            v.map(|v| {
                if narrow {
                    format!("{:x}", v as i32 as u32)
                } else {
                    format!("{:x}", v as u64)
                }
            })
        })
        .collect();
    Ok(ColumnarValue::Array(Arc::new(out)))
}

/// `factorial(n)` as a numeric (33! is the largest that fits 38 digits).
fn factorial(args: &ScalarFunctionArgs) -> Result<ColumnarValue> {
    let input = arrow::compute::cast(&arrays(args)?[0], &DataType::Int64)?;
    let mut b = Decimal128Builder::with_capacity(input.len()).with_precision_and_scale(38, 0)?;
    for v in input.as_primitive::<Int64Type>().iter() {
        match v {
            None => b.append_null(),
            Some(n) if n < 0 => {
                return Err(error(
                    SqlState::INVALID_PARAMETER_VALUE,
                    "factorial of a negative number is undefined",
                ));
            }
            Some(n) => b.append_value(
                (1..=n as i128)
                    .try_fold(1i128, |acc, k| {
                        acc.checked_mul(k).filter(|v| decimal::fits(*v, 38))
                    })
                    .ok_or_else(overflow)?,
            ),
        }
    }
    Ok(ColumnarValue::Array(Arc::new(b.finish())))
}

fn gcd_i128(mut a: i128, mut b: i128) -> i128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.abs()
}

/// `gcd` and `lcm` of integers, in the arguments' common integer type.
fn gcd_lcm(name: &'static str, lcm: bool) -> ScalarUDF {
    let coerce = move |types: &[DataType]| -> Result<Vec<DataType>> {
        let t = if types.iter().any(|t| t == &DataType::Int64) {
            DataType::Int64
        } else {
            DataType::Int32
        };
        if types.iter().all(|t| t.is_integer() || t == &DataType::Null) {
            Ok(vec![t.clone(), t])
        } else {
            Err(no_such_function(if lcm { "lcm" } else { "gcd" }, types))
        }
    };
    PgFunction::with_return(
        name,
        Signature::user_defined(IMMUTABLE),
        first_argument_type,
        move |args| {
            let a = arrays(args)?;
            let t = a[0].data_type().clone();
            let (x, y) = (
                arrow::compute::cast(&a[0], &DataType::Int64)?,
                arrow::compute::cast(&a[1], &DataType::Int64)?,
            );
            let (lo, hi) = if t == DataType::Int32 {
                (i128::from(i32::MIN), i128::from(i32::MAX))
            } else {
                (i128::from(i64::MIN), i128::from(i64::MAX))
            };
            let mut out = Vec::with_capacity(x.len());
            for (l, r) in x
                .as_primitive::<Int64Type>()
                .iter()
                .zip(y.as_primitive::<Int64Type>().iter())
            {
                out.push(match (l, r) {
                    (Some(l), Some(r)) => {
                        let g = gcd_i128(i128::from(l), i128::from(r));
                        let v = if !lcm {
                            g
                        } else if g == 0 {
                            0
                        } else {
                            (i128::from(l) / g * i128::from(r)).abs()
                        };
                        if v < lo || v > hi {
                            return Err(error(
                                SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
                                if t == DataType::Int32 {
                                    "integer out of range"
                                } else {
                                    "bigint out of range"
                                },
                            ));
                        }
                        Some(v as i64)
                    }
                    _ => None,
                });
            }
            let out: ArrayRef = Arc::new(arrow::array::Int64Array::from(out));
            Ok(ColumnarValue::Array(arrow::compute::cast(&out, &t)?))
        },
    )
    .coerce(coerce)
    .udf()
}

pub fn functions() -> Vec<ScalarUDF> {
    let sign_type = |args: &ReturnFieldArgs<'_>| {
        let t = args.arg_fields[0].data_type();
        Ok(Field::new(
            "",
            if matches!(t, DataType::Decimal128(..)) {
                DataType::Decimal128(1, 0)
            } else {
                DataType::Float64
            },
            true,
        ))
    };
    vec![
        rounding(Rounding::Round),
        rounding(Rounding::Trunc),
        rounding(Rounding::Ceil),
        rounding(Rounding::Floor),
        PgFunction::with_return("sign", Signature::any(1, IMMUTABLE), sign_type, sign).udf(),
        PgFunction::with_return(
            "mod",
            Signature::user_defined(IMMUTABLE),
            first_argument_type,
            modulo,
        )
        .coerce(common)
        .udf(),
        PgFunction::new(
            "div",
            Signature::user_defined(IMMUTABLE),
            DataType::Decimal128(38, 0),
            div,
        )
        .coerce(common)
        .udf(),
        PgFunction::new(
            "to_hex",
            Signature::uniform(1, vec![DataType::Int32, DataType::Int64], IMMUTABLE),
            DataType::Utf8,
            to_hex,
        )
        .udf(),
        PgFunction::new(
            "factorial",
            Signature::exact(vec![DataType::Int64], IMMUTABLE),
            DataType::Decimal128(38, 0),
            factorial,
        )
        .udf(),
        gcd_lcm("gcd", false),
        gcd_lcm("lcm", true),
    ]
    .into_iter()
    .chain(float_functions())
    .collect()
}
