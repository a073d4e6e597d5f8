//! Statements parsed by sqlparser-rs rather than Eddy's own parser: queries and EXPLAIN (planned by
//! DataFusion), DML, transactions, DROP, ALTER TABLE, SHOW, SET, COPY, cursors.

use super::*;

impl Session {
    pub(super) async fn execute_sql(
        &mut self,
        sql: &ast::Statement,
        params: &[ArrayRef],
    ) -> Result<Outcome> {
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

    pub(super) async fn run_planned(
        &mut self,
        planned: Planned,
        params: &[ArrayRef],
    ) -> Result<Outcome> {
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

    /// Runs a plan whose rows have the table's columns and labels them with its schema,
    /// enforcing NOT NULL.
    pub(super) async fn collect_rows(
        &self,
        table: &Table,
        plan: QueryPlan,
    ) -> Result<Vec<RecordBatch>> {
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

    /// A write to a materialized view or a source is refused as PostgreSQL refuses writes to
    /// a materialized view (42809), before DataFusion plans it against the view's columns.
    pub(super) fn check_writable(&self, sql: &ast::Statement) -> Result<()> {
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
}
