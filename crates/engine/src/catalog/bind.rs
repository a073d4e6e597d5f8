//! Binding CREATE TABLE / CREATE SOURCE column lists and options to a [`TableDef`]: types,
//! defaults, primary keys, watermarks and `WITH (...)` options, each refused with its SQLSTATE.

use super::*;

/// Binds `CREATE TABLE` into a definition, validating everything a user can get wrong.
pub fn bind_create_table(
    create: &CreateTable,
    id: ObjectId,
    name: QualifiedName,
) -> Result<TableDef> {
    let QualifiedName { schema, name } = name;
    let mut columns: Vec<ColumnDef> = Vec::new();
    let mut primary_key: Option<Vec<usize>> = None;
    if create.columns.is_empty() {
        return Err(Error::syntax("a table needs at least one column"));
    }
    if create.columns.len() > eddy_common::limits::TABLE_COLUMNS_MAX {
        return Err(Error::new(
            SqlState::PROGRAM_LIMIT_EXCEEDED,
            "tables can have at most 1600 columns",
        ));
    }
    for (index, column) in create.columns.iter().enumerate() {
        let column_name = normalize_ident(&column.name);
        if columns.iter().any(|c| c.name == column_name) {
            return Err(Error::new(
                SqlState::DUPLICATE_COLUMN,
                format!("column \"{column_name}\" specified more than once"),
            ));
        }
        let column_type = types::column_type(&column.data_type)?;
        let mut nullable = true;
        let mut default = None;
        for option in &column.options {
            match &option.option {
                ColumnOption::Default(expr) => {
                    default = Some(bind_default(expr, &column_type.pg_name)?)
                }
                ColumnOption::NotNull => nullable = false,
                ColumnOption::Null => nullable = true,
                ColumnOption::PrimaryKey(_) => set_primary_key(&mut primary_key, vec![index])?,
                other => {
                    return Err(Error::unsupported(format!(
                        "column option {other} is not supported"
                    )));
                }
            }
        }
        let proctime = create
            .proctime
            .iter()
            .any(|p| normalize_ident(p) == column_name);
        if proctime && !column_type.arrow.to_string().starts_with("Timestamp(") {
            return Err(Error::new(
                SqlState::DATATYPE_MISMATCH,
                format!(
                    "column \"{column_name}\" AS PROCTIME() must be a timestamp or timestamptz, not {}",
                    column_type.pg_name
                ),
            ));
        }
        columns.push(ColumnDef {
            name: column_name,
            pg_type: column_type.pg_name,
            arrow_type: column_type.arrow.to_string(),
            nullable,
            proctime,
            default,
        });
    }
    for constraint in &create.constraints {
        match constraint {
            TableConstraint::PrimaryKey(pk) => {
                let mut indexes = Vec::new();
                for c in &pk.columns {
                    let Expr::Identifier(ident) = &c.column.expr else {
                        return Err(Error::unsupported("PRIMARY KEY takes column names"));
                    };
                    let column_name = normalize_ident(ident);
                    let index = columns
                        .iter()
                        .position(|c| c.name == column_name)
                        .ok_or_else(|| {
                            Error::new(
                                SqlState::UNDEFINED_COLUMN,
                                format!("column \"{column_name}\" named in key does not exist"),
                            )
                        })?;
                    indexes.push(index);
                }
                set_primary_key(&mut primary_key, indexes)?;
            }
            other => {
                return Err(Error::unsupported(format!(
                    "constraint {other} is not supported"
                )));
            }
        }
    }
    let primary_key = primary_key.unwrap_or_default();
    for &i in &primary_key {
        columns[i].nullable = false;
    }
    if create.source
        && create
            .options
            .iter()
            .any(|(k, _)| k == "partitions" || k.starts_with("retention"))
    {
        return Err(Error::invalid_parameter(
            "a source is not stored by Eddy: partitions and retention are the external system's",
        )
        .with_hint("use CREATE TABLE to keep the records in Eddy's log"));
    }
    if create.append_only && !primary_key.is_empty() {
        return Err(Error::new(
            SqlState::INVALID_TABLE_DEFINITION,
            "an APPEND ONLY table cannot have a PRIMARY KEY",
        )
        .with_hint("drop APPEND ONLY for a table whose rows are updated by key"));
    }
    let watermark = match &create.watermark {
        None => None,
        Some((column, expr)) => Some(bind_watermark(&columns, column, expr)?),
    };
    let (options, partitions) = bind_table_options(&create.options)?;
    if !create.append_only && options.iter().any(|(k, _)| k.starts_with("retention")) {
        return Err(Error::invalid_parameter("retention applies to APPEND ONLY tables: a table whose rows change keeps its current rows")
            .with_hint("declare the table APPEND ONLY, or drop the retention option"));
    }
    let mut includes = Vec::new();
    for (what, alias) in &create.includes {
        let include = eddy_connectors::Include::parse(what)?;
        let column_name = alias
            .as_ref()
            .map_or_else(|| include.default_column(), normalize_ident);
        if columns.iter().any(|c| c.name == column_name) {
            return Err(Error::new(
                SqlState::DUPLICATE_COLUMN,
                format!("column \"{column_name}\" specified more than once"),
            ));
        }
        let column_type = types::column_type_named(include.pg_type())?;
        columns.push(ColumnDef {
            name: column_name,
            pg_type: column_type.pg_name,
            arrow_type: column_type.arrow.to_string(),
            nullable: true,
            proctime: false,
            default: None,
        });
        includes.push(include.name().to_owned());
    }
    let connector = options
        .iter()
        .find(|(k, _)| k == "connector")
        .map(|(_, v)| v.clone());
    if connector.is_some() && columns.iter().any(|c| c.default.is_some()) {
        return Err(Error::unsupported(
            "DEFAULT on a table with a connector is not supported: its records carry every column",
        ));
    }
    if !includes.is_empty() && connector.is_none() {
        return Err(Error::new(
            SqlState::INVALID_TABLE_DEFINITION,
            "INCLUDE needs a connector (WITH (connector = ...))",
        ));
    }
    let generated = connector.as_deref() == Some("nexmark");
    if generated && (create.format.is_some() || !includes.is_empty()) {
        return Err(Error::new(
            SqlState::INVALID_TABLE_DEFINITION,
            "the nexmark connector generates rows: it takes no FORMAT and no INCLUDE",
        ));
    }
    let format = match &create.format {
        None if generated => None,
        Some((envelope, encoding)) => {
            let format = eddy_connectors::Format::parse(envelope, encoding)?;
            Some((
                format.envelope_name().to_owned(),
                format.encoding_name().to_owned(),
            ))
        }
        None if connector.is_some() => {
            return Err(Error::new(
                SqlState::INVALID_TABLE_DEFINITION,
                "a table with a connector needs FORMAT ... ENCODE ...",
            ));
        }
        None => None,
    };
    if create.append_only && format.as_ref().is_some_and(|(e, _)| e != "PLAIN") {
        return Err(Error::new(
            SqlState::INVALID_TABLE_DEFINITION,
            "an APPEND ONLY table takes FORMAT PLAIN only (UPSERT and DEBEZIUM update and delete rows)",
        ));
    }
    if create.source && connector.is_none() {
        return Err(Error::new(
            SqlState::INVALID_TABLE_DEFINITION,
            "a source needs a connector (WITH (connector = 'kafka' | 'file', ...))",
        )
        .with_hint(
            "a relation written with INSERT, COPY or HTTP ingest is a table: CREATE TABLE",
        ));
    }
    // A source of plain (or generated) records without a key only ever inserts: a stream.
    let append_only = create.append_only
        || (create.source
            && primary_key.is_empty()
            && (generated || format.as_ref().is_some_and(|(e, _)| e == "PLAIN")));
    let def = TableDef {
        id,
        schema,
        name,
        columns,
        primary_key,
        append_only,
        watermark,
        options,
        partitions,
        format,
        includes,
    };
    // A declared format must be able to decode every column type (plain tables find out at
    // their first HTTP ingest); a generator must know every column.
    if def.format.is_some() {
        def.decoder(&def.schema()?, false)?;
    }
    if let Some(config) = def.nexmark()? {
        eddy_connectors::nexmark::NexmarkGenerator::new(config, def.schema()?, 0)?;
    }
    Ok(def)
}

