//! The PostgreSQL sink: keeps a PostgreSQL table equal to a materialized view.
//!
//! Each epoch's changes are written in one transaction together with the sink's progress row
//! (`eddy_sink_progress`: the epoch and the view's read offsets), so an epoch is either
//! entirely in the table, with its progress, or not at all. With a key (the `primary_key`
//! option or the view's GROUP BY columns) changes are upserts and deletes by key; without one,
//! the whole row is the key and `eddy_count` holds how many copies the view has. The engine
//! decides what to write after a restart (nothing twice, nothing missed); this module only
//! writes ([`SinkWrite`]).

use std::fmt::Write as _;

use arrow::array::{Array, RecordBatch};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use eddy_common::{Error, Result, SqlState};
use tokio_postgres::{Client, NoTls};

use super::{SinkProgress, SinkWrite};

/// Where the sink writes: the options of `CREATE SINK ... WITH (connector = 'postgres', ...)`.
#[derive(Debug, Clone)]
pub struct PostgresTarget {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    pub database: String,
    pub schema: String,
    pub table: String,
}

impl PostgresTarget {
    /// Reads the connector options; unknown ones are the caller's to reject.
    pub fn from_options(option: impl Fn(&str) -> Option<String>) -> Result<PostgresTarget> {
        let required = |name: &str| {
            option(name).ok_or_else(|| {
                Error::invalid_parameter(format!("a postgres sink needs the option {name}"))
            })
        };
        let port = match option("port") {
            Some(p) => p.parse().map_err(|_| {
                Error::invalid_parameter(format!("port must be a number, not '{p}'"))
            })?,
            None => 5432,
        };
        Ok(PostgresTarget {
            host: option("hostname").unwrap_or_else(|| "127.0.0.1".into()),
            port,
            user: required("username")?,
            password: option("password"),
            database: required("database.name")?,
            schema: option("schema.name").unwrap_or_else(|| "public".into()),
            table: required("table.name")?,
        })
    }

    fn qualified(&self) -> String {
        format!("{}.{}", ident(&self.schema), ident(&self.table))
    }
}

/// One column of the target table: its name and PostgreSQL type.
#[derive(Debug, Clone)]
pub struct SinkColumn {
    pub name: String,
    pub pg_type: String,
}

pub struct PostgresSink {
    name: String,
    target: PostgresTarget,
    columns: Vec<SinkColumn>,
    /// Key column positions; empty: the whole row, counted in `eddy_count`.
    key: Vec<usize>,
    client: Option<Client>,
}

fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn sink_error(context: &str, e: tokio_postgres::Error) -> Error {
    let detail = e
        .as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_owned());
    Error::new(
        SqlState::CONNECTION_EXCEPTION,
        format!("postgres sink: {context}: {detail}"),
    )
}

impl PostgresSink {
    pub fn new(
        name: String,
        target: PostgresTarget,
        columns: Vec<SinkColumn>,
        key: Vec<usize>,
    ) -> PostgresSink {
        PostgresSink {
            name,
            target,
            columns,
            key,
            client: None,
        }
    }

