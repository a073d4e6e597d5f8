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
use eddy_common::{ChangeBatch, Error, ObjectId, Result, SqlState};
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
mod dml;
mod transaction;

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

    async fn execute_statement(
        &mut self,
        statement: &Statement,
        params: &[ArrayRef],
    ) -> Result<Outcome> {
        match statement {
            Statement::Flush => {
                self.engine.flush().await?;
                // Failed views do not hold FLUSH back; it says which views it could not bring
                // up to date.
                let failed: Vec<String> = self
                    .engine
                    .runtime()
                    .failures()
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .values()
                    .map(|e| e.message.clone())
                    .collect();
                Ok(failed.into_iter().rev().fold(
                    Outcome::Command {
                        tag: "FLUSH",
                        rows: None,
                    },
                    |then, message| Outcome::Warning {
                        state: SqlState::WARNING,
                        message: format!("{message}; it is not up to date"),
                        then: Box::new(then),
                    },
                ))
            }
            Statement::Checkpoint => {
                self.engine.checkpoint().await?;
                Ok(Outcome::Command {
                    tag: "CHECKPOINT",
                    rows: None,
                })
            }
            Statement::Subscribe(_) | Statement::CopySubscribe(_) => Err(Error::unsupported(
                "SUBSCRIBE streams to a client connection; inside a function or a script use DECLARE c CURSOR FOR SUBSCRIBE ...; FETCH n c",
            )),
            Statement::DeclareSubscribeCursor { cursor, subscribe } => {
                self.declare_subscribe(cursor, subscribe).await
            }
            Statement::Fetch {
                cursor,
                count,
                timeout_ms,
                skip,
            } => self.fetch(cursor, *count, *timeout_ms, *skip).await,
            Statement::ShowMaterializedViews => {
                let rows = self
                    .engine
                    .view_statuses()
                    .into_iter()
                    .map(|v| vec![v.name, v.status.to_owned(), v.error.unwrap_or_default()])
                    .collect();
                rows_of_text(&["name", "status", "error"], rows)
            }
            Statement::ShowCreateMaterializedView(name) => {
                let name = self.existing_name(name)?;
                let view = self.materialized_view(&name)?;
                rows_of_text(
                    &["name", "create_sql"],
                    vec![vec![
                        name.display(),
                        eddy_sql::display_temporal(&view.def.sql),
                    ]],
                )
            }
            Statement::CreateTable(create) if create.source => {
                let done = Outcome::Command {
                    tag: "CREATE SOURCE",
                    rows: None,
                };
                let name = self.new_name(&create.name)?;
                if self.engine.create_source(create, &name).await?.is_some() {
                    Ok(done)
                } else {
                    Ok(relation_exists(&name.name, done))
                }
            }
            Statement::CreateTable(create) => {
                let name = self.new_name(&create.name)?;
                self.check_defaults(create).await?;
                let created = self.engine.create_table(create, &name).await?;
                let done = Outcome::Command {
                    tag: "CREATE TABLE",
                    rows: None,
                };
                if let Some(table) = created {
                    if let Err(e) = self.engine.start_connector(&table, true).await {
                        // A table whose source cannot be read is not kept.
                        let _ = self
                            .engine
                            .drop_objects(
                                std::slice::from_ref(&name),
                                true,
                                false,
                                ObjectKind::Table,
                            )
                            .await;
                        return Err(e);
                    }
                    Ok(done)
                } else {
                    Ok(relation_exists(&name.name, done))
                }
            }
            Statement::CreateMaterializedView {
                create,
                emit_on_close,
            } => self.create_materialized_view(create, *emit_on_close).await,
            Statement::CreateTableAs {
                name,
                if_not_exists,
                query,
                with_data,
            } => {
                self.create_table_as(name, *if_not_exists, query, *with_data, params)
                    .await
            }
            Statement::CreateTableLike {
                name,
                if_not_exists,
                like,
                including,
            } => {
                self.create_table_like(name, *if_not_exists, like, including)
                    .await
            }
            Statement::ReplayDeadLetters {
                name,
                source: false,
            } => {
                let name = self.existing_name(name)?;
                let table = self.writable_table(&name)?;
                let (replayed, left) = self.engine.replay_dead_letters(&table).await?;
                let done = Outcome::Command {
                    tag: "ALTER TABLE",
                    rows: None,
                };
                Ok(Outcome::Notice {
                    state: SqlState::SUCCESSFUL_COMPLETION,
                    message: format!(
                        "replayed {replayed} dead letters of \"{}\"; {left} still fail and stay",
                        name.display()
                    ),
                    detail: None,
                    then: Box::new(done),
                })
            }
            Statement::ReplayDeadLetters { name, source: true } => {
                let name = self.existing_name(name)?;
                let source = self.named_source(&name)?;
                let (replayed, left) = self.engine.replay_source_dead_letters(&source).await?;
                let done = Outcome::Command {
                    tag: "ALTER SOURCE",
                    rows: None,
                };
                Ok(Outcome::Notice {
                    state: SqlState::SUCCESSFUL_COMPLETION,
                    message: format!(
                        "replayed {replayed} dead letters of \"{}\" into the views reading it; {left} still fail and stay",
                        name.display()
                    ),
                    detail: None,
                    then: Box::new(done),
                })
            }
            Statement::RestartMaterializedView(name) => {
                let name = self.existing_name(name)?;
                let view = self.materialized_view(&name)?;
                let engine = Arc::clone(&self.engine);
                let (rebuilt, failed) = engine.restart_view(&view).await?;
                if let Some(e) = engine.view_failure(&view) {
                    return Err(e);
                }
                let done = Outcome::Command {
                    tag: "ALTER MATERIALIZED VIEW",
                    rows: None,
                };
                let message = format!(
                    "rebuilt from their inputs: materialized view {}",
                    rebuilt.join(", ")
                );
                Ok(if failed > 0 {
                    Outcome::Warning {
                        state: SqlState::WARNING,
                        message: format!(
                            "{message}; {failed} of them failed again (SHOW MATERIALIZED VIEWS)"
                        ),
                        then: Box::new(done),
                    }
                } else {
                    Outcome::Notice {
                        state: SqlState::SUCCESSFUL_COMPLETION,
                        message,
                        detail: None,
                        then: Box::new(done),
                    }
                })
            }
            Statement::AlterSourceDropNotNull { name, column } => {
                let name = self.existing_name(name)?;
                self.named_source(&name)?;
                self.engine
                    .drop_source_not_null(&name, &normalize_ident(column))
                    .await?;
                Ok(Outcome::Command {
                    tag: "ALTER SOURCE",
                    rows: None,
                })
            }
            Statement::DropSource {
                names,
                if_exists,
                cascade,
            } => {
                self.drop_statement(
                    names,
                    *if_exists,
                    *cascade,
                    ObjectKind::Source,
                    "DROP SOURCE",
                )
                .await
            }
            Statement::CreateSink {
                name,
                from,
                options,
                format,
                if_not_exists,
            } => {
                let name = self.new_name(name)?;
                let from = self.existing_name(from)?;
                let view = self.engine.view(&from).ok_or_else(|| {
                    Error::new(
                        SqlState::UNDEFINED_TABLE,
                        format!("materialized view \"{}\" does not exist", from.name),
                    )
                })?;
                let key = match options.iter().find(|(k, _)| k == "primary_key") {
                    Some((_, columns)) => columns
                        .split(',')
                        .map(|c| {
                            let c = c.trim();
                            view.schema.index_of(c).map_err(|_| Error::new(SqlState::UNDEFINED_COLUMN, format!("primary_key: materialized view \"{}\" has no column \"{c}\"", from.name)))
                        })
                        .collect::<Result<Vec<_>>>()?,
                    None => self.plan_stored_view(&view.def).await?.node.unique_key().unwrap_or_default(),
                };
                // As SHOW CREATE would give it, without the password.
                let shown: Vec<String> = options
                    .iter()
                    .filter(|(k, _)| k != "password")
                    .map(|(k, v)| format!("{k} = '{}'", v.replace('\'', "''")))
                    .collect();
                let mut sql = format!(
                    "CREATE SINK {} FROM {} WITH ({})",
                    crate::catalog::sql_name(&name),
                    crate::catalog::sql_name(&from),
                    shown.join(", ")
                );
                if let Some((envelope, encode)) = format {
                    sql.push_str(&format!(
                        " FORMAT {} ENCODE {}",
                        envelope.to_uppercase(),
                        encode.to_uppercase()
                    ));
                }
                self.engine
                    .create_sink(
                        name,
                        &from,
                        options.clone(),
                        format.clone(),
                        sql,
                        key,
                        *if_not_exists,
                    )
                    .await?;
                Ok(Outcome::Command {
                    tag: "CREATE SINK",
                    rows: None,
                })
            }
            Statement::DropSink { names, if_exists } => {
                let mut notices = Vec::new();
                let names = self.existing_names(names, *if_exists, &mut notices)?;
                notices.extend(self.engine.drop_sinks(&names, *if_exists).await?);
                Ok(with_notices(
                    notices,
                    Outcome::Command {
                        tag: "DROP SINK",
                        rows: None,
                    },
                ))
            }
            Statement::ShowSinks => rows_of_text(
                &[
                    "name",
                    "from",
                    "connector",
                    "target",
                    "committed_epoch",
                    "rows",
                    "error",
                ],
                self.engine.sink_rows(),
            ),
            Statement::ShowSources => rows_of_text(
                &["name"],
                self.engine
                    .source_names()
                    .into_iter()
                    .map(|n| vec![n.display()])
                    .collect(),
            ),
            Statement::ShowCreateSource(name) => {
                let name = self.existing_name(name)?;
                let source = self.named_source(&name)?;
                rows_of_text(
                    &["name", "create_sql"],
                    vec![vec![name.display(), source.def.create_sql_as("SOURCE")]],
                )
            }
            Statement::ShowCreateSink(name) => {
                let name = self.existing_name(name)?;
                let sql = self.engine.sink_sql(&name)?;
                rows_of_text(&["name", "create_sql"], vec![vec![name.display(), sql]])
            }
            Statement::Sql(sql) => self.execute_sql(sql, params).await,
        }
    }

    async fn execute_sql(&mut self, sql: &ast::Statement, params: &[ArrayRef]) -> Result<Outcome> {
        use ast::Statement as S;
        match sql {
            S::Explain { statement, analyze: false, .. } if matches!(statement.as_ref(), S::CreateView(c) if c.materialized) => {
                let S::CreateView(create) = statement.as_ref() else { return Err(Error::internal("not a view")) };
                let options = eddy_sql::windows::view_options(&create.options, false)?;
                let plan = self.planner.plan_view(&create.query, &options).await?;
                let text = plan.node.to_string();
                rows_of_text(&["QUERY PLAN"], text.lines().map(|l| vec![l.to_owned()]).collect())
            }
            S::Query(_) | S::Explain { .. } => {
                let planned = self.planner.plan(sql).await?;
                self.run_planned(planned, params).await
            }
            S::Insert(_) | S::Update(_) | S::Delete(_) => self.execute_write(sql, params).await,
            S::Truncate(truncate) => self.truncate(&truncate.table_names).await,
            S::StartTransaction { .. } => Ok(self.begin()),
            S::Commit { .. } => self.commit().await,
            S::Rollback { savepoint: None, .. } => Ok(self.rollback()),
            S::Rollback { savepoint: Some(name), .. } => self.rollback_to_savepoint(&normalize_ident(name)),
            S::Savepoint { name } => self.savepoint(normalize_ident(name)),
            S::ReleaseSavepoint { name } => self.release_savepoint(&normalize_ident(name)),
            S::Drop { object_type: ObjectType::Table, if_exists, names, cascade, .. } => self.drop_statement(names, *if_exists, *cascade, ObjectKind::Table, "DROP TABLE").await,
            S::Drop { object_type: ObjectType::MaterializedView, if_exists, names, cascade, .. } => {
                self.drop_statement(names, *if_exists, *cascade, ObjectKind::MaterializedView, "DROP MATERIALIZED VIEW").await
            }
            S::Drop { object_type: ObjectType::View, if_exists, names, cascade, .. } => self.drop_statement(names, *if_exists, *cascade, ObjectKind::View, "DROP VIEW").await,
            S::Drop { object_type: ObjectType::Schema, if_exists, names, cascade, .. } => self.drop_schema_statement(names, *if_exists, *cascade).await,
            S::Drop { object_type, if_exists: true, names, .. } if names.len() == 1 && matches!(object_type, ObjectType::Index | ObjectType::Sequence | ObjectType::Type | ObjectType::Role | ObjectType::Database) => {
                // Nothing of these kinds exists in Eddy: as PostgreSQL answers for a missing one.
                let notice = format!("{} \"{}\" does not exist, skipping", object_type.to_string().to_lowercase(), names[0]);
                let tag = match object_type {
                    ObjectType::Index => "DROP INDEX",
                    ObjectType::Sequence => "DROP SEQUENCE",
                    ObjectType::Type => "DROP TYPE",
                    ObjectType::Role => "DROP ROLE",
                    _ => "DROP DATABASE",
                };
                Ok(with_notices(vec![notice.into()], Outcome::Command { tag, rows: None }))
            }
            S::CreateSchema { schema_name, if_not_exists, .. } => self.create_schema_statement(schema_name, *if_not_exists).await,
            S::AlterTable(alter) => {
                let name = self.existing_name(&alter.name)?;
                for operation in &alter.operations {
                    match operation {
                        ast::AlterTableOperation::AlterColumn { column_name, op: ast::AlterColumnOperation::DropNotNull } => {
                            self.engine.drop_not_null(&name, &crate::catalog::normalize_ident(column_name)).await?;
                        }
                        ast::AlterTableOperation::AddColumn { if_not_exists, column_def, column_position: None, .. } => {
                            self.engine.add_column(&name, column_def, *if_not_exists).await?;
                        }
                        other => return Err(Error::unsupported(format!("ALTER TABLE ... {other} is not supported (ADD COLUMN, ALTER COLUMN c DROP NOT NULL and REPLAY DEAD LETTERS are)"))),
                    }
                }
                Ok(Outcome::Command { tag: "ALTER TABLE", rows: None })
            }
            S::CreateView(create) if create.materialized => self.create_materialized_view(create, false).await,
            S::CreateView(create) => self.create_plain_view(create).await,
            S::Drop { object_type, .. } => Err(Error::unsupported(format!("DROP {object_type} is not supported"))),
            S::ShowTables { .. } => Ok(self.show_tables()),
            S::ShowCreate { obj_type: ast::ShowCreateObject::Table, obj_name } => self.show_create_table(obj_name),
            S::ShowCreate { obj_type: ast::ShowCreateObject::View, obj_name } => self.show_create_view(obj_name),
            S::ShowCreate { obj_type, .. } => Err(Error::unsupported(format!("SHOW CREATE {obj_type} is not supported"))),
            S::ShowVariable { variable } => self.show_variable(variable),
            S::Set(set) => self.set(set),
            S::Copy { source, to: false, target: CopyTarget::Stdin, options, legacy_options, .. } => {
                self.copy_from_stdin(source, options, legacy_options).await
            }
            S::Copy { source, to: true, target: CopyTarget::Stdout, options, legacy_options, .. } => {
                self.copy_to_stdout(source, options, legacy_options, params).await
            }
            S::Copy { to, .. } => Err(Error::new(
                SqlState::INSUFFICIENT_PRIVILEGE,
                format!("COPY {} a file or program is not allowed: the server reads no files for clients", if *to { "to" } else { "from" }),
            )
            .with_hint("use COPY ... TO STDOUT or FROM STDIN (psql's \\copy does that)")),
            S::Close { cursor } => self.close(cursor),
            S::Declare { stmts } => match stmts.as_slice() {
                [declare] => self.declare_query(declare, params).await,
                _ => Err(Error::new(SqlState::SYNTAX_ERROR, "DECLARE declares one cursor")),
            },
            S::Discard { .. } => Ok(Outcome::Command { tag: "DISCARD ALL", rows: None }),
            S::Deallocate { .. } => Ok(Outcome::Command { tag: "DEALLOCATE", rows: None }),
            S::CreateTable(_) => Err(Error::internal("CREATE TABLE bypassed Eddy's parser")),
            other => {
                let text = other.to_string();
                let head: Vec<&str> = text.split_whitespace().take(2).collect();
                Err(Error::unsupported(format!("{} is not supported", head.join(" "))))
            }
        }
    }

    /// Describes a statement without running it (extended protocol).
    pub async fn describe(&mut self, statement: &Statement) -> Result<StatementDescription> {
        self.engine.wait_recovered(self.notices.as_ref()).await;
        let no_rows = StatementDescription {
            parameters: Vec::new(),
            columns: None,
        };
        let rows = |schema: SchemaRef| StatementDescription {
            parameters: Vec::new(),
            columns: Some(schema),
        };
        let sql = match statement {
            Statement::Sql(sql) => sql,
            Statement::Subscribe(subscribe) => {
                let (schema, _) = self.subscription_target(subscribe, false).await?;
                return Ok(rows(subscription_schema(&schema, subscribe.progress)));
            }
            Statement::Fetch { skip: true, .. } => return Ok(no_rows),
            Statement::Fetch { cursor, .. } => return Ok(rows(self.cursor_schema(cursor)?)),
            Statement::ShowMaterializedViews => {
                return Ok(rows(text_schema(&["name", "status", "error"])));
            }
            Statement::ShowSources => return Ok(rows(text_schema(&["name"]))),
            Statement::ShowSinks => {
                return Ok(rows(text_schema(&[
                    "name",
                    "from",
                    "connector",
                    "target",
                    "committed_epoch",
                    "rows",
                    "error",
                ])));
            }
            Statement::ShowCreateMaterializedView(_)
            | Statement::ShowCreateSource(_)
            | Statement::ShowCreateSink(_) => {
                return Ok(rows(text_schema(&["name", "create_sql"])));
            }
            Statement::CreateMaterializedView { .. }
            | Statement::Flush
            | Statement::Checkpoint
            | Statement::CreateTable(_)
            | Statement::CreateTableAs { .. }
            | Statement::CreateTableLike { .. }
            | Statement::CopySubscribe(_)
            | Statement::DeclareSubscribeCursor { .. }
            | Statement::ReplayDeadLetters { .. }
            | Statement::AlterSourceDropNotNull { .. }
            | Statement::RestartMaterializedView(_)
            | Statement::DropSource { .. }
            | Statement::CreateSink { .. }
            | Statement::DropSink { .. } => {
                return Ok(no_rows);
            }
        };
        use ast::Statement as S;
        match sql.as_ref() {
            S::Query(_) | S::Explain { .. } | S::Insert(_) | S::Update(_) | S::Delete(_) => {
                match self.planner.plan(sql).await? {
                    Planned::Query(q) => Ok(StatementDescription {
                        parameters: q.parameter_types()?,
                        columns: Some(q.schema()),
                    }),
                    Planned::Insert { source: q, .. } | Planned::Delete { old_rows: q, .. } => {
                        Ok(StatementDescription {
                            parameters: q.parameter_types()?,
                            columns: None,
                        })
                    }
                    Planned::UpdateJoined { rows, .. } => Ok(StatementDescription {
                        parameters: rows.parameter_types()?,
                        columns: None,
                    }),
                    Planned::Update {
                        old_rows, new_rows, ..
                    } => {
                        let mut parameters = new_rows.parameter_types()?;
                        for (i, t) in old_rows.parameter_types()?.into_iter().enumerate() {
                            if parameters.len() <= i {
                                parameters.resize(i + 1, None);
                            }
                            if parameters[i].is_none() {
                                parameters[i] = t;
                            }
                        }
                        Ok(StatementDescription {
                            parameters,
                            columns: None,
                        })
                    }
                }
            }
            S::Declare { stmts }
                if let [
                    ast::Declare {
                        for_query: Some(query),
                        ..
                    },
                ] = stmts.as_slice() =>
            {
                // A cursor's query may take parameters; DECLARE itself returns no rows.
                let query = ast::Statement::Query(query.clone());
                match self.planner.plan(&query).await? {
                    Planned::Query(q) => Ok(StatementDescription {
                        parameters: q.parameter_types()?,
                        columns: None,
                    }),
                    _ => Ok(no_rows),
                }
            }
            S::ShowTables { .. } => Ok(StatementDescription {
                parameters: Vec::new(),
                columns: Some(text_schema(&["name"])),
            }),
            S::ShowCreate { .. } => Ok(StatementDescription {
                parameters: Vec::new(),
                columns: Some(text_schema(&["name", "create_sql"])),
            }),
            S::ShowVariable { variable } => {
                let name = variable_name(variable);
                let column = if name.eq_ignore_ascii_case("all") {
                    vec!["name", "setting"]
                } else {
                    vec![self.variables.get(&name)?.0]
                };
                Ok(StatementDescription {
                    parameters: Vec::new(),
                    columns: Some(text_schema(&column)),
                })
            }
            _ => Ok(no_rows),
        }
    }

    async fn run_planned(&mut self, planned: Planned, params: &[ArrayRef]) -> Result<Outcome> {
        match planned {
            Planned::Query(query) => {
                let query = query.bind(params)?;
                let schema = query.schema();
                let batches = self.planner.execute(query).await?;
                Ok(Outcome::Rows { schema, batches })
            }
            _ => Err(Error::internal("a write reached the query path")),
        }
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

    /// Runs a plan whose rows have the table's columns and labels them with its schema,
    /// enforcing NOT NULL.
    async fn collect_rows(&self, table: &Table, plan: QueryPlan) -> Result<Vec<RecordBatch>> {
        let batches = self.planner.execute(plan).await?;
        let mut out = Vec::with_capacity(batches.len());
        for batch in batches {
            if batch.num_rows() == 0 {
                continue;
            }
            out.push(conform(table, batch)?);
        }
        Ok(out)
    }

    async fn create_materialized_view(
        &mut self,
        create: &ast::CreateView,
        emit_on_close: bool,
    ) -> Result<Outcome> {
        let name = self.new_name(&create.name)?;
        if self.engine.name_taken(&name) && create.if_not_exists {
            return Ok(relation_exists(
                &name.name,
                Outcome::Command {
                    tag: "CREATE MATERIALIZED VIEW",
                    rows: None,
                },
            ));
        }
        if create.or_replace {
            return Err(Error::unsupported(
                "CREATE OR REPLACE MATERIALIZED VIEW is not supported: drop the view first",
            ));
        }
        if !create.columns.is_empty() {
            return Err(Error::unsupported(
                "column names after the view name are not supported: alias the columns in the query",
            ));
        }
        let options = eddy_sql::windows::view_options(&create.options, emit_on_close)?;
        let plan = self.planner.plan_view(&create.query, &options).await?;
        let started = std::time::Instant::now();
        let stored = self.stored_form(create, &name)?;
        let sql = if emit_on_close {
            format!("{stored} EMIT ON WINDOW CLOSE")
        } else {
            stored.to_string()
        };
        let (rows, sources) = self
            .engine
            .create_view(name.clone(), sql, plan, None, self.notices.clone())
            .await?;
        let sources = match sources {
            0 => String::new(),
            1 => " and read its source to the end".to_owned(),
            n => format!(" and read its {n} sources to the end"),
        };
        Ok(Outcome::Notice {
            state: SqlState::SUCCESSFUL_COMPLETION,
            message: format!(
                "materialized view \"{}\" backfilled from {rows} rows{sources} in {} ms",
                name.display(),
                started.elapsed().as_millis()
            ),
            detail: None,
            then: Box::new(Outcome::Command {
                tag: "CREATE MATERIALIZED VIEW",
                rows: None,
            }),
        })
    }

    /// Plans a stored view again at start-up, under its original id.
    pub(crate) async fn restore_view(&mut self, def: &crate::catalog::ViewDef) -> Result<()> {
        let plan = self.plan_stored_view(def).await?;
        self.engine
            .create_view(def.qualified(), def.sql.clone(), plan, Some(def.id), None)
            .await
            .map(|_| ())
    }

    /// A write to a materialized view or a source is refused as PostgreSQL refuses writes to
    /// a materialized view (42809), before DataFusion plans it against the view's columns.
    fn check_writable(&self, sql: &ast::Statement) -> Result<()> {
        let relation = |t: &ast::TableWithJoins| match &t.relation {
            ast::TableFactor::Table { name, .. } => Some(name.clone()),
            _ => None,
        };
        let target = match sql {
            ast::Statement::Insert(insert) => match &insert.table {
                ast::TableObject::TableName(name) => Some(name.clone()),
                _ => None,
            },
            ast::Statement::Update(update) => relation(&update.table),
            ast::Statement::Delete(delete) => match &delete.from {
                ast::FromTable::WithFromKeyword(tables)
                | ast::FromTable::WithoutKeyword(tables) => tables.first().and_then(relation),
            },
            _ => None,
        };
        let Some(name) = target else { return Ok(()) };
        let name = self.existing_name(&name)?;
        let what = if self.engine.view(&name).is_some() {
            "materialized view"
        } else if self.engine.source(&name).is_some() {
            "source"
        } else {
            return Ok(());
        };
        Err(Error::new(
            SqlState::WRONG_OBJECT_TYPE,
            format!("cannot change {what} \"{}\"", name.name),
        ))
    }

    /// Plans a view stored in the catalog from its SQL.
    pub(crate) async fn plan_stored_view(
        &mut self,
        def: &crate::catalog::ViewDef,
    ) -> Result<eddy_sql::ViewPlan> {
        let parsed = eddy_sql::parse_statements(&def.sql)?;
        let (create, emit_on_close) = match parsed.first().map(|p| &p.statement) {
            Some(Statement::CreateMaterializedView {
                create,
                emit_on_close,
            }) => (create.clone(), *emit_on_close),
            _ => {
                return Err(Error::internal(
                    "stored view does not parse to one CREATE MATERIALIZED VIEW",
                ));
            }
        };
        let options = eddy_sql::windows::view_options(&create.options, emit_on_close)?;
        self.planner.plan_view(&create.query, &options).await
    }

    /// Resolves a SUBSCRIBE target to a view (a temporary one for queries and tables) and
    /// subscribes to it. Returns the subscription, the output schema and the temporary view.
    async fn start_subscription(
        &mut self,
        subscribe: &eddy_sql::Subscribe,
    ) -> Result<(crate::views::Subscription, SchemaRef, Option<ObjectId>)> {
        let (schema, target) = self.subscription_target(subscribe, true).await?;
        let (view_id, temporary) = match target {
            Some(SubscriptionTarget::View(id)) => (id, None),
            Some(SubscriptionTarget::Temporary(id)) => (id, Some(id)),
            None => return Err(Error::internal("subscription target was not created")),
        };
        let subscription = match self.engine.subscribe(view_id, subscribe.snapshot).await {
            Ok(s) => s,
            Err(e) => {
                if let Some(id) = temporary {
                    self.engine.drop_temporary_view(id);
                }
                return Err(e);
            }
        };
        Ok((
            subscription,
            subscription_schema(&schema, subscribe.progress),
            temporary,
        ))
    }

    /// The columns a SUBSCRIBE target has, and (when `create`) the view to subscribe to: the
    /// named view, or a temporary view made for a query or a table.
    async fn subscription_target(
        &mut self,
        subscribe: &eddy_sql::Subscribe,
        create: bool,
    ) -> Result<(SchemaRef, Option<SubscriptionTarget>)> {
        let query = match &subscribe.target {
            eddy_sql::SubscribeTarget::Name(name) => {
                let name = self.existing_name(name)?;
                if let Some(view) = self.engine.view(&name) {
                    return Ok((
                        Arc::clone(&view.schema),
                        Some(SubscriptionTarget::View(view.def.id)),
                    ));
                }
                if self.engine.table(&name).is_none()
                    && self.engine.source(&name).is_none()
                    && self.engine.plain_view(&name).is_none()
                {
                    return Err(Error::new(
                        SqlState::UNDEFINED_TABLE,
                        format!("relation \"{}\" does not exist", name.display()),
                    ));
                }
                let parsed = eddy_sql::parse_statements(&format!("SELECT * FROM {name}"))?;
                let Some(Statement::Sql(q)) = parsed.into_iter().next().map(|p| p.statement) else {
                    return Err(Error::internal("subscribe query"));
                };
                let ast::Statement::Query(q) = *q else {
                    return Err(Error::internal("subscribe query"));
                };
                q
            }
            eddy_sql::SubscribeTarget::Query(query) => query.clone(),
        };
        let plan = self
            .planner
            .plan_view(&query, &eddy_sql::ViewOptions::default())
            .await?;
        let schema = Arc::clone(&plan.schema);
        if !create {
            return Ok((schema, None));
        }
        let id = self.engine.create_temporary_view(plan).await?;
        Ok((schema, Some(SubscriptionTarget::Temporary(id))))
    }

    /// A never-ending change stream (streaming SUBSCRIBE and COPY (SUBSCRIBE) TO STDOUT).
    pub async fn open_subscription(
        &mut self,
        subscribe: &eddy_sql::Subscribe,
    ) -> Result<SubscriptionStream> {
        self.engine.wait_recovered(self.notices.as_ref()).await;
        let (subscription, schema, temporary_view) = self.start_subscription(subscribe).await?;
        Ok(SubscriptionStream {
            subscription,
            schema,
            progress: subscribe.progress,
            temporary_view,
            engine: Arc::clone(&self.engine),
        })
    }

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

    async fn copy_in_inner(&mut self, copy: &CopyIn, rows: RecordBatch) -> Result<Outcome> {
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

    /// Marks the open transaction failed (after a COPY the client aborted, for instance).
    pub fn fail_transaction(&mut self) {
        if let Some(txn) = self.transaction.as_mut() {
            txn.failed = true;
        }
    }

    fn show_tables(&self) -> Outcome {
        let names: Vec<String> = self
            .engine
            .table_names()
            .iter()
            .map(QualifiedName::display)
            .collect();
        let schema = text_schema(&["name"]);
        let column: ArrayRef = Arc::new(StringArray::from(names));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![column])
            .map_or_else(|_| Vec::new(), |b| vec![b]);
        Outcome::Rows {
            schema,
            batches: batch,
        }
    }

    fn show_create_table(&self, name: &ast::ObjectName) -> Result<Outcome> {
        let name = self.existing_name(name)?;
        let table = self.writable_table(&name)?;
        rows_of_text(
            &["name", "create_sql"],
            vec![vec![name.display(), table.def.create_sql()]],
        )
    }

    fn show_variable(&self, variable: &[ast::Ident]) -> Result<Outcome> {
        let name = variable_name(variable);
        if name.eq_ignore_ascii_case("all") {
            let rows = self
                .variables
                .all()
                .map(|(k, v)| vec![k.to_owned(), v.to_owned()])
                .collect();
            return rows_of_text(&["name", "setting"], rows);
        }
        let (canonical, value) = self.variables.get(&name)?;
        rows_of_text(&[canonical], vec![vec![value]])
    }

    fn set(&mut self, set: &ast::Set) -> Result<Outcome> {
        use ast::Set;
        let done = Outcome::Command {
            tag: "SET",
            rows: None,
        };
        match set {
            Set::SingleAssignment {
                variable, values, ..
            } => {
                let name = variable.to_string();
                let value = set_value(values)?;
                self.variables.set(&name, value)?;
                self.variable_changed(&name)?;
                Ok(done)
            }
            Set::SetTimeZone { value, .. } => {
                let value = set_value(std::slice::from_ref(value))?;
                self.variables.set("TimeZone", value)?;
                self.sync_time_zone()?;
                Ok(done)
            }
            Set::SetNames { charset_name, .. } => {
                self.variables
                    .set("client_encoding", Some(charset_name.value.clone()))?;
                Ok(done)
            }
            Set::SetTransaction { .. } | Set::SetSessionParam(_) => Ok(done),
            other => Err(Error::unsupported(format!("{other} is not supported"))),
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

    fn sync_time_zone(&self) -> Result<()> {
        let tz = match self.variables.time_zone() {
            crate::TimeZone::Named(tz) => tz.name().to_owned(),
            crate::TimeZone::Fixed(offset) => offset.to_string(),
        };
        self.planner.set_time_zone(&tz)
    }
}

/// A subscription read to its end by the server; dropping it ends the subscription.
pub struct SubscriptionStream {
    subscription: crate::views::Subscription,
    pub schema: SchemaRef,
    progress: bool,
    temporary_view: Option<ObjectId>,
    engine: Arc<Engine>,
}

impl SubscriptionStream {
    /// The rows of the next epoch; `None` once the view is gone.
    pub async fn next(&mut self) -> Result<Option<Vec<RecordBatch>>> {
        match self.subscription.events.recv().await {
            Some(event) => change_rows(&self.schema, self.progress, &event).map(Some),
            None => self.subscription.end().map(|()| None),
        }
    }
}

impl Drop for SubscriptionStream {
    fn drop(&mut self) {
        if let Some(id) = self.temporary_view {
            self.engine.drop_temporary_view(id);
        }
    }
}

/// One epoch of changes as cursor rows: epoch, diff, [progressed], the view's columns.
fn change_rows(
    schema: &SchemaRef,
    progress: bool,
    event: &crate::views::EpochChanges,
) -> Result<Vec<RecordBatch>> {
    use arrow::array::{BooleanArray, Int64Array};
    let mut out = Vec::new();
    let epoch = event.epoch as i64;
    if let Some(changes) = &event.changes {
        let n = changes.len();
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![epoch; n])),
            Arc::new(changes.diffs().clone()),
        ];
        if progress {
            columns.push(Arc::new(BooleanArray::from(vec![false; n])));
        }
        columns.extend(changes.rows().columns().iter().cloned());
        out.push(
            RecordBatch::try_new(Arc::clone(schema), columns)
                .map_err(|e| Error::internal(format!("cursor rows: {e}")))?,
        );
    }
    if progress {
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![epoch])),
            Arc::new(Int64Array::from(vec![None::<i64>])),
            Arc::new(BooleanArray::from(vec![true])),
        ];
        columns.extend(
            schema
                .fields()
                .iter()
                .skip(3)
                .map(|f| arrow::array::new_null_array(f.data_type(), 1)),
        );
        out.push(
            RecordBatch::try_new(Arc::clone(schema), columns)
                .map_err(|e| Error::internal(format!("progress row: {e}")))?,
        );
    }
    Ok(out)
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