/// `ALTER TABLE ... ADD COLUMN`: a nullable column after the declared ones (existing rows and
/// log records read it as NULL).
pub fn bind_added_column(def: &TableDef, column: &ast::ColumnDef) -> Result<ColumnDef> {
    let name = normalize_ident(&column.name);
    if def.columns.iter().any(|c| c.name == name) {
        return Err(Error::new(
            SqlState::DUPLICATE_COLUMN,
            format!(
                "column \"{name}\" of relation \"{}\" already exists",
                def.name
            ),
        ));
    }
    if !def.includes.is_empty() {
        return Err(Error::unsupported(
            "ADD COLUMN on a table with INCLUDE columns is not supported",
        ));
    }
    if def.columns.len() >= eddy_common::limits::TABLE_COLUMNS_MAX {
        return Err(Error::new(
            SqlState::PROGRAM_LIMIT_EXCEEDED,
            "tables can have at most 1600 columns",
        ));
    }
    for option in &column.options {
        match &option.option {
            ColumnOption::Null => {}
            other => {
                return Err(Error::unsupported(format!(
                    "ADD COLUMN ... {other} is not supported (an added column is nullable, NULL in existing rows)"
                )));
            }
        }
    }
    let column_type = types::column_type(&column.data_type)?;
    Ok(ColumnDef {
        name,
        pg_type: column_type.pg_name,
        arrow_type: column_type.arrow.to_string(),
        nullable: true,
        proctime: false,
        default: None,
    })
}

