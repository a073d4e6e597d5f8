//! A client session: variables, an optional open transaction, and statement execution.
//!
//! Entry points: [`Session::execute`] (and [`Session::describe`] for the extended protocol).
//! Outside a transaction every DML statement commits on its own and holds the engine's write
//! lock from reading the table to queuing the commit, so concurrent statements serialize. Inside
//! `BEGIN ... COMMIT` a statement works on the session's private copies of the tables it wrote
//! (so it reads its own writes); `COMMIT` re-checks every change against the shared contents
//! (first committer wins: a lost race is 40001) and appends them to the log atomically.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use eddy_common::{Error, ObjectId, Result, SqlState};
use eddy_sql::ast::{self, CopyTarget, ObjectType};
use eddy_sql::{
    CatalogSource, Planned, QualifiedName, QueryPlan, SessionInfo, SessionPlanner, Statement,
};

use crate::catalog::normalize_ident;
use crate::copy::{CopyFormat, CopyIn};
use crate::session_catalog::SessionCatalog;
use crate::variables::Variables;
use crate::{Engine, ObjectKind, Table};

mod copy;
mod create_as;
mod cursor;
mod describe;
mod dispatch;
mod dml;
mod show;
mod sql;
mod subscribe;
mod transaction;
mod views;

use show::variable_name;
pub use subscribe::SubscriptionStream;
use subscribe::{change_rows, subscription_schema};

use cursor::Cursor;
use transaction::Transaction;

/// What a statement produced.
#[derive(Debug)]
pub enum Outcome {
    Rows {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    },
    /// Rows with a command tag other than SELECT (`FETCH n`, `INSERT 0 n` with RETURNING);
    /// `binary` for a BINARY cursor.
    TaggedRows {
        tag: &'static str,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        binary: bool,
    },
    /// A completed command; `rows` is appended to the tag (`INSERT 0 3`, `DELETE 2`).
    Command {
        tag: &'static str,
        rows: Option<usize>,
    },
    TransactionStart,
    /// `COMMIT` or `ROLLBACK` (a failed transaction's COMMIT reports ROLLBACK).
    TransactionEnd {
        tag: &'static str,
    },
    /// The server must now read the COPY data and call [`Session::copy_in`].
    CopyIn(CopyIn),
    /// `COPY ... TO STDOUT`: the rows, to send as COPY data in `format`.
    CopyOut {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        format: CopyFormat,
    },
    /// A warning to show the client (`there is no transaction in progress`, 25P01), with the
    /// statement's outcome.
    Warning {
        state: SqlState,
        message: String,
        then: Box<Outcome>,
    },
    /// Progress information or PostgreSQL's NOTICE (`... does not exist, skipping`, 00000;
    /// `... already exists, skipping`, 42P07), with the statement's outcome.
    Notice {
        state: SqlState,
        message: String,
        detail: Option<String>,
        then: Box<Outcome>,
    },
}

/// A NOTICE a statement sends before its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub state: SqlState,
    pub message: String,
    pub detail: Option<String>,
}

impl From<String> for Notice {
    fn from(message: String) -> Self {
        Notice {
            state: SqlState::SUCCESSFUL_COMPLETION,
            message,
            detail: None,
        }
    }
}

/// `relation "name" already exists, skipping` (CREATE ... IF NOT EXISTS), as PostgreSQL sends
/// it: a NOTICE with 42P07.
pub(crate) fn relation_exists(name: &str, then: Outcome) -> Outcome {
    Outcome::Notice {
        state: SqlState::DUPLICATE_TABLE,
        message: format!("relation \"{name}\" already exists, skipping"),
        detail: None,
        then: Box::new(then),
    }
}

/// What the extended protocol's Describe reports.
#[derive(Debug, Clone)]
pub struct StatementDescription {
    pub parameters: Vec<Option<DataType>>,
    /// `None` for statements that return no rows.
    pub columns: Option<SchemaRef>,
}

impl Drop for Session {
    fn drop(&mut self) {
        let names: Vec<String> = self.cursors.keys().cloned().collect();
        for name in names {
            self.close_cursor(&name);
        }
        self.engine.sessions.remove(self.view.pid);
    }
}

pub struct Session {
    cursors: HashMap<String, Cursor>,
    pub(crate) engine: Arc<Engine>,
    pub(crate) planner: SessionPlanner,
    pub(crate) view: Arc<SessionCatalog>,
    variables: Variables,
    transaction: Option<Transaction>,
    /// Where NOTICEs raised while a statement runs go (the connection forwards them at once).
    notices: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    /// The session's user (`$user` in `search_path`).
    user: String,
}

impl Session {
    /// Sends NOTICEs raised during a statement (backfill progress) to `sink` as they happen.
    pub fn set_notice_sink(&mut self, sink: tokio::sync::mpsc::UnboundedSender<String>) {
        self.notices = Some(sink);
    }

