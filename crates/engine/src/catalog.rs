//! Catalog definitions (what the metadata store keeps per object) and `CREATE TABLE` binding.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use eddy_common::limits::PARTITIONS_MAX;
use eddy_common::{Error, ObjectId, Result, SqlState};
use eddy_sql::ast::{self, ColumnOption, Expr, TableConstraint};
pub use eddy_sql::normalize_ident;
use eddy_sql::types::{self, PG_TYPE_KEY};
use eddy_sql::{CreateTable, QualifiedName};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ColumnDef {
    pub name: String,
    /// The declared PostgreSQL type, as PostgreSQL prints it.
    pub pg_type: String,
    /// The Arrow type, in arrow's `DataType` text form.
    pub arrow_type: String,
    pub nullable: bool,
    /// Declared `AS PROCTIME()`: set to the time the row is written.
    #[serde(default)]
    pub proctime: bool,
    /// The `DEFAULT` expression, as SQL text (an INSERT that leaves the column out, or writes
    /// `DEFAULT`, takes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatermarkDef {
    pub column: String,
    /// The watermark expression as written (e.g. `ts - INTERVAL '5 seconds'`).
    pub expr: String,
}

/// The schema of an object stored before schemas existed.
pub(crate) fn public_schema() -> String {
    eddy_sql::PUBLIC_SCHEMA.to_owned()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableDef {
    pub id: ObjectId,
    /// The schema it is in (older catalogs: `public`).
    #[serde(default = "public_schema")]
    pub schema: String,
    pub name: String,
    pub columns: Vec<ColumnDef>,
    /// Indexes into `columns`.
    pub primary_key: Vec<usize>,
    pub append_only: bool,
    pub watermark: Option<WatermarkDef>,
    pub options: Vec<(String, String)>,
    pub partitions: u32,
    /// `FORMAT envelope ENCODE encoding` (as `PLAIN`, `JSON`): how a connector's records and
    /// HTTP ingest bodies are decoded. `None`: plain JSON (or CSV by content type).
    #[serde(default)]
    pub format: Option<(String, String)>,
    /// `INCLUDE` metadata, in order: the last `includes.len()` columns carry them.
    #[serde(default)]
    pub includes: Vec<String>,
}

/// A materialized view: its query text is planned again on start-up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ViewDef {
    pub id: ObjectId,
    /// The schema it is in (older catalogs: `public`).
    #[serde(default = "public_schema")]
    pub schema: String,
    pub name: String,
    /// The `CREATE MATERIALIZED VIEW` statement as written.
    pub sql: String,
    /// Tables and views it reads.
    pub dependencies: Vec<ObjectId>,
}

impl ViewDef {
    pub fn qualified(&self) -> QualifiedName {
        QualifiedName::new(self.schema.clone(), self.name.clone())
    }
}

/// A source: a table definition whose records stay in the external system (no log).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SourceDef {
    pub table: TableDef,
    /// Where each source partition starts, resolved at `CREATE SOURCE` for
    /// `scan.startup.mode = 'latest' | 'timestamp'` (partitions not named start at the earliest
    /// record), so that a view reads the same records whenever it is built.
    pub start: Vec<(u32, u64)>,
}

/// What the metadata store holds for one object.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ObjectDef {
    Table(TableDef),
    MaterializedView(ViewDef),
    Source(SourceDef),
    Sink(crate::sink::SinkDef),
    /// A plain view (`CREATE VIEW`).
    View(crate::plain_views::PlainViewDef),
    /// A schema made with `CREATE SCHEMA` (`public` and `eddy_catalog` are not stored).
    Schema(crate::schemas::SchemaDef),
}

impl ObjectDef {
    /// The id the definition names.
    pub fn id(&self) -> ObjectId {
        match self {
            ObjectDef::Table(d) => d.id,
            ObjectDef::MaterializedView(d) => d.id,
            ObjectDef::Source(d) => d.table.id,
            ObjectDef::Sink(d) => d.id,
            ObjectDef::View(d) => d.id,
            ObjectDef::Schema(d) => d.id,
        }
    }

    pub fn encode(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self)
            .map_err(|e| Error::internal(format!("encoding a catalog entry: {e}")))
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|e| {
            Error::new(
                SqlState::DATA_CORRUPTED,
                format!("unreadable catalog entry: {e}"),
            )
        })
    }
}

impl TableDef {
    pub fn qualified(&self) -> QualifiedName {
        QualifiedName::new(self.schema.clone(), self.name.clone())
    }

    /// The position of column `column`; 42703 naming the table when it has none.
    pub fn column_index(&self, column: &str) -> Result<usize> {
        self.columns
            .iter()
            .position(|c| c.name == column)
            .ok_or_else(|| undefined_column(column, &self.name))
    }