/// A column's `DEFAULT` as stored: its SQL text, once checked to be an expression PostgreSQL
/// accepts there (no column reference, no subquery, no aggregate or window function). That it
/// converts to the column's type is checked when the statement plans it
/// (the session evaluates `CAST(default AS type)` at CREATE TABLE).
pub(crate) fn bind_default(expr: &ast::Expr, pg_type: &str) -> Result<String> {
    use ast::{Expr, Visit, Visitor};
    use std::ops::ControlFlow;
    struct Check;
    impl Visitor for Check {
        type Break = Error;
        fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<Error> {
            let refused = match expr {
                Expr::Identifier(i) if i.quote_style.is_some() || !is_keyword_value(&i.value) => {
                    Some("cannot use column reference in DEFAULT expression")
                }
                Expr::CompoundIdentifier(_) => {
                    Some("cannot use column reference in DEFAULT expression")
                }
                Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. } => {
                    Some("cannot use subquery in DEFAULT expression")
                }
                Expr::Function(f) if f.over.is_some() => {
                    Some("window functions are not allowed in DEFAULT expressions")
                }
                _ => None,
            };
            match refused {
                Some(message) => {
                    ControlFlow::Break(Error::new(SqlState::FEATURE_NOT_SUPPORTED, message))
                }
                None => ControlFlow::Continue(()),
            }
        }
    }
    if let ControlFlow::Break(e) = expr.visit(&mut Check) {
        return Err(e);
    }
    // Stored as PostgreSQL prints it back (pg_get_expr, `\d`, information_schema): a string
    // for a string column carries its cast, an operator at the top its parentheses.
    let string_type = match pg_type.split('(').next().unwrap_or(pg_type) {
        "text" => Some("text"),
        "character varying" => Some("character varying"),
        "character" => Some("bpchar"),
        _ => None,
    };
    Ok(match (expr, string_type) {
        (Expr::Value(v), Some(t)) if matches!(v.value, ast::Value::SingleQuotedString(_)) => {
            format!("{expr}::{t}")
        }
        (Expr::BinaryOp { .. }, _) => format!("({expr})"),
        _ => expr.to_string(),
    })
}

/// Keywords sqlparser reads as identifiers that are values in PostgreSQL (`CURRENT_TIMESTAMP`
/// and the like are functions there).
pub(super) fn is_keyword_value(word: &str) -> bool {
    [
        "current_timestamp",
        "current_date",
        "current_time",
        "localtimestamp",
        "localtime",
        "current_user",
        "session_user",
        "user",
        "current_role",
        "current_catalog",
        "current_schema",
    ]
    .iter()
    .any(|k| word.eq_ignore_ascii_case(k))
}

pub(super) fn set_primary_key(slot: &mut Option<Vec<usize>>, columns: Vec<usize>) -> Result<()> {
    if slot.is_some() {
        return Err(Error::new(
            SqlState::INVALID_TABLE_DEFINITION,
            "multiple primary keys for table are not allowed",
        ));
    }
    let mut seen = columns.clone();
    seen.sort();
    seen.dedup();
    if seen.len() != columns.len() {
        return Err(Error::new(
            SqlState::DUPLICATE_COLUMN,
            "a column appears twice in the primary key",
        ));
    }
    *slot = Some(columns);
    Ok(())
}

/// `WATERMARK FOR ts AS ts` or `ts - INTERVAL '...'` over a timestamp column.
pub(super) fn bind_watermark(
    columns: &[ColumnDef],
    column: &ast::Ident,
    expr: &Expr,
) -> Result<WatermarkDef> {
    let column_name = normalize_ident(column);
    let def = columns
        .iter()
        .find(|c| c.name == column_name)
        .ok_or_else(|| {
            Error::new(
                SqlState::UNDEFINED_COLUMN,
                format!("column \"{column_name}\" named in WATERMARK FOR does not exist"),
            )
        })?;
    if !def.arrow_type.starts_with("Timestamp(") {
        return Err(Error::new(
            SqlState::DATATYPE_MISMATCH,
            format!(
                "WATERMARK FOR needs a timestamp column, but \"{column_name}\" is {}",
                def.pg_type
            ),
        ));
    }
    let refers_to_column =
        |e: &Expr| matches!(e, Expr::Identifier(i) if normalize_ident(i) == column_name);
    let valid = match expr {
        e if refers_to_column(e) => true,
        Expr::BinaryOp {
            left,
            op: ast::BinaryOperator::Minus,
            right,
        } => refers_to_column(left) && matches!(right.as_ref(), Expr::Interval(_)),
        _ => false,
    };
    if !valid {
        return Err(Error::unsupported(format!(
            "WATERMARK FOR {column_name} AS {expr}: the watermark must be `{column_name}` or `{column_name} - INTERVAL '...'`"
        )));
    }
    Ok(WatermarkDef {
        column: column_name,
        expr: expr.to_string(),
    })
}