    pub fn new(engine: Arc<Engine>, info: &SessionInfo) -> Result<Self> {
        let variables = Variables::default();
        let path = crate::names::SearchPath::new(&variables.get("search_path")?.1, &info.user);
        let view = Arc::new(SessionCatalog::new(
            Arc::clone(&engine),
            path,
            info.backend_pid,
        ));
        engine.sessions.register(info);
        let planner = SessionPlanner::new(Arc::clone(&view) as Arc<dyn CatalogSource>, info)?;
        Ok(Session {
            cursors: HashMap::new(),
            engine,
            planner,
            view,
            variables,
            transaction: None,
            notices: None,
            user: info.user.clone(),
        })
    }

    /// Sets a session variable outside of SQL (start-up parameters such as application_name).
    pub fn set_variable(&mut self, name: &str, value: &str) -> Result<()> {
        self.variables.set(name, Some(value.to_owned()))?;
        self.variable_changed(name)
    }

    /// Keeps what depends on a variable in step with it.
    fn variable_changed(&self, name: &str) -> Result<()> {
        if name.eq_ignore_ascii_case("timezone") {
            self.sync_time_zone()?;
        }
        if name.eq_ignore_ascii_case("search_path") {
            self.view.set_path(crate::names::SearchPath::new(
                &self.variables.get("search_path")?.1,
                &self.user,
            ));
        }
        Ok(())
    }

    pub fn variables(&self) -> &Variables {
        &self.variables
    }

    pub fn in_transaction(&self) -> bool {
        self.transaction.is_some()
    }

    pub fn transaction_failed(&self) -> bool {
        self.transaction.as_ref().is_some_and(|t| t.failed)
    }

    /// Runs one statement with its parameter values (one-row arrays, `$1` first).
    pub async fn execute(&mut self, statement: &Statement, params: &[ArrayRef]) -> Result<Outcome> {
        self.engine.wait_recovered(self.notices.as_ref()).await;
        let ends_transaction = is_transaction_end(statement);
        if self.transaction_failed() && !ends_transaction {
            return Err(Error::new(
                SqlState::IN_FAILED_SQL_TRANSACTION,
                "current transaction is aborted, commands ignored until end of transaction block",
            ));
        }
        let result = match self.variables.statement_timeout() {
            Some(limit) => {
                match tokio::time::timeout(limit, self.execute_inner(statement, params)).await {
                    Ok(result) => result,
                    Err(_) => Err(Error::new(
                        SqlState::QUERY_CANCELED,
                        "canceling statement due to statement timeout",
                    )),
                }
            }
            None => self.execute_inner(statement, params).await,
        };
        if result.is_err()
            && let Some(txn) = self.transaction.as_mut()
        {
            txn.failed = true;
        }
        result
    }

    async fn execute_inner(
        &mut self,
        statement: &Statement,
        params: &[ArrayRef],
    ) -> Result<Outcome> {
        // One statement reads one published moment of every view.
        self.view.begin_statement();
        self.catalog_statement_begins(statement);
        let outcome = self.execute_statement(statement, params).await;
        self.view.end_statement();
        let applied = self.catalog_statement_ends();
        let outcome = outcome?;
        applied?;
        if self.variables.implicit_flush() && self.transaction.is_none() && is_write(&outcome) {
            self.engine.flush().await?;
        }
        Ok(outcome)
    }

    /// The materialized view `name` (42809 when it is another kind of relation, 42P01 when
    /// there is none).
    fn materialized_view(&self, name: &QualifiedName) -> Result<Arc<crate::views::View>> {
        self.engine.view(name).ok_or_else(|| {
            if self.engine.name_taken(name) {
                Error::new(
                    SqlState::WRONG_OBJECT_TYPE,
                    format!("\"{}\" is not a materialized view", name.name),
                )
            } else {
                Error::new(
                    SqlState::UNDEFINED_TABLE,
                    format!("materialized view \"{}\" does not exist", name.name),
                )
            }
        })
    }

    fn writable_table(&self, name: &QualifiedName) -> Result<Arc<Table>> {
        if let Some(table) = self.engine.table(name) {
            return Ok(table);
        }
        if self.engine.source(name).is_some() {
            return Err(Error::new(SqlState::WRONG_OBJECT_TYPE, format!("\"{}\" is a source, not a table", name.name))
                .with_hint("a source's records come from its connector; ALTER SOURCE and SHOW CREATE SOURCE apply to it"));
        }
        Err(Error::new(
            SqlState::UNDEFINED_TABLE,
            format!("relation \"{}\" does not exist", name.display()),
        ))
    }

    fn named_source(&self, name: &QualifiedName) -> Result<Arc<crate::source::Source>> {
        self.engine.source(name).ok_or_else(|| {
            let state = if self.engine.name_taken(name) {
                SqlState::WRONG_OBJECT_TYPE
            } else {
                SqlState::UNDEFINED_TABLE
            };
            Error::new(state, format!("source \"{}\" does not exist", name.name))
        })
    }

    /// Marks the open transaction failed (after a COPY the client aborted, for instance).
    pub fn fail_transaction(&mut self) {
        if let Some(txn) = self.transaction.as_mut() {
            txn.failed = true;
        }
    }

