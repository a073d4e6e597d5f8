//! `COPY`: `FROM STDIN` into a table (text, CSV), and `TO STDOUT` from a table, a view or a
//! query (text, CSV, binary) — what psql's `\copy` and every driver's import and export send.
//! Files and programs on the server are never read or written for a client.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use eddy_common::{ChangeBatch, Error, Result, SqlState};
use eddy_sql::ast::{self, CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource};
use eddy_sql::{Planned, Statement};

use super::{Outcome, Session, conform};
use crate::catalog::normalize_ident;
use crate::copy::{CopyFormat, CopyIn};

impl Session {
    pub(super) async fn copy_from_stdin(
        &self,
        source: &CopySource,
        options: &[CopyOption],
        legacy: &[CopyLegacyOption],
    ) -> Result<Outcome> {
        let CopySource::Table {
            table_name,
            columns,
        } = source
        else {
            return Err(Error::unsupported("COPY (query) FROM is not valid"));
        };
        let name = self.existing_name(table_name)?;
        let table = self.writable_table(&name)?;
        let columns = if columns.is_empty() {
            (0..table.schema.fields().len()).collect()
        } else {
            columns
                .iter()
                .map(|c| {
                    let c = normalize_ident(c);
                    table
                        .schema
                        .index_of(&c)
                        .map_err(|_| crate::catalog::undefined_column(&c, &name.name))
                })
                .collect::<Result<Vec<_>>>()?
        };
        let format = copy_format(options, legacy)?;
        // The columns the data leaves out take their DEFAULT, evaluated once for the COPY.
        let mut defaults = Vec::new();
        for (i, field) in table.schema.fields().iter().enumerate() {
            if columns.contains(&i) {
                continue;
            }
            let Some(default) = field.metadata().get(eddy_sql::types::DEFAULT_KEY) else {
                continue;
            };
            let sql = format!(
                "SELECT CAST(({default}) AS {})",
                eddy_sql::types::pg_type_name(field)
            );
            let statement = match eddy_sql::parse_statements(&sql)?.into_iter().next() {
                Some(parsed) => match parsed.statement {
                    Statement::Sql(statement) => *statement,
                    _ => return Err(Error::internal("a default did not parse as a query")),
                },
                None => return Err(Error::internal("a default did not parse")),
            };
            let Planned::Query(plan) = self.planner.plan(&statement).await? else {
                return Err(Error::internal("a default is a query"));
            };
            let batches = self.planner.execute(plan).await?;
            let value = batches
                .iter()
                .find(|b| b.num_rows() > 0)
                .map(|b| Arc::clone(b.column(0)))
                .ok_or_else(|| Error::internal("a default gave no value"))?;
            defaults.push((i, value));
        }
        Ok(Outcome::CopyIn(CopyIn {
            table: name,
            columns,
            schema: Arc::clone(&table.schema),
            format,
            defaults,
        }))
    }