    async fn client(&mut self) -> Result<&Client> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let mut config = tokio_postgres::Config::new();
            config
                .host(&self.target.host)
                .port(self.target.port)
                .user(&self.target.user)
                .dbname(&self.target.database);
            if let Some(p) = &self.target.password {
                config.password(p);
            }
            config.connect_timeout(std::time::Duration::from_secs(10));
            let (client, connection) = config
                .connect(NoTls)
                .await
                .map_err(|e| sink_error("connecting", e))?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!(error = %e, "postgres sink connection ended");
                }
            });
            self.client = Some(client);
        }
        self.client
            .as_ref()
            .ok_or_else(|| Error::internal("postgres sink without a connection"))
    }

    /// Connects, creates the progress table and the target table (with a unique index on the
    /// key) when missing, and returns the progress recorded for this sink (`None`: none).
    pub async fn prepare(&mut self) -> Result<Option<SinkProgress>> {
        let table = self.target.qualified();
        let mut columns: Vec<String> = self
            .columns
            .iter()
            .map(|c| format!("{} {}", ident(&c.name), c.pg_type))
            .collect();
        if self.key.is_empty() {
            columns.push("eddy_count BIGINT NOT NULL".into());
        }
        let key = self.key_columns().join(", ");
        let index = ident(&format!("{}_eddy_key", self.target.table));
        let setup = format!(
            "SET client_min_messages = warning;
             CREATE TABLE IF NOT EXISTS {schema}.eddy_sink_progress (sink TEXT PRIMARY KEY, epoch BIGINT NOT NULL, offsets TEXT NOT NULL, committed_at TIMESTAMPTZ NOT NULL DEFAULT now());
             CREATE TABLE IF NOT EXISTS {table} ({columns});
             CREATE UNIQUE INDEX IF NOT EXISTS {index} ON {table} ({key}) NULLS NOT DISTINCT;",
            schema = ident(&self.target.schema),
            columns = columns.join(", "),
        );
        let name = self.name.clone();
        let schema = ident(&self.target.schema);
        let client = self.client().await?;
        client
            .batch_execute(&setup)
            .await
            .map_err(|e| sink_error("creating the target table", e))?;
        let row = client
            .query_opt(
                &format!("SELECT epoch, offsets FROM {schema}.eddy_sink_progress WHERE sink = $1"),
                &[&name],
            )
            .await
            .map_err(|e| sink_error("reading progress", e))?;
        Ok(row.map(|r| SinkProgress {
            epoch: r.get::<_, i64>(0) as u64,
            offsets: r.get(1),
        }))
    }

    fn key_columns(&self) -> Vec<String> {
        if self.key.is_empty() {
            self.columns.iter().map(|c| ident(&c.name)).collect()
        } else {
            self.key
                .iter()
                .map(|k| ident(&self.columns[*k].name))
                .collect()
        }
    }

    /// Writes one epoch and its progress in one transaction. After an error the connection is
    /// dropped; writing the same epoch again is safe.
    pub async fn write(&mut self, write: &SinkWrite, progress: &SinkProgress) -> Result<()> {
        let sql = self.statements(write, progress)?;
        let result = match self.client().await {
            Ok(client) => client
                .batch_execute(&sql)
                .await
                .map_err(|e| sink_error("writing an epoch", e)),
            Err(e) => Err(e),
        };
        if result.is_err() {
            self.client = None;
        }
        result
    }

    /// The transaction that writes `write`.
    fn statements(&self, write: &SinkWrite, progress: &SinkProgress) -> Result<String> {
        let table = self.target.qualified();
        let mut sql = String::from("BEGIN;\n");
        let (changes, replace) = match write {
            SinkWrite::Changes(c) => (c.as_ref(), false),
            SinkWrite::Replace(c) => (c.as_ref(), true),
        };
        if replace {
            let _ = writeln!(sql, "DELETE FROM {table};");
        }
        if let Some(changes) = changes {
            let rows = self.render(changes.rows())?;
            let diffs = changes.diffs().values();
            let all_columns: Vec<String> = self.columns.iter().map(|c| ident(&c.name)).collect();
            let key_columns = self.key_columns();
            let matches = |row: &[String]| -> String {
                let positions: Vec<usize> = if self.key.is_empty() {
                    (0..self.columns.len()).collect()
                } else {
                    self.key.clone()
                };
                positions
                    .iter()
                    .zip(&key_columns)
                    .map(|(i, c)| format!("{c} IS NOT DISTINCT FROM {}", row[*i]))
                    .collect::<Vec<_>>()
                    .join(" AND ")
            };
            if self.key.is_empty() {
                // Whole rows, counted: add the weights, then drop rows counted down to zero.
                let mut values = Vec::new();
                for (row, d) in rows.iter().zip(diffs) {
                    values.push(format!("({}, {d})", row.join(", ")));
                }
                if !values.is_empty() {
                    let _ = writeln!(
                        sql,
                        "INSERT INTO {table} ({}, eddy_count) VALUES {} ON CONFLICT ({}) DO UPDATE SET eddy_count = {table}.eddy_count + EXCLUDED.eddy_count;",
                        all_columns.join(", "),
                        values.join(", "),
                        key_columns.join(", ")
                    );
                    let _ = writeln!(sql, "DELETE FROM {table} WHERE eddy_count <= 0;");
                }
            } else {
                // By key: a key with a row inserted is upserted; one only retracted is deleted.
                let key_of =
                    |row: &[String]| self.key.iter().map(|k| row[*k].clone()).collect::<Vec<_>>();
                let upserted: std::collections::HashSet<Vec<String>> = rows
                    .iter()
                    .zip(diffs)
                    .filter(|(_, d)| **d > 0)
                    .map(|(r, _)| key_of(r))
                    .collect();
                for (row, _) in rows
                    .iter()
                    .zip(diffs)
                    .filter(|(r, d)| **d < 0 && !upserted.contains(&key_of(r)))
                {
                    let _ = writeln!(sql, "DELETE FROM {table} WHERE {};", matches(row));
                }
                let values: Vec<String> = rows
                    .iter()
                    .zip(diffs)
                    .filter(|(_, d)| **d > 0)
                    .map(|(r, _)| format!("({})", r.join(", ")))
                    .collect();
                if !values.is_empty() {
                    let others: Vec<String> = (0..self.columns.len())
                        .filter(|i| !self.key.contains(i))
                        .map(|i| format!("{0} = EXCLUDED.{0}", all_columns[i]))
                        .collect();
                    let action = if others.is_empty() {
                        "NOTHING".to_owned()
                    } else {
                        format!("UPDATE SET {}", others.join(", "))
                    };
                    let _ = writeln!(
                        sql,
                        "INSERT INTO {table} ({}) VALUES {} ON CONFLICT ({}) DO {action};",
                        all_columns.join(", "),
                        values.join(", "),
                        key_columns.join(", ")
                    );
                }
            }
        }
        let _ = writeln!(
            sql,
            "INSERT INTO {schema}.eddy_sink_progress (sink, epoch, offsets, committed_at) VALUES ({name}, {epoch}, {offsets}, now())
             ON CONFLICT (sink) DO UPDATE SET epoch = EXCLUDED.epoch, offsets = EXCLUDED.offsets, committed_at = EXCLUDED.committed_at;\nCOMMIT;",
            schema = ident(&self.target.schema),
            name = literal(&self.name),
            epoch = progress.epoch,
            offsets = literal(&progress.offsets),
        );
        Ok(sql)
    }

    /// Every value as a SQL literal (`NULL`, or quoted text PostgreSQL casts to the column).
    fn render(&self, rows: &RecordBatch) -> Result<Vec<Vec<String>>> {
        let options = FormatOptions::default().with_display_error(true);
        let mut out: Vec<Vec<String>> =
            vec![Vec::with_capacity(rows.num_columns()); rows.num_rows()];
        for column in rows.columns() {
            let formatter = ArrayFormatter::try_new(column.as_ref(), &options)
                .map_err(|e| Error::internal(format!("postgres sink: {e}")))?;
            for (i, row) in out.iter_mut().enumerate() {
                row.push(if column.is_null(i) {
                    "NULL".to_owned()
                } else {
                    literal(&formatter.value(i).to_string())
                });
            }
        }
        Ok(out)
    }

    /// Forgets this sink's progress (a new sink of the same name starts over).
    pub async fn reset_progress(&mut self) -> Result<()> {
        let schema = ident(&self.target.schema);
        let name = self.name.clone();
        let client = self.client().await?;
        client
            .execute(
                &format!("DELETE FROM {schema}.eddy_sink_progress WHERE sink = $1"),
                &[&name],
            )
            .await
            .map_err(|e| sink_error("resetting progress", e))?;
        Ok(())
    }
}