    /// Keeps DataFusion's `now()` and timestamptz casts in the session's time zone.
    /// What the catalogs show while a statement runs: its text in `pg_stat_activity`, the
    /// session's settings for `current_setting` and `pg_settings`.
    fn catalog_statement_begins(&self, statement: &Statement) {
        let text = match statement {
            Statement::Sql(sql) => sql.to_string(),
            other => format!("{other:?}")
                .split(['(', ' ', '{'])
                .next()
                .unwrap_or_default()
                .to_owned(),
        };
        *self
            .view
            .variables
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = self.variables.clone();
        let application = self
            .variables
            .get("application_name")
            .map(|v| v.1)
            .unwrap_or_default();
        self.engine.sessions.update(
            self.view.pid,
            Some(text),
            self.transaction.is_some(),
            &application,
        );
    }

    /// Applies the settings `set_config()` made during the statement.
    fn catalog_statement_ends(&mut self) -> Result<()> {
        let pending = std::mem::take(
            &mut *self
                .view
                .pending_settings
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        let mut result = Ok(());
        for (name, value) in pending {
            result = result.and(self.set_variable(&name, &value));
        }
        let application = self
            .variables
            .get("application_name")
            .map(|v| v.1)
            .unwrap_or_default();
        self.engine.sessions.update(
            self.view.pid,
            None,
            self.transaction.is_some(),
            &application,
        );
        result
    }
}

fn is_write(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Command {
            tag: "INSERT" | "UPDATE" | "DELETE" | "COPY",
            ..
        } | Outcome::TransactionEnd { tag: "COMMIT" }
    )
}

fn is_transaction_end(statement: &Statement) -> bool {
    matches!(statement, Statement::Sql(s) if matches!(s.as_ref(), ast::Statement::Commit { .. } | ast::Statement::Rollback { .. }))
}

fn refuse_append_only(table: &Table, what: &str) -> Result<()> {
    if table.def.append_only {
        return Err(Error::unsupported(format!(
            "{what} is not supported on APPEND ONLY table \"{}\": it accepts only inserts",
            table.def.name
        )));
    }
    Ok(())
}

/// Relabels a batch with the table's schema, enforcing NOT NULL with PostgreSQL's message.
fn conform(table: &Table, batch: RecordBatch) -> Result<RecordBatch> {
    if batch.num_columns() != table.schema.fields().len() {
        return Err(Error::internal(format!(
            "a write to \"{}\" produced {} columns for {}",
            table.def.name,
            batch.num_columns(),
            table.schema.fields().len()
        )));
    }
    for (field, column) in table.schema.fields().iter().zip(batch.columns()) {
        if !field.is_nullable() && column.null_count() > 0 {
            return Err(Error::new(
                SqlState::NOT_NULL_VIOLATION,
                format!(
                    "null value in column \"{}\" of relation \"{}\" violates not-null constraint",
                    field.name(),
                    table.def.name
                ),
            ));
        }
        if column.data_type() != field.data_type() {
            return Err(Error::internal(format!(
                "column \"{}\" got {} for {}",
                field.name(),
                column.data_type(),
                field.data_type()
            )));
        }
    }
    let columns = table
        .schema
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(field, column)| eddy_sql::pg::assign::to_declared(column, field))
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(Arc::clone(&table.schema), columns)
        .map_err(|e| Error::internal(format!("labelling rows of \"{}\": {e}", table.def.name)))
}

/// The columns of `SHOW MATERIALIZED VIEWS` (its rows and its Describe alike).
const SHOW_VIEWS_COLUMNS: [&str; 3] = ["name", "status", "error"];

/// The columns of `SHOW SINKS`.
const SHOW_SINKS_COLUMNS: [&str; 7] = [
    "name",
    "from",
    "connector",
    "target",
    "committed_epoch",
    "rows",
    "error",
];

fn text_schema(names: &[&str]) -> SchemaRef {
    Arc::new(Schema::new(
        names
            .iter()
            .map(|n| Field::new(*n, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ))
}

/// `done`, preceded by NOTICEs.
pub(crate) fn with_notices(notices: Vec<Notice>, done: Outcome) -> Outcome {
    notices
        .into_iter()
        .rev()
        .fold(done, |then, n| Outcome::Notice {
            state: n.state,
            message: n.message,
            detail: n.detail,
            then: Box::new(then),
        })
}

pub(crate) fn rows_of_text(names: &[&str], rows: Vec<Vec<String>>) -> Result<Outcome> {
    let schema = text_schema(names);
    let columns: Vec<ArrayRef> = (0..names.len())
        .map(|c| {
            Arc::new(StringArray::from(
                rows.iter().map(|r| r[c].clone()).collect::<Vec<_>>(),
            )) as ArrayRef
        })
        .collect();
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns)
        .map_err(|e| Error::internal(e.to_string()))?;
    Ok(Outcome::Rows {
        schema,
        batches: vec![batch],
    })
}
