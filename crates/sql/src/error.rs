//! DataFusion errors, translated into SQLSTATEs a PostgreSQL client understands.

use datafusion::arrow::error::ArrowError;
use datafusion::common::SchemaError;
use datafusion::error::DataFusionError;
use eddy_common::{Error, SqlState};

/// Classifies a DataFusion error. Messages lose DataFusion's "Error during planning:" style
/// prefixes; internal errors keep saying they are bugs.
pub fn from_datafusion(err: DataFusionError) -> Error {
    match err {
        DataFusionError::Context(_, inner) | DataFusionError::Diagnostic(_, inner) => {
            from_datafusion(*inner)
        }
        DataFusionError::Shared(inner) => from_datafusion(clone_shared(&inner)),
        DataFusionError::Collection(mut errors) if !errors.is_empty() => {
            from_datafusion(errors.remove(0))
        }
        DataFusionError::SQL(e, _) => Error::syntax(format!("syntax error: {e}")),
        DataFusionError::NotImplemented(m) => Error::unsupported(format!("not supported: {m}")),
        DataFusionError::SchemaError(e, _) => schema_error(&e),
        DataFusionError::ArrowError(e, _) => arrow_error(&e),
        DataFusionError::Plan(m) => plan_error(m),
        DataFusionError::Execution(m) => execution_error(m),
        DataFusionError::ResourcesExhausted(m) => Error::new(SqlState::OUT_OF_MEMORY, m),
        DataFusionError::Configuration(m) => Error::invalid_parameter(m),
        DataFusionError::External(e) => match e.downcast::<Error>() {
            Ok(ours) => *ours,
            Err(other) => execution_error(other.to_string()),
        },
        DataFusionError::Internal(m) => Error::internal(m),
        other => Error::internal(other.to_string()),
    }
}

fn clone_shared(err: &DataFusionError) -> DataFusionError {
    match err {
        DataFusionError::Plan(m) => DataFusionError::Plan(m.clone()),
        DataFusionError::Execution(m) => DataFusionError::Execution(m.clone()),
        DataFusionError::NotImplemented(m) => DataFusionError::NotImplemented(m.clone()),
        other => DataFusionError::Execution(other.to_string()),
    }
}

fn schema_error(err: &SchemaError) -> Error {
    let message = strip(&err.to_string());
    match err {
        SchemaError::FieldNotFound { field, .. } => Error::new(
            SqlState::UNDEFINED_COLUMN,
            format!("column \"{}\" does not exist", field.name),
        ),
        SchemaError::AmbiguousReference { field } => Error::new(
            SqlState::AMBIGUOUS_COLUMN,
            format!("column reference \"{}\" is ambiguous", field.name),
        ),
        SchemaError::DuplicateQualifiedField { .. }
        | SchemaError::DuplicateUnqualifiedField { .. } => {
            Error::new(SqlState::DUPLICATE_COLUMN, message)
        }
    }
}

fn arrow_error(err: &ArrowError) -> Error {
    match err {
        ArrowError::DivideByZero => Error::new(SqlState::DIVISION_BY_ZERO, "division by zero"),
        ArrowError::CastError(m)
            if m.contains("Can't cast value")
                || m.contains("overflow")
                || m.contains("out of range") =>
        {
            Error::new(SqlState::NUMERIC_VALUE_OUT_OF_RANGE, strip(m))
        }
        ArrowError::CastError(m) | ArrowError::ParseError(m) => {
            Error::new(SqlState::INVALID_TEXT_REPRESENTATION, strip(m))
        }
        ArrowError::ArithmeticOverflow(m) => {
            Error::new(SqlState::NUMERIC_VALUE_OUT_OF_RANGE, strip(m))
        }
        ArrowError::ComputeError(m) if m.to_lowercase().contains("overflow") => {
            Error::new(SqlState::NUMERIC_VALUE_OUT_OF_RANGE, strip(m))
        }
        ArrowError::ExternalError(e) => execution_error(e.to_string()),
        other => Error::new(SqlState::DATA_EXCEPTION, strip(&other.to_string())),
    }
}

