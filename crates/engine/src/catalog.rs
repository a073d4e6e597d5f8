//! Catalog definitions (what the metadata store keeps per object) and `CREATE TABLE` binding.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use eddy_common::{Error, ObjectId, Result, SqlState};
use eddy_sql::ast::{self, ColumnOption, Expr, TableConstraint};
use eddy_sql::types::{self, PG_TYPE_KEY};
use eddy_sql::CreateTable;
use serde::{Deserialize, Serialize};

/// Most partitions a table may have.
const PARTITIONS_MAX: u32 = 1024;

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
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatermarkDef {
    pub column: String,
    /// The watermark expression as written (e.g. `ts - INTERVAL '5 seconds'`).
    pub expr: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableDef {
    pub id: ObjectId,
    pub name: String,
    pub columns: Vec<ColumnDef>,
    /// Indexes into `columns`.
    pub primary_key: Vec<usize>,
    pub append_only: bool,
    pub watermark: Option<WatermarkDef>,
    pub options: Vec<(String, String)>,
    pub partitions: u32,
}

/// A materialized view: its query text is planned again on start-up.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ViewDef {
    pub id: ObjectId,
    pub name: String,
    /// The `CREATE MATERIALIZED VIEW` statement as written.
    pub sql: String,
    /// Tables and views it reads.
    pub dependencies: Vec<ObjectId>,
}

/// What the metadata store holds for one object.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ObjectDef {
    Table(TableDef),
    MaterializedView(ViewDef),
}

impl ObjectDef {
    pub fn encode(&self) -> Result<Vec<u8>> {
        serde_json::to_vec(self).map_err(|e| Error::internal(format!("encoding a catalog entry: {e}")))
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes)
            .map_err(|e| Error::new(SqlState::DATA_CORRUPTED, format!("unreadable catalog entry: {e}")))
    }
}

impl TableDef {
    /// The Arrow schema; field metadata carries the declared PostgreSQL types.
    pub fn schema(&self) -> Result<SchemaRef> {
        let fields = self
            .columns
            .iter()
            .map(|c| {
                let data_type = DataType::from_str(&c.arrow_type).map_err(|e| {
                    Error::new(SqlState::DATA_CORRUPTED, format!("column {} has unreadable type: {e}", c.name))
                })?;
                Ok(Field::new(&c.name, data_type, c.nullable)
                    .with_metadata(HashMap::from([(PG_TYPE_KEY.to_owned(), c.pg_type.clone())])))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(Schema::new(fields)))
    }

    /// `CREATE TABLE` text equivalent to this definition (SHOW CREATE TABLE).
    pub fn create_sql(&self) -> String {
        let mut parts: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                let not_null = if c.nullable || self.primary_key.iter().any(|&i| self.columns[i].name == c.name) {
                    ""
                } else {
                    " NOT NULL"
                };
                let proctime = if c.proctime { " AS PROCTIME()" } else { "" };
                format!("{} {}{not_null}{proctime}", quote_ident(&c.name), c.pg_type)
            })
            .collect();
        if !self.primary_key.is_empty() {
            let names: Vec<String> = self.primary_key.iter().map(|&i| quote_ident(&self.columns[i].name)).collect();
            parts.push(format!("PRIMARY KEY ({})", names.join(", ")));
        }
        if let Some(w) = &self.watermark {
            parts.push(format!("WATERMARK FOR {} AS {}", quote_ident(&w.column), w.expr));
        }
        let mut sql = format!("CREATE TABLE {} ({})", quote_ident(&self.name), parts.join(", "));
        if self.append_only {
            sql.push_str(" APPEND ONLY");
        }
        if !self.options.is_empty() {
            let options: Vec<String> = self.options.iter().map(|(k, v)| format!("{k} = '{}'", v.replace('\'', "''"))).collect();
            sql.push_str(&format!(" WITH ({})", options.join(", ")));
        }
        sql
    }
}

/// Quotes an identifier when PostgreSQL would need it to read it back unchanged.
pub fn quote_ident(name: &str) -> String {
    let plain = name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain { name.to_owned() } else { format!("\"{}\"", name.replace('"', "\"\"")) }
}

/// Normalizes an identifier as PostgreSQL does: lowercase unless quoted.
pub fn normalize_ident(ident: &ast::Ident) -> String {
    if ident.quote_style.is_some() { ident.value.clone() } else { ident.value.to_lowercase() }
}

/// Resolves `name` or `public.name` to the table name; other schemas do not exist yet.
pub fn object_name(name: &ast::ObjectName) -> Result<String> {
    let parts: Vec<String> = name.0.iter().filter_map(|p| p.as_ident()).map(normalize_ident).collect();
    match parts.as_slice() {
        [table] => Ok(table.clone()),
        [schema, table] if schema == "public" => Ok(table.clone()),
        [schema, _] => Err(Error::new(SqlState::UNDEFINED_OBJECT, format!("schema \"{schema}\" does not exist"))
            .with_hint("Eddy has one schema, public")),
        _ => Err(Error::syntax(format!("improper qualified name: {name}"))),
    }
}