pub(super) fn bind_table_options(
    options: &[(String, String)],
) -> Result<(Vec<(String, String)>, u32)> {
    let mut partitions = 1;
    let mut kept = Vec::new();
    for (key, value) in options {
        match key.as_str() {
            "partitions" => {
                partitions = value.parse::<u32>().ok().filter(|p| (1..=PARTITIONS_MAX).contains(p)).ok_or_else(|| {
                    Error::invalid_parameter(format!("partitions must be an integer from 1 to {PARTITIONS_MAX}, not '{value}'"))
                })?;
            }
            "idle_timeout" => {
                eddy_sql::windows::duration_micros(value)?;
            }
            "retention" => {
                eddy_sql::windows::duration_micros(value)?;
            }
            "retention.bytes" => {
                value.parse::<u64>().map_err(|_| {
                    Error::invalid_parameter(format!(
                        "retention.bytes must be a whole number of bytes, not '{value}'"
                    ))
                })?;
            }
            "connector" => match value.as_str() {
                "file" | "kafka" | "nexmark" => {}
                other => {
                    return Err(Error::unsupported(format!(
                        "connector '{other}' is not supported (file, kafka or nexmark)"
                    )));
                }
            },
            "nexmark.table.type" => {
                eddy_connectors::nexmark::EventKind::parse(value)?;
            }
            "nexmark.event.num"
            | "nexmark.events.per.second"
            | "nexmark.seed"
            | "nexmark.base.time.millis" => {
                value.parse::<u64>().map_err(|_| {
                    Error::invalid_parameter(format!("{key} must be a whole number, not '{value}'"))
                })?;
            }
            "nexmark.rate.limited" => {
                if !["true", "false"].contains(&value.as_str()) {
                    return Err(Error::invalid_parameter(format!(
                        "nexmark.rate.limited must be 'true' or 'false', not '{value}'"
                    )));
                }
            }
            "nexmark.split.num" => {
                value.parse::<u32>().ok().filter(|n| (1..=PARTITIONS_MAX).contains(n)).ok_or_else(|| {
                    Error::invalid_parameter(format!("nexmark.split.num must be an integer from 1 to {PARTITIONS_MAX}, not '{value}'"))
                })?;
            }
            "on_error" => {
                if !["dead_letter", "skip", "fail"].contains(&value.as_str()) {
                    return Err(Error::invalid_parameter(format!(
                        "on_error must be 'dead_letter', 'skip' or 'fail', not '{value}'"
                    )));
                }
            }
            "path" | "topic" | "properties.bootstrap.server" | "scan.startup.timestamp.millis" => {}
            "scan.startup.mode" => {
                if !["earliest", "latest", "timestamp"].contains(&value.as_str()) {
                    return Err(Error::invalid_parameter(format!(
                        "scan.startup.mode must be 'earliest', 'latest' or 'timestamp', not '{value}'"
                    )));
                }
            }
            other => {
                return Err(Error::invalid_parameter(format!(
                    "unrecognized table option \"{other}\""
                )));
            }
        }
        kept.push((key.clone(), value.clone()));
    }
    let has = |key: &str| kept.iter().any(|(k, _)| k == key);
    match kept
        .iter()
        .find(|(k, _)| k == "connector")
        .map(|(_, v)| v.as_str())
    {
        Some("file") if !has("path") => {
            return Err(Error::invalid_parameter(
                "connector 'file' needs path = '...'",
            ));
        }
        Some("nexmark") if !has("nexmark.table.type") => {
            return Err(Error::invalid_parameter(
                "connector 'nexmark' needs nexmark.table.type = 'person' | 'auction' | 'bid'",
            ));
        }
        Some("kafka") if !has("topic") || !has("properties.bootstrap.server") => {
            return Err(Error::invalid_parameter(
                "connector 'kafka' needs topic = '...' and properties.bootstrap.server = '...'",
            ));
        }
        _ => {}
    }
    if kept
        .iter()
        .any(|(k, v)| k == "scan.startup.mode" && v == "timestamp")
        && !has("scan.startup.timestamp.millis")
    {
        return Err(Error::invalid_parameter(
            "scan.startup.mode = 'timestamp' needs scan.startup.timestamp.millis",
        ));
    }
    Ok((kept, partitions))
}