fn plan_error(message: String) -> Error {
    let m = strip(&message);
    let lower = m.to_lowercase();
    if lower.starts_with("table '") && lower.contains("' not found") {
        let name = m
            .split('\'')
            .nth(1)
            .unwrap_or("")
            .rsplit('.')
            .next()
            .unwrap_or("")
            .to_owned();
        return Error::new(
            SqlState::UNDEFINED_TABLE,
            format!("relation \"{name}\" does not exist"),
        );
    }
    // No function or operator takes these argument types: PostgreSQL's "function f(integer)
    // does not exist" and "operator does not exist: date + date" (42883).
    if lower.contains("invalid function")
        || lower.contains("function") && lower.contains("not found")
        || lower.contains("no function matches the given name")
        || lower.contains("failed to coerce arguments to satisfy a call")
        || lower.contains("cannot coerce arithmetic expression")
        || lower.contains("unary operator") && lower.contains("only supports")
    {
        // DataFusion's "Invalid function 'f'. Did you mean 'g'?" names no argument types.
        let message = match m
            .strip_prefix("Invalid function '")
            .and_then(|rest| rest.split_once('\''))
        {
            Some((name, _)) => format!("function {name} does not exist"),
            None => m.to_owned(),
        };
        return Error::new(SqlState::UNDEFINED_FUNCTION, message).with_hint("No function matches the given name and argument types. You might need to add explicit type casts.");
    }
    if lower.contains("no field named") {
        return Error::new(SqlState::UNDEFINED_COLUMN, m);
    }
    if lower.contains("coerc")
        || lower.contains("type mismatch")
        || lower.contains("cannot infer common")
        || lower.contains("does not support")
        || lower.contains("failed to coerce")
        || lower.contains("inserting query schema mismatch")
        || lower.contains("expected a boolean")
        || lower.contains("non-boolean predicate")
    {
        return Error::new(SqlState::DATATYPE_MISMATCH, m);
    }
    if lower.contains("must appear in the group by")
        || lower.contains("projection references non-aggregate")
    {
        return Error::new(SqlState::GROUPING_ERROR, m);
    }
    if lower.contains("not supported") || lower.contains("unsupported") {
        return Error::unsupported(m);
    }
    Error::new(SqlState::SYNTAX_ERROR, m)
}

fn execution_error(message: String) -> Error {
    let m = strip(&message);
    let lower = m.to_lowercase();
    if lower.contains("divide by zero") || lower.contains("division by zero") {
        return Error::new(SqlState::DIVISION_BY_ZERO, "division by zero");
    }
    if lower.contains("overflow") || lower.contains("can't cast value") {
        return Error::new(SqlState::NUMERIC_VALUE_OUT_OF_RANGE, m);
    }
    if lower.contains("cast error")
        || lower.contains("cannot cast")
        || lower.contains("parse error")
        || lower.contains("invalid")
            && (lower.contains("timestamp") || lower.contains("date") || lower.contains("number"))
    {
        return Error::new(SqlState::INVALID_TEXT_REPRESENTATION, m);
    }
    Error::new(SqlState::DATA_EXCEPTION, m)
}

/// Drops DataFusion's layered prefixes ("Error during planning: ", "Arrow error: ", ...).
fn strip(message: &str) -> String {
    const PREFIXES: [&str; 8] = [
        "Error during planning: ",
        "Execution error: ",
        "Arrow error: ",
        "Cast error: ",
        "Parser error: ",
        "Invalid argument error: ",
        "Compute error: ",
        "Schema error: ",
    ];
    let mut m = message.trim();
    loop {
        let before = m;
        for prefix in PREFIXES {
            m = m.strip_prefix(prefix).unwrap_or(m);
        }
        if m == before {
            return m.to_owned();
        }
    }
}
