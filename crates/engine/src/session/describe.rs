//! Describing a prepared statement: its parameters and result columns, without running it.

use super::*;

impl Session {
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
                return Ok(rows(text_schema(&SHOW_VIEWS_COLUMNS)));
            }
            Statement::ShowSources => return Ok(rows(text_schema(&["name"]))),
            Statement::ShowSinks => {
                return Ok(rows(text_schema(&SHOW_SINKS_COLUMNS)));
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
                    Planned::UpdateJoined { rows, .. } | Planned::Update { rows, .. } => {
                        Ok(StatementDescription {
                            parameters: rows.parameter_types()?,
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
}