    /// `COPY table [(columns)] TO STDOUT` and `COPY (query) TO STDOUT`, read at one moment.
    pub(super) async fn copy_to_stdout(
        &mut self,
        source: &CopySource,
        options: &[CopyOption],
        legacy: &[CopyLegacyOption],
        params: &[ArrayRef],
    ) -> Result<Outcome> {
        let format = copy_format(options, legacy)?;
        let query = match source {
            CopySource::Query(query) => ast::Statement::Query(query.clone()),
            CopySource::Table {
                table_name,
                columns,
            } => {
                let list = if columns.is_empty() {
                    "*".to_owned()
                } else {
                    columns
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let sql = format!("SELECT {list} FROM {table_name}");
                match eddy_sql::parse_statements(&sql)?
                    .into_iter()
                    .next()
                    .map(|p| p.statement)
                {
                    Some(Statement::Sql(statement)) => *statement,
                    _ => return Err(Error::internal("COPY's query did not parse")),
                }
            }
        };
        let Planned::Query(plan) = self.planner.plan(&query).await? else {
            return Err(Error::new(
                SqlState::FEATURE_NOT_SUPPORTED,
                "COPY (query) TO must read rows: a write has no rows to copy",
            ));
        };
        let plan = plan.bind(params)?;
        let schema = plan.schema();
        let batches = self.planner.execute(plan).await?;
        Ok(Outcome::CopyOut {
            schema,
            batches,
            format,
        })
    }
}

fn copy_format(options: &[CopyOption], legacy: &[CopyLegacyOption]) -> Result<CopyFormat> {
    let mut csv = false;
    let mut binary = false;
    let mut delimiter = None;
    let mut null = None;
    let mut header = false;
    let mut quote = '"';
    for option in options {
        match option {
            CopyOption::Format(f) => match f.value.to_lowercase().as_str() {
                "csv" => csv = true,
                "text" => csv = false,
                "binary" => binary = true,
                other => {
                    return Err(Error::unsupported(format!(
                        "COPY format \"{other}\" is not supported"
                    )));
                }
            },
            CopyOption::Delimiter(c) => delimiter = Some(*c),
            CopyOption::Null(n) => null = Some(n.clone()),
            CopyOption::Header(h) => header = *h,
            CopyOption::Quote(q) => quote = *q,
            CopyOption::Encoding(e)
                if e.eq_ignore_ascii_case("utf8") || e.eq_ignore_ascii_case("utf-8") => {}
            other => {
                return Err(Error::unsupported(format!(
                    "COPY option {other} is not supported"
                )));
            }
        }
    }
    for option in legacy {
        match option {
            CopyLegacyOption::Csv(csv_options) => {
                csv = true;
                for o in csv_options {
                    match o {
                        CopyLegacyCsvOption::Header => header = true,
                        CopyLegacyCsvOption::Quote(q) => quote = *q,
                        other => {
                            return Err(Error::unsupported(format!(
                                "COPY option {other} is not supported"
                            )));
                        }
                    }
                }
            }
            CopyLegacyOption::Delimiter(c) => delimiter = Some(*c),
            CopyLegacyOption::Null(n) => null = Some(n.clone()),
            other => {
                return Err(Error::unsupported(format!(
                    "COPY option {other} is not supported"
                )));
            }
        }
    }
    Ok(if binary {
        if csv || delimiter.is_some() || null.is_some() || header {
            return Err(Error::new(
                SqlState::SYNTAX_ERROR,
                "cannot specify DELIMITER, NULL or HEADER in BINARY mode",
            ));
        }
        CopyFormat::Binary
    } else if csv {
        CopyFormat::Csv {
            delimiter: delimiter.unwrap_or(','),
            quote,
            null: null.unwrap_or_default(),
            header,
        }
    } else {
        CopyFormat::Text {
            delimiter: delimiter.unwrap_or('\t'),
            null: null.unwrap_or_else(|| "\\N".into()),
            header,
        }
    })
}

impl Session {
    /// Finishes a `COPY FROM STDIN` with all of its data.
    pub async fn copy_in(&mut self, copy: &CopyIn, data: &[u8]) -> Result<Outcome> {
        let rows = match copy.rows(data) {
            Ok(rows) => rows,
            Err(e) => {
                self.fail_transaction();
                return Err(e);
            }
        };
        self.copy_in_rows(copy, rows).await
    }

    /// Writes the rows a COPY FROM decoded (the server decodes the binary format).
    pub async fn copy_in_rows(&mut self, copy: &CopyIn, rows: RecordBatch) -> Result<Outcome> {
        let result = self.copy_in_inner(copy, rows).await;
        if result.is_err()
            && let Some(txn) = self.transaction.as_mut()
        {
            txn.failed = true;
        }
        result
    }

    pub(super) async fn copy_in_inner(
        &mut self,
        copy: &CopyIn,
        rows: RecordBatch,
    ) -> Result<Outcome> {
        let table = self.writable_table(&copy.table)?;
        let guard = match self.transaction {
            None => Some(self.engine.lock_writes().await),
            Some(_) => None,
        };
        let count = rows.num_rows();
        let rows = conform(&table, rows)?;
        self.write(guard, table, vec![ChangeBatch::inserts(rows)])
            .await?;
        if self.variables.implicit_flush() && self.transaction.is_none() {
            self.engine.flush().await?;
        }
        Ok(Outcome::Command {
            tag: "COPY",
            rows: Some(count),
        })
    }
}