/// Binds `CREATE TABLE` into a definition, validating everything a user can get wrong.
pub fn bind_create_table(create: &CreateTable, id: ObjectId) -> Result<TableDef> {
    let name = object_name(&create.name)?;
    let mut columns: Vec<ColumnDef> = Vec::new();
    let mut primary_key: Option<Vec<usize>> = None;
    if create.columns.is_empty() {
        return Err(Error::syntax("a table needs at least one column"));
    }
    if create.columns.len() > eddy_common::limits::TABLE_COLUMNS_MAX {
        return Err(Error::new(SqlState::PROGRAM_LIMIT_EXCEEDED, "tables can have at most 1600 columns"));
    }
    for (index, column) in create.columns.iter().enumerate() {
        let column_name = normalize_ident(&column.name);
        if columns.iter().any(|c| c.name == column_name) {
            return Err(Error::new(SqlState::DUPLICATE_COLUMN, format!("column \"{column_name}\" specified more than once")));
        }
        let column_type = types::column_type(&column.data_type)?;
        let mut nullable = true;
        for option in &column.options {
            match &option.option {
                ColumnOption::NotNull => nullable = false,
                ColumnOption::Null => nullable = true,
                ColumnOption::PrimaryKey(_) => set_primary_key(&mut primary_key, vec![index])?,
                other => return Err(Error::unsupported(format!("column option {other} is not supported"))),
            }
        }
        let proctime = create.proctime.iter().any(|p| normalize_ident(p) == column_name);
        if proctime && !column_type.arrow.to_string().starts_with("Timestamp(") {
            return Err(Error::new(
                SqlState::DATATYPE_MISMATCH,
                format!("column \"{column_name}\" AS PROCTIME() must be a timestamp or timestamptz, not {}", column_type.pg_name),
            ));
        }
        columns.push(ColumnDef {
            name: column_name,
            pg_type: column_type.pg_name,
            arrow_type: column_type.arrow.to_string(),
            nullable,
            proctime,
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
                    let index = columns.iter().position(|c| c.name == column_name).ok_or_else(|| {
                        Error::new(SqlState::UNDEFINED_COLUMN, format!("column \"{column_name}\" named in key does not exist"))
                    })?;
                    indexes.push(index);
                }
                set_primary_key(&mut primary_key, indexes)?;
            }
            other => return Err(Error::unsupported(format!("constraint {other} is not supported"))),
        }
    }
    let primary_key = primary_key.unwrap_or_default();
    for &i in &primary_key {
        columns[i].nullable = false;
    }
    if create.append_only && !primary_key.is_empty() {
        return Err(Error::new(SqlState::INVALID_TABLE_DEFINITION, "an APPEND ONLY table cannot have a PRIMARY KEY")
            .with_hint("drop APPEND ONLY for a table whose rows are updated by key"));
    }
    let watermark = match &create.watermark {
        None => None,
        Some((column, expr)) => Some(bind_watermark(&columns, column, expr)?),
    };
    let (options, partitions) = bind_table_options(&create.options)?;
    Ok(TableDef { id, name, columns, primary_key, append_only: create.append_only, watermark, options, partitions })
}

fn set_primary_key(slot: &mut Option<Vec<usize>>, columns: Vec<usize>) -> Result<()> {
    if slot.is_some() {
        return Err(Error::new(SqlState::INVALID_TABLE_DEFINITION, "multiple primary keys for table are not allowed"));
    }
    let mut seen = columns.clone();
    seen.sort();
    seen.dedup();
    if seen.len() != columns.len() {
        return Err(Error::new(SqlState::DUPLICATE_COLUMN, "a column appears twice in the primary key"));
    }
    *slot = Some(columns);
    Ok(())
}

/// `WATERMARK FOR ts AS ts` or `ts - INTERVAL '...'` over a timestamp column.
fn bind_watermark(columns: &[ColumnDef], column: &ast::Ident, expr: &Expr) -> Result<WatermarkDef> {
    let column_name = normalize_ident(column);
    let def = columns.iter().find(|c| c.name == column_name).ok_or_else(|| {
        Error::new(SqlState::UNDEFINED_COLUMN, format!("column \"{column_name}\" named in WATERMARK FOR does not exist"))
    })?;
    if !def.arrow_type.starts_with("Timestamp(") {
        return Err(Error::new(
            SqlState::DATATYPE_MISMATCH,
            format!("WATERMARK FOR needs a timestamp column, but \"{column_name}\" is {}", def.pg_type),
        ));
    }
    let refers_to_column = |e: &Expr| matches!(e, Expr::Identifier(i) if normalize_ident(i) == column_name);
    let valid = match expr {
        e if refers_to_column(e) => true,
        Expr::BinaryOp { left, op: ast::BinaryOperator::Minus, right } => {
            refers_to_column(left) && matches!(right.as_ref(), Expr::Interval(_))
        }
        _ => false,
    };
    if !valid {
        return Err(Error::unsupported(format!(
            "WATERMARK FOR {column_name} AS {expr}: the watermark must be `{column_name}` or `{column_name} - INTERVAL '...'`"
        )));
    }
    Ok(WatermarkDef { column: column_name, expr: expr.to_string() })
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
            "retention" | "retention.bytes" => {}
            "connector" => {
                return Err(Error::unsupported(format!("connector '{value}' is not supported yet")));
            }
            other => return Err(Error::invalid_parameter(format!("unrecognized table option \"{other}\""))),
        }
        kept.push((key.clone(), value.clone()));
    }
    Ok((kept, partitions))
}