    /// The Arrow schema; field metadata carries the declared PostgreSQL types.
    pub fn schema(&self) -> Result<SchemaRef> {
        let fields = self
            .columns
            .iter()
            .map(|c| {
                let data_type = DataType::from_str(&c.arrow_type).map_err(|e| {
                    Error::new(
                        SqlState::DATA_CORRUPTED,
                        format!("column {} has unreadable type: {e}", c.name),
                    )
                })?;
                let mut metadata = HashMap::from([(PG_TYPE_KEY.to_owned(), c.pg_type.clone())]);
                if let Some(default) = &c.default {
                    metadata.insert(types::DEFAULT_KEY.to_owned(), default.clone());
                }
                Ok(Field::new(&c.name, data_type, c.nullable).with_metadata(metadata))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(Schema::new(fields)))
    }

    /// `CREATE TABLE` text equivalent to this definition (SHOW CREATE TABLE).
    pub fn create_sql(&self) -> String {
        self.create_sql_as("TABLE")
    }

    /// `CREATE <kind>` text equivalent to this definition (`TABLE` or `SOURCE`).
    pub fn create_sql_as(&self, kind: &str) -> String {
        let declared = self.columns.len() - self.includes.len();
        let mut parts: Vec<String> = self.columns[..declared]
            .iter()
            .map(|c| {
                let not_null = if c.nullable
                    || self
                        .primary_key
                        .iter()
                        .any(|&i| self.columns[i].name == c.name)
                {
                    ""
                } else {
                    " NOT NULL"
                };
                let proctime = if c.proctime { " AS PROCTIME()" } else { "" };
                let default = c
                    .default
                    .as_ref()
                    .map_or_else(String::new, |d| format!(" DEFAULT {d}"));
                format!(
                    "{} {}{default}{not_null}{proctime}",
                    quote_ident(&c.name),
                    c.pg_type
                )
            })
            .collect();
        if !self.primary_key.is_empty() {
            let names: Vec<String> = self
                .primary_key
                .iter()
                .map(|&i| quote_ident(&self.columns[i].name))
                .collect();
            parts.push(format!("PRIMARY KEY ({})", names.join(", ")));
        }
        if let Some(w) = &self.watermark {
            parts.push(format!(
                "WATERMARK FOR {} AS {}",
                quote_ident(&w.column),
                w.expr
            ));
        }
        let mut sql = format!(
            "CREATE {kind} {} ({})",
            sql_name(&self.qualified()),
            parts.join(", ")
        );
        if self.append_only && kind == "TABLE" {
            sql.push_str(" APPEND ONLY");
        }
        for (what, column) in self.includes.iter().zip(&self.columns[declared..]) {
            sql.push_str(&format!(" INCLUDE {what} AS {}", quote_ident(&column.name)));
        }
        if !self.options.is_empty() {
            let options: Vec<String> = self
                .options
                .iter()
                .map(|(k, v)| format!("{k} = '{}'", v.replace('\'', "''")))
                .collect();
            sql.push_str(&format!(" WITH ({})", options.join(", ")));
        }
        if let Some((envelope, encoding)) = &self.format {
            sql.push_str(&format!(" FORMAT {envelope} ENCODE {encoding}"));
        }
        sql
    }

    /// The option `key`, as given.
    /// `retention` (µs) and `retention.bytes` (per partition), when set.
    pub fn retention(&self) -> Result<(Option<i64>, Option<u64>)> {
        let time = self
            .option("retention")
            .map(eddy_sql::windows::duration_micros)
            .transpose()?;
        let bytes = self
            .option("retention.bytes")
            .map(|b| {
                b.parse::<u64>().map_err(|_| {
                    Error::invalid_parameter(format!("retention.bytes is not a number: {b}"))
                })
            })
            .transpose()?;
        Ok((time, bytes))
    }

    pub fn option(&self, key: &str) -> Option<&str> {
        self.options
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The Nexmark generator's settings, for a table or source with `connector = 'nexmark'`.
    /// It splits its events over `nexmark.split.num` partitions (default: the table's).
    pub fn nexmark(&self) -> Result<Option<eddy_connectors::nexmark::NexmarkConfig>> {
        use eddy_connectors::nexmark::{
            DEFAULT_BASE_TIME_MS, DEFAULT_EVENT_RATE, EventKind, NexmarkConfig,
        };
        if self.option("connector") != Some("nexmark") {
            return Ok(None);
        }
        let number = |key: &str| -> Result<Option<u64>> {
            self.option(key)
                .map(|v| {
                    v.parse::<u64>().map_err(|_| {
                        Error::invalid_parameter(format!("{key} must be a whole number, not '{v}'"))
                    })
                })
                .transpose()
        };
        let rate = number("nexmark.events.per.second")?.unwrap_or(0);
        Ok(Some(NexmarkConfig {
            kind: EventKind::parse(self.option("nexmark.table.type").unwrap_or_default())?,
            seed: number("nexmark.seed")?.unwrap_or(0),
            event_rate: if rate == 0 { DEFAULT_EVENT_RATE } else { rate },
            event_num: number("nexmark.event.num")?.filter(|n| *n > 0),
            base_time_ms: number("nexmark.base.time.millis")?
                .map_or(DEFAULT_BASE_TIME_MS, |b| b as i64),
            splits: number("nexmark.split.num")?.map_or(self.partitions, |n| n as u32),
        }))
    }

    /// Events per second of wall-clock time the generator may produce (0: as fast as it can):
    /// `nexmark.events.per.second`, unless `nexmark.rate.limited = 'false'` (then that rate
    /// only spaces the events' times).
    pub fn nexmark_rate_limit(&self) -> u64 {
        if self.option("nexmark.rate.limited") == Some("false") {
            return 0;
        }
        self.option("nexmark.events.per.second")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// How decoding failures are handled (`on_error`).
    pub fn on_error(&self) -> OnError {
        match self.option("on_error") {
            Some("skip") => OnError::Skip,
            Some("fail") => OnError::Fail,
            _ => OnError::DeadLetter,
        }
    }

    /// The record format and the decoder of this table's records.
    pub fn decoder(&self, schema: &SchemaRef, csv: bool) -> Result<eddy_connectors::RecordDecoder> {
        let format = match &self.format {
            Some((envelope, encoding)) => eddy_connectors::Format::parse(envelope, encoding)?,
            None if csv => eddy_connectors::Format::PLAIN_CSV,
            None => eddy_connectors::Format::PLAIN_JSON,
        };
        let includes = self
            .includes
            .iter()
            .map(|i| eddy_connectors::Include::parse(i))
            .collect::<Result<Vec<_>>>()?;
        eddy_connectors::RecordDecoder::new(
            Arc::clone(schema),
            &includes,
            &self.primary_key,
            format,
        )
    }
}

/// What happens to a record that cannot be decoded (`on_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Recorded in `eddy_dead_letters`; the others flow on.
    DeadLetter,
    /// Counted and dropped.
    Skip,
    /// The whole write (or the connector) stops with the error.
    Fail,
}

/// Quotes an identifier when PostgreSQL would need it to read it back unchanged.
pub fn quote_ident(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_owned()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// A name as `SHOW CREATE` writes it: bare in `public`, `schema.name` elsewhere.
pub fn sql_name(name: &QualifiedName) -> String {
    if name.schema == eddy_sql::PUBLIC_SCHEMA {
        quote_ident(&name.name)
    } else {
        format!("{}.{}", quote_ident(&name.schema), quote_ident(&name.name))
    }
}

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
fn is_keyword_value(word: &str) -> bool {
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

fn set_primary_key(slot: &mut Option<Vec<usize>>, columns: Vec<usize>) -> Result<()> {
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
fn bind_watermark(columns: &[ColumnDef], column: &ast::Ident, expr: &Expr) -> Result<WatermarkDef> {
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

fn bind_table_options(options: &[(String, String)]) -> Result<(Vec<(String, String)>, u32)> {
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

/// 42703: `relation` has no column `column`.
pub(crate) fn undefined_column(column: &str, relation: &str) -> Error {
    Error::new(
        SqlState::UNDEFINED_COLUMN,
        format!("column \"{column}\" of relation \"{relation}\" does not exist"),
    )
}

#[cfg(test)]
mod schema_tests {
    use super::ObjectDef;

    /// Catalog entries written before schemas existed have no `schema`: they are in `public`.
    #[test]
    fn entries_without_a_schema_are_in_public() {
        let table = r#"{"kind":"table","id":3,"name":"t","columns":[],"primary_key":[],"append_only":false,"watermark":null,"options":[],"partitions":1}"#;
        let ObjectDef::Table(def) = ObjectDef::decode(table.as_bytes()).unwrap() else {
            panic!("not a table")
        };
        assert_eq!(def.qualified(), eddy_sql::QualifiedName::public("t"));
        let view = r#"{"kind":"materialized_view","id":4,"name":"v","sql":"CREATE MATERIALIZED VIEW v AS SELECT 1","dependencies":[3]}"#;
        let ObjectDef::MaterializedView(def) = ObjectDef::decode(view.as_bytes()).unwrap() else {
            panic!("not a view")
        };
        assert_eq!(def.schema, "public");
        let sink = r#"{"kind":"sink","id":5,"name":"s","view":4,"options":[],"sql":"","key":[],"columns":[]}"#;
        let ObjectDef::Sink(def) = ObjectDef::decode(sink.as_bytes()).unwrap() else {
            panic!("not a sink")
        };
        assert_eq!(def.schema, "public");
    }
}