fn variable_name(variable: &[ast::Ident]) -> String {
    variable
        .iter()
        .map(|i| i.value.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The value of `SET x = v`: literals and identifiers as text, `DEFAULT` as `None`.
fn set_value(values: &[ast::Expr]) -> Result<Option<String>> {
    use ast::{Expr, Value};
    let mut parts = Vec::new();
    for v in values {
        let text = match v {
            Expr::Value(v) => match &v.value {
                Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
                Value::Number(n, _) => n.to_string(),
                Value::Boolean(b) => b.to_string(),
                other => other.to_string(),
            },
            Expr::Identifier(i)
                if i.value.eq_ignore_ascii_case("default") && i.quote_style.is_none() =>
            {
                return Ok(None);
            }
            Expr::Identifier(i) => i.value.clone(),
            Expr::UnaryOp {
                op: ast::UnaryOperator::Minus,
                expr,
            } => format!("-{expr}"),
            Expr::UnaryOp {
                op: ast::UnaryOperator::Plus,
                expr,
            } => format!("+{expr}"),
            Expr::Interval(_) => {
                return Err(Error::unsupported("SET ... TO INTERVAL is not supported"));
            }
            other => other.to_string(),
        };
        parts.push(text);
    }
    Ok(Some(parts.join(", ")))
}

enum SubscriptionTarget {
    View(ObjectId),
    Temporary(ObjectId),
}

/// `eddy_epoch`, `eddy_diff` (and `eddy_progressed` with PROGRESS), then the view's columns.
fn subscription_schema(view: &SchemaRef, progress: bool) -> SchemaRef {
    let mut fields = vec![
        Field::new("eddy_epoch", DataType::Int64, false),
        Field::new("eddy_diff", DataType::Int64, true),
    ];
    if progress {
        fields.push(Field::new("eddy_progressed", DataType::Boolean, true));
    }
    fields.extend(view.fields().iter().map(|f| f.as_ref().clone()));
    Arc::new(Schema::new(fields))
}

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
