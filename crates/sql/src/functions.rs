//! PostgreSQL's session functions that drivers and tools call on connect.

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::common::ScalarValue;
use datafusion::logical_expr::{ColumnarValue, ScalarUDF, Volatility, create_udf};
use datafusion::prelude::SessionContext;

use crate::planner::SessionInfo;

fn constant_text(name: &str, value: String) -> ScalarUDF {
    let value = Arc::new(value);
    create_udf(
        name,
        vec![],
        DataType::Utf8,
        Volatility::Stable,
        Arc::new(move |_args: &[ColumnarValue]| {
            Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
                value.as_ref().clone(),
            ))))
        }),
    )
}

/// A constant of PostgreSQL's `name` type (`current_user`, `current_database()`): text in
/// Arrow, OID 19 on the wire.
fn constant_name(name: &str, value: String) -> ScalarUDF {
    use crate::pg::udf::{PgFunction, pg_field};
    let value = Arc::new(value);
    PgFunction::with_return(
        name,
        datafusion::logical_expr::Signature::exact(vec![], Volatility::Stable),
        |_| Ok(pg_field("", DataType::Utf8, "name")),
        move |_| {
            Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
                value.as_ref().clone(),
            ))))
        },
    )
    .udf()
}

/// Registers `version()`, `current_database()`, `current_schema()`, `current_user()`,
/// `session_user()` and `pg_backend_pid()` with this session's values.
pub fn register(ctx: &SessionContext, info: &SessionInfo) {
    ctx.register_udf(constant_text("version", info.version.clone()));
    ctx.register_udf(constant_name("current_database", info.database.clone()));
    ctx.register_udf(constant_name("current_catalog", info.database.clone()));
    ctx.register_udf(constant_name("current_schema", "public".to_owned()));
    ctx.register_udf(constant_name("current_user", info.user.clone()));
    ctx.register_udf(constant_name("session_user", info.user.clone()));
    let pid = info.backend_pid;
    ctx.register_udf(create_udf(
        "pg_backend_pid",
        vec![],
        DataType::Int32,
        Volatility::Stable,
        Arc::new(move |_args: &[ColumnarValue]| {
            Ok(ColumnarValue::Scalar(ScalarValue::Int32(Some(pid))))
        }),
    ));
}
