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

mod bind;
pub(crate) use bind::bind_default;
pub use bind::{bind_added_column, bind_create_table};

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
