//! A scalar function made of closures, so each PostgreSQL function is its signature, its
//! result type and its body, without a struct and a trait impl apiece.
//!
//! Errors a function raises are Eddy [`Error`]s (with their SQLSTATE) wrapped in
//! `DataFusionError::External`; `crate::error::from_datafusion` unwraps them unchanged.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use eddy_common::{Error, SqlState};

use crate::types::PG_TYPE_KEY;

pub type Result<T> = datafusion::common::Result<T>;

type ReturnFn = dyn Fn(&ReturnFieldArgs<'_>) -> Result<Field> + Send + Sync;
type InvokeFn = dyn Fn(&ScalarFunctionArgs) -> Result<ColumnarValue> + Send + Sync;
type CoerceFn = dyn Fn(&[DataType]) -> Result<Vec<DataType>> + Send + Sync;
type NameFn = dyn Fn(&[datafusion::logical_expr::Expr]) -> String + Send + Sync;

/// An error with a SQLSTATE, as a function raises it.
pub fn error(state: SqlState, message: impl Into<String>) -> DataFusionError {
    DataFusionError::External(Box::new(Error::new(state, message)))
}

/// `function f(types) does not exist` (42883), as PostgreSQL reports a call no overload fits.
pub fn no_such_function(name: &str, types: &[DataType]) -> DataFusionError {
    let types: Vec<String> = types
        .iter()
        .map(|t| crate::types::pg_type_name(&Field::new("", t.clone(), true)))
        .collect();
    error(
        SqlState::UNDEFINED_FUNCTION,
        format!("function {name}({}) does not exist", types.join(", ")),
    )
}

/// A field of `data_type` that remembers the PostgreSQL type it stands for.
pub fn pg_field(name: &str, data_type: DataType, pg_type: &str) -> Field {
    Field::new(name, data_type, true)
        .with_metadata([(PG_TYPE_KEY.to_owned(), pg_type.to_owned())].into())
}

pub struct PgFunction {
    name: String,
    aliases: Vec<String>,
    signature: Signature,
    return_field: Box<ReturnFn>,
    invoke: Box<InvokeFn>,
    coerce: Option<Box<CoerceFn>>,
    schema_name: Option<Box<NameFn>>,
}

impl PgFunction {
    /// A function whose result type is fixed.
    pub fn new(
        name: &str,
        signature: Signature,
        return_type: DataType,
        invoke: impl Fn(&ScalarFunctionArgs) -> Result<ColumnarValue> + Send + Sync + 'static,
    ) -> Self {
        let returns = move |_: &ReturnFieldArgs<'_>| Ok(Field::new("", return_type.clone(), true));
        PgFunction::with_return(name, signature, returns, invoke)
    }

    /// A function whose result field depends on its arguments' fields or constant values.
    pub fn with_return(
        name: &str,
        signature: Signature,
        return_field: impl Fn(&ReturnFieldArgs<'_>) -> Result<Field> + Send + Sync + 'static,
        invoke: impl Fn(&ScalarFunctionArgs) -> Result<ColumnarValue> + Send + Sync + 'static,
    ) -> Self {
        PgFunction {
            name: name.to_owned(),
            aliases: Vec::new(),
            signature,
            return_field: Box::new(return_field),
            invoke: Box::new(invoke),
            coerce: None,
            schema_name: None,
        }
    }

    /// The column name a call gets. Functions that stand in for an operator or a cast are
    /// named as it is (`a + b`, `x`), so a plan's names do not change when they replace it.
    pub fn named(
        mut self,
        name: impl Fn(&[datafusion::logical_expr::Expr]) -> String + Send + Sync + 'static,
    ) -> Self {
        self.schema_name = Some(Box::new(name));
        self
    }

    /// Argument coercion for a `Signature::user_defined` function.
    pub fn coerce(
        mut self,
        coerce: impl Fn(&[DataType]) -> Result<Vec<DataType>> + Send + Sync + 'static,
    ) -> Self {
        self.coerce = Some(Box::new(coerce));
        self
    }

    pub fn alias(mut self, alias: &str) -> Self {
        self.aliases.push(alias.to_owned());
        self
    }

    pub fn udf(self) -> ScalarUDF {
        ScalarUDF::new_from_impl(self)
    }
}

impl fmt::Debug for PgFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgFunction({})", self.name)
    }
}

// Two functions are the same when they have the same name: each name is registered once.
impl PartialEq for PgFunction {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for PgFunction {}

impl Hash for PgFunction {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl ScalarUDFImpl for PgFunction {
    fn name(&self) -> &str {
        &self.name
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Err(DataFusionError::Internal(format!(
            "{}: return_field_from_args is used instead",
            self.name
        )))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs<'_>) -> Result<FieldRef> {
        let field = (self.return_field)(&args)?;
        Ok(Arc::new(field.with_name(self.name.clone())))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        (self.invoke)(&args)
    }

    fn schema_name(&self, args: &[datafusion::logical_expr::Expr]) -> Result<String> {
        match &self.schema_name {
            Some(name) => Ok(name(args)),
            None => {
                let args: Vec<String> = args.iter().map(|a| a.schema_name().to_string()).collect();
                Ok(format!("{}({})", self.name, args.join(",")))
            }
        }
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match &self.coerce {
            Some(coerce) => coerce(arg_types),
            None => Ok(arg_types.to_vec()),
        }
    }
}

/// Names a call `left op right`, as DataFusion names the operator it replaces.
pub fn operator_name(
    op: &'static str,
) -> impl Fn(&[datafusion::logical_expr::Expr]) -> String + Send + Sync + 'static {
    move |args| match args {
        [l, r] => format!("{} {op} {}", l.schema_name(), r.schema_name()),
        [x] => format!("({op} {})", x.schema_name()),
        _ => op.to_owned(),
    }
}

/// The result field of a function whose result has its first argument's type (`a + b`).
pub fn first_argument_type(args: &ReturnFieldArgs<'_>) -> Result<Field> {
    Ok(Field::new("", args.arg_fields[0].data_type().clone(), true))
}

/// Names a call after its first argument, as DataFusion names a cast.
pub fn first_argument_name(args: &[datafusion::logical_expr::Expr]) -> String {
    args.first()
        .map(|a| a.schema_name().to_string())
        .unwrap_or_default()
}

/// The arguments as arrays of the call's row count.
pub fn arrays(args: &ScalarFunctionArgs) -> Result<Vec<ArrayRef>> {
    args.args
        .iter()
        .map(|a| a.to_array(args.number_rows))
        .collect()
}

/// A constant argument's value, if the call gave a literal there.
pub fn constant<'a>(args: &ReturnFieldArgs<'a>, i: usize) -> Option<&'a ScalarValue> {
    args.scalar_arguments.get(i).copied().flatten()
}

/// A constant text argument (`'month'` in `date_trunc('month', ts)`).
pub fn constant_text(args: &ReturnFieldArgs<'_>, i: usize) -> Option<String> {
    match constant(args, i)? {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Some(s.clone()),
        _ => None,
    }
}

pub const IMMUTABLE: Volatility = Volatility::Immutable;
