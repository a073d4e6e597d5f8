//! The dispatch of a statement to the code that runs it.

use super::*;

impl Session {
    /// Runs one parsed statement: DDL, DML, queries, transaction control, Eddy's own commands.
    pub(super) async fn execute_statement(
        &mut self,
        statement: &Statement,
        params: &[ArrayRef],
    ) -> Result<Outcome> {
        match statement {
            Statement::Flush => {
                // Views behind the others hold FLUSH until they caught up; it says which.
                let behind: Vec<(String, u64)> = self
                    .engine
                    .view_statuses()
                    .into_iter()
                    .filter(|v| v.lag_epochs > 0)
                    .map(|v| (v.name, v.lag_epochs))
                    .collect();
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
                let outcome = failed.into_iter().rev().fold(
                    Outcome::Command {
                        tag: "FLUSH",
                        rows: None,
                    },
                    |then, message| Outcome::Warning {
                        state: SqlState::WARNING,
                        message: format!("{message}; it is not up to date"),
                        then: Box::new(then),
                    },
                );
                Ok(behind
                    .into_iter()
                    .rev()
                    .fold(outcome, |then, (view, epochs)| Outcome::Notice {
                        state: SqlState::SUCCESSFUL_COMPLETION,
                        message: format!(
                            "materialized view {view} was {epochs} epochs behind the others; FLUSH waited for it to catch up"
                        ),
                        detail: None,
                        then: Box::new(then),
                    }))
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
                rows_of_text(&SHOW_VIEWS_COLUMNS, rows)
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
            Statement::ShowSinks => rows_of_text(&SHOW_SINKS_COLUMNS, self.engine.sink_rows()),
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
}
