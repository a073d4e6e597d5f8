//! Write statements: `INSERT` (with `ON CONFLICT DO NOTHING | DO UPDATE`), `UPDATE` (with
//! `FROM`), `DELETE` (with `USING`), each with `RETURNING`; and `TRUNCATE`.
//!
//! Every write becomes one set of changes to one table, checked and applied atomically. Outside
//! a transaction the statement holds the write lock from reading the table to queuing its
//! commit, so `ON CONFLICT` decides against contents nobody else changes meanwhile.
//!
//! `ON CONFLICT (key) DO UPDATE` runs as PostgreSQL defines it: the proposed rows whose key the
//! table holds become `UPDATE t SET ... FROM excluded WHERE t.key = excluded.key [AND cond]`
//! (the proposed rows are the statement-local relation `excluded`), the others are inserted.
//! `RETURNING` is a query over the rows written, under the table's name or alias.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use eddy_common::{ChangeBatch, Error, Result, SqlState};
use eddy_connectors::RowKind;
use eddy_sql::{Planned, Statement, ast};

use super::{Outcome, Session, conform, refuse_append_only};
use crate::Table;
use crate::catalog::normalize_ident;
use crate::table::TableData;

/// The relation `ON CONFLICT DO UPDATE` reads the proposed rows from.
const EXCLUDED: &str = "eddy_statement_excluded";
/// The relation `RETURNING` reads the written rows from.
const WRITTEN: &str = "eddy_statement_written";

/// What a write statement did: the changes, its tag and count, and the rows RETURNING sees.
struct Written {
    table: Arc<Table>,
    changes: Vec<ChangeBatch>,
    tag: &'static str,
    count: usize,
    returned: Vec<RecordBatch>,
}

impl Session {
    /// Evaluates each `DEFAULT` of a `CREATE TABLE` cast to its column's type, so a default
    /// that cannot become one (`INT DEFAULT 'x'`) is refused at CREATE, as in PostgreSQL.
    pub(super) async fn check_defaults(&self, create: &eddy_sql::CreateTable) -> Result<()> {
        for column in &create.columns {
            for option in &column.options {
                let ast::ColumnOption::Default(expr) = &option.option else {
                    continue;
                };
                crate::catalog::bind_default(expr, "")?;
                let sql = format!("SELECT CAST(({expr}) AS {})", column.data_type);
                let Planned::Query(query) = self.planner.plan(&single_statement(&sql)?).await?
                else {
                    return Err(Error::internal("a default's check is a query"));
                };
                self.planner.execute(query).await?;
            }
        }
        Ok(())
    }

    /// INSERT, UPDATE or DELETE, with their PostgreSQL clauses.
    pub(super) async fn execute_write(
        &mut self,
        sql: &ast::Statement,
        params: &[ArrayRef],
    ) -> Result<Outcome> {
        self.check_writable(sql)?;
        // Outside a transaction, a write holds the write lock from the moment it reads the
        // table until its commit is queued, so concurrent writes serialize.
        let guard = match self.transaction {
            None => Some(self.engine.lock_writes().await),
            Some(_) => None,
        };
        // With FROM / USING, PostgreSQL's `RETURNING *` includes the other tables' columns,
        // which Eddy's RETURNING (over the written rows) does not have.
        let (joined, returning) = match sql {
            ast::Statement::Delete(delete) => (delete.using.is_some(), delete.returning.as_ref()),
            ast::Statement::Update(update) => (update.from.is_some(), update.returning.as_ref()),
            _ => (false, None),
        };
        if joined
            && returning.is_some_and(|items| {
                items
                    .iter()
                    .any(|i| matches!(i, ast::SelectItem::Wildcard(_)))
            })
        {
            return Err(Error::unsupported(
                "RETURNING * with FROM or USING is not supported: name the target table's columns (RETURNING t.*)",
            ));
        }
        let mut statement = sql.clone();
        let (returning, alias) = take_returning(&mut statement);
        let on_conflict = match &mut statement {
            ast::Statement::Insert(insert) => {
                // The alias names the table in ON CONFLICT and RETURNING only.
                insert.table_alias = None;
                insert.on.take()
            }
            _ => None,
        };
        let planned = self.planner.plan(&statement).await?;
        let written = match planned {
            Planned::Insert { table, source } => {
                let table = self.writable_table(&table)?;
                let proposed = self.collect_rows(&table, source.bind(params)?).await?;
                match on_conflict {
                    None => {
                        let count = proposed.iter().map(RecordBatch::num_rows).sum();
                        let changes = proposed.iter().cloned().map(ChangeBatch::inserts).collect();
                        Written {
                            table,
                            changes,
                            tag: "INSERT",
                            count,
                            returned: proposed,
                        }
                    }
                    Some(ast::OnInsert::OnConflict(on)) => {
                        self.insert_on_conflict(table, proposed, &on, alias.as_deref(), params)
                            .await?
                    }
                    Some(other) => {
                        return Err(Error::unsupported(format!(
                            "INSERT ... {other} is not supported"
                        )));
                    }
                }
            }
            Planned::Delete { table, old_rows } => {
                let table = self.writable_table(&table)?;
                refuse_append_only(&table, "DELETE")?;
                let old = self.collect_rows(&table, old_rows.bind(params)?).await?;
                let count = old.iter().map(RecordBatch::num_rows).sum();
                let changes = old.iter().cloned().map(ChangeBatch::retractions).collect();
                Written {
                    table,
                    changes,
                    tag: "DELETE",
                    count,
                    returned: old,
                }
            }
            Planned::Update { table, rows } => {
                let table = self.writable_table(&table)?;
                refuse_append_only(&table, "UPDATE")?;
                let (old, new) = self.update_rows(&table, rows.bind(params)?).await?;
                let count = old.num_rows();
                let changes = vec![
                    ChangeBatch::retractions(old),
                    ChangeBatch::inserts(new.clone()),
                ];
                Written {
                    table,
                    changes,
                    tag: "UPDATE",
                    count,
                    returned: vec![new],
                }
            }
            Planned::UpdateJoined { table, rows } => {
                let table = self.writable_table(&table)?;
                refuse_append_only(&table, "UPDATE")?;
                let (old, new) = self.joined_update(&table, rows.bind(params)?).await?;
                let count = old.num_rows();
                let changes = vec![
                    ChangeBatch::retractions(old),
                    ChangeBatch::inserts(new.clone()),
                ];
                Written {
                    table,
                    changes,
                    tag: "UPDATE",
                    count,
                    returned: vec![new],
                }
            }
            Planned::Query(_) => {
                return Err(Error::internal("a write statement planned as a query"));
            }
        };
        let returned = match &returning {
            Some(items) => Some(
                self.returning(
                    &written.table,
                    alias.as_deref(),
                    items,
                    written.returned,
                    params,
                )
                .await?,
            ),
            None => None,
        };
        self.write(guard, written.table, written.changes).await?;
        Ok(match returned {
            Some((schema, batches)) => {
                let tag = if written.tag == "INSERT" {
                    "INSERT 0"
                } else {
                    written.tag
                };
                Outcome::TaggedRows {
                    tag,
                    schema,
                    batches,
                    binary: false,
                }
            }
            None => Outcome::Command {
                tag: written.tag,
                rows: Some(written.count),
            },
        })
    }

    /// The rows an `UPDATE` replaces and their new versions, from one plan whose rows are
    /// the table's columns then the new values, in the table's order and types.
    async fn update_rows(
        &self,
        table: &Table,
        rows: eddy_sql::QueryPlan,
    ) -> Result<(RecordBatch, RecordBatch)> {
        let (schema, rows) = self.updated_rows(rows).await?;
        let width = table.schema.fields().len();
        if rows.num_columns() != 2 * width {
            return Err(Error::internal(format!(
                "UPDATE of \"{}\" produced {} columns for {width}",
                table.def.name,
                rows.num_columns()
            )));
        }
        Ok((
            table_rows(table, &schema, &rows, 0..width)?,
            table_rows(table, &schema, &rows, width..2 * width)?,
        ))
    }

    /// An UPDATE's plan run into one batch, and its columns.
    async fn updated_rows(&self, plan: eddy_sql::QueryPlan) -> Result<(SchemaRef, RecordBatch)> {
        let schema = plan.schema();
        let batches = self.planner.execute(plan).await?;
        let rows = arrow::compute::concat_batches(&schema, &batches)
            .map_err(|e| Error::internal(format!("updated rows: {e}")))?;
        Ok((schema, rows))
    }

    /// The rows an `UPDATE ... FROM` replaces and their new versions, each updated row once.
    async fn joined_update(
        &self,
        table: &Table,
        rows: eddy_sql::QueryPlan,
    ) -> Result<(RecordBatch, RecordBatch)> {
        let (schema, rows) = self.updated_rows(rows).await?;
        let width = table.schema.fields().len();
        let old = table_rows(table, &schema, &rows, 0..width)?;
        let mut columns = old.columns().to_vec();
        for (i, field) in schema.fields().iter().enumerate().skip(width) {
            let Some(name) = field.name().strip_prefix("eddy_set_") else {
                continue;
            };
            let c = table
                .schema
                .index_of(name)
                .map_err(|_| crate::catalog::undefined_column(name, &table.def.name))?;
            let options = arrow::compute::CastOptions {
                safe: false,
                ..Default::default()
            };
            columns[c] = arrow::compute::cast_with_options(rows.column(i), table.schema.field(c).data_type(), &options)
                .map_err(|e| Error::new(SqlState::DATATYPE_MISMATCH, format!("column \"{name}\" is of type {} but the new value cannot be cast to it: {e}", table.schema.field(c).data_type())))?;
        }
        // Labelled as nullable first: conform refuses a NULL in a NOT NULL column with
        // PostgreSQL's error (23502), where labelling with the table's schema failed (XX000).
        let labels: Vec<arrow::datatypes::Field> = table
            .schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let new = conform(
            table,
            RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(labels)), columns)
                .map_err(|e| Error::internal(format!("updated rows: {e}")))?,
        )?;
        if old.num_rows() <= 1 {
            return Ok((old, new));
        }
        let keep = arrow::array::UInt32Array::from(
            self.view
                .with_table_data_mut(table, |data| data.first_matches(&old))??,
        );
        let take = |b: &RecordBatch| {
            arrow::compute::take_record_batch(b, &keep)
                .map_err(|e| Error::internal(format!("updated rows: {e}")))
        };
        Ok((take(&old)?, take(&new)?))
    }

    async fn insert_on_conflict(
        &self,
        table: Arc<Table>,
        proposed: Vec<RecordBatch>,
        on: &ast::OnConflict,
        alias: Option<&str>,
        params: &[ArrayRef],
    ) -> Result<Written> {
        let name = table.def.name.clone();
        let key = &table.def.primary_key;
        if let Some(target) = &on.conflict_target {
            let matches = match target {
                ast::ConflictTarget::Columns(columns) => {
                    let mut named: Vec<usize> = columns
                        .iter()
                        .filter_map(|c| table.schema.index_of(&normalize_ident(c)).ok())
                        .collect();
                    named.sort_unstable();
                    named.dedup();
                    let mut pk = key.clone();
                    pk.sort_unstable();
                    named.len() == columns.len() && named == pk
                }
                ast::ConflictTarget::OnConstraint(constraint) => {
                    eddy_sql::name_parts(constraint)?.1 == format!("{name}_pkey")
                }
            };
            if !matches || key.is_empty() {
                return Err(Error::new(
                    SqlState::INVALID_COLUMN_REFERENCE,
                    "there is no unique or exclusion constraint matching the ON CONFLICT specification",
                ));
            }
        }
        let proposed = arrow::compute::concat_batches(&table.schema, &proposed)
            .map_err(|e| Error::internal(format!("proposed rows: {e}")))?;
        if key.is_empty() {
            // Without a key nothing conflicts (PostgreSQL: no constraint to infer).
            if matches!(on.action, ast::OnConflictAction::DoUpdate(_)) {
                return Err(Error::new(
                    SqlState::INVALID_COLUMN_REFERENCE,
                    "ON CONFLICT DO UPDATE requires inference specification or constraint name",
                )
                .with_hint("For example, ON CONFLICT (column_name)."));
            }
            let count = proposed.num_rows();
            return Ok(Written {
                table,
                changes: vec![ChangeBatch::inserts(proposed.clone())],
                tag: "INSERT",
                count,
                returned: vec![proposed],
            });
        }
        // Rows whose key is held (or repeats an earlier proposed row) come back rejected.
        let kinds = vec![RowKind::Insert; proposed.num_rows()];
        let (fresh, rejected) = self
            .view
            .with_table_data_mut(&table, |data| data.resolve(&proposed, &kinds))??;
        let inserted = fresh.rows().clone();
        let assignments = match &on.action {
            ast::OnConflictAction::DoNothing => {
                let count = inserted.num_rows();
                return Ok(Written {
                    table,
                    changes: vec![fresh],
                    tag: "INSERT",
                    count,
                    returned: vec![inserted],
                });
            }
            ast::OnConflictAction::DoUpdate(update) => update,
        };
        let conflicting: Vec<u32> = rejected.iter().map(|(i, _)| *i as u32).collect();
        let excluded = arrow::compute::take_record_batch(
            &proposed,
            &arrow::array::UInt32Array::from(conflicting),
        )
        .map_err(|e| Error::internal(format!("excluded rows: {e}")))?;
        if has_repeated_key(&proposed, key)? {
            return Err(Error::new(SqlState::CARDINALITY_VIOLATION, "ON CONFLICT DO UPDATE command cannot affect row a second time")
                .with_hint("Ensure that no rows proposed for insertion within the same command have duplicate constrained values."));
        }
        let mut changes = vec![fresh];
        let mut returned = vec![inserted];
        let mut count = returned[0].num_rows();
        if excluded.num_rows() > 0 {
            let target = alias.map_or_else(|| crate::quote_ident(&name), crate::quote_ident);
            let on_key: Vec<String> = key
                .iter()
                .map(|&c| {
                    let column = crate::quote_ident(table.schema.field(c).name());
                    format!("{target}.{column} = excluded.{column}")
                })
                .collect();
            let mut sql = format!(
                "UPDATE {} AS {target} SET {} FROM {EXCLUDED} AS excluded WHERE {}",
                crate::quote_ident(&name),
                assignments
                    .assignments
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                on_key.join(" AND ")
            );
            if let Some(condition) = &assignments.selection {
                sql.push_str(&format!(" AND ({condition})"));
            }
            let update = single_statement(&sql)?;
            let view = Arc::clone(&self.view);
            let _excluded = view.local(EXCLUDED, Arc::clone(&table.schema), vec![excluded]);
            let Planned::UpdateJoined { rows, .. } = self.planner.plan(&update).await? else {
                return Err(Error::internal(
                    "ON CONFLICT DO UPDATE did not plan as an UPDATE ... FROM",
                ));
            };
            let (old, new) = self.joined_update(&table, rows.bind(params)?).await?;
            count += old.num_rows();
            changes.push(ChangeBatch::retractions(old));
            changes.push(ChangeBatch::inserts(new.clone()));
            returned.push(new);
            returned = vec![in_proposed_order(&proposed, &returned, key)?];
        }
        Ok(Written {
            table,
            changes,
            tag: "INSERT",
            count,
            returned,
        })
    }

    /// Evaluates a RETURNING list over the rows written.
    async fn returning(
        &self,
        table: &Table,
        alias: Option<&str>,
        items: &[ast::SelectItem],
        rows: Vec<RecordBatch>,
        params: &[ArrayRef],
    ) -> Result<(SchemaRef, Vec<RecordBatch>)> {
        let name = alias.map_or_else(|| crate::quote_ident(&table.def.name), crate::quote_ident);
        let list: Vec<String> = items.iter().map(ToString::to_string).collect();
        let query = single_statement(&format!(
            "SELECT {} FROM {WRITTEN} AS {name}",
            list.join(", ")
        ))?;
        let rows = rows.into_iter().filter(|b| b.num_rows() > 0).collect();
        let view = Arc::clone(&self.view);
        let _written = view.local(WRITTEN, Arc::clone(&table.schema), rows);
        let Planned::Query(plan) = self.planner.plan(&query).await? else {
            return Err(Error::internal("RETURNING did not plan as a query"));
        };
        let plan = plan.bind(params)?;
        let schema = plan.schema();
        Ok((schema, self.planner.execute(plan).await?))
    }

    /// `TRUNCATE [TABLE] t, ...`: every row retracted, in one commit (views downstream see
    /// them all go at once).
    pub(super) async fn truncate(&mut self, names: &[ast::TruncateTableTarget]) -> Result<Outcome> {
        let mut tables = Vec::with_capacity(names.len());
        for target in names {
            let name = self.existing_name(&target.name)?;
            let table = self.writable_table(&name)?;
            if self.engine.view(&name).is_some() {
                return Err(Error::new(
                    SqlState::WRONG_OBJECT_TYPE,
                    format!("\"{}\" is not a table", name.name),
                ));
            }
            refuse_append_only(&table, "TRUNCATE")?;
            tables.push(table);
        }
        let guard = match self.transaction {
            None => Some(self.engine.lock_writes().await),
            Some(_) => None,
        };
        let mut writes = Vec::with_capacity(tables.len());
        for table in tables {
            let snapshot = self
                .view
                .with_table_data_mut(&table, TableData::snapshot)??;
            let changes: Vec<ChangeBatch> = snapshot
                .iter()
                .filter(|b| b.num_rows() > 0)
                .map(|b| conform(&table, b.clone()).map(ChangeBatch::retractions))
                .collect::<Result<_>>()?;
            writes.push((table, changes));
        }
        match guard {
            Some(guard) => self.engine.commit(guard, writes, &[], None).await?,
            None => {
                for (table, changes) in writes {
                    self.write(None, table, changes).await?;
                }
            }
        }
        Ok(Outcome::Command {
            tag: "TRUNCATE TABLE",
            rows: None,
        })
    }
}

/// Columns `range` of an UPDATE's `rows` as rows of `table`: labelled with the plan's fields
/// first, so that [`conform`] refuses a NULL in a NOT NULL column with PostgreSQL's error.
fn table_rows(
    table: &Table,
    schema: &SchemaRef,
    rows: &RecordBatch,
    range: std::ops::Range<usize>,
) -> Result<RecordBatch> {
    let fields = schema.fields()[range.clone()].to_vec();
    let batch = RecordBatch::try_new_with_options(
        Arc::new(arrow::datatypes::Schema::new(fields)),
        rows.columns()[range].to_vec(),
        &arrow::array::RecordBatchOptions::new().with_row_count(Some(rows.num_rows())),
    )
    .map_err(|e| Error::internal(format!("updated rows: {e}")))?;
    conform(table, batch)
}

/// Takes the RETURNING list off a write, with the name it reads the target by (its alias).
fn take_returning(
    statement: &mut ast::Statement,
) -> (Option<Vec<ast::SelectItem>>, Option<String>) {
    match statement {
        ast::Statement::Insert(insert) => (
            insert.returning.take(),
            insert
                .table_alias
                .as_ref()
                .map(|a| normalize_ident(&a.alias)),
        ),
        ast::Statement::Update(update) => {
            let alias = match &update.table.relation {
                ast::TableFactor::Table {
                    alias: Some(alias), ..
                } => Some(normalize_ident(&alias.name)),
                _ => None,
            };
            (update.returning.take(), alias)
        }
        ast::Statement::Delete(delete) => (delete.returning.take(), None),
        _ => (None, None),
    }
}

fn single_statement(sql: &str) -> Result<ast::Statement> {
    match eddy_sql::parse_statements(sql)?
        .into_iter()
        .next()
        .map(|p| p.statement)
    {
        Some(Statement::Sql(statement)) => Ok(*statement),
        _ => Err(Error::internal(format!(
            "{sql} did not parse to one statement"
        ))),
    }
}

/// The `key` columns of `rows`, row-encoded (comparable as bytes).
fn key_rows(rows: &RecordBatch, key: &[usize]) -> Result<arrow::row::Rows> {
    let fields = key
        .iter()
        .map(|&c| arrow::row::SortField::new(rows.schema().field(c).data_type().clone()))
        .collect();
    let converter = arrow::row::RowConverter::new(fields)
        .map_err(|e| Error::internal(format!("key converter: {e}")))?;
    let columns: Vec<ArrayRef> = key.iter().map(|&c| Arc::clone(rows.column(c))).collect();
    converter
        .convert_columns(&columns)
        .map_err(|e| Error::internal(format!("encode keys: {e}")))
}

/// Whether two of `rows` have the same values in the `key` columns.
fn has_repeated_key(rows: &RecordBatch, key: &[usize]) -> Result<bool> {
    if rows.num_rows() < 2 {
        return Ok(false);
    }
    let keys = key_rows(rows, key)?;
    let mut seen = std::collections::HashSet::with_capacity(rows.num_rows());
    Ok((0..rows.num_rows()).any(|i| !seen.insert(keys.row(i).data().to_vec())))
}

/// The rows an `INSERT ... ON CONFLICT DO UPDATE` wrote, inserted and updated, in the order
/// they were proposed (RETURNING's order in PostgreSQL). Keys are unique among the proposed
/// rows (a repeat is 21000 before this), so each written row is found by its key.
fn in_proposed_order(
    proposed: &RecordBatch,
    written: &[RecordBatch],
    key: &[usize],
) -> Result<RecordBatch> {
    let schema = proposed.schema();
    let all = arrow::compute::concat_batches(&schema, written)
        .map_err(|e| Error::internal(format!("written rows: {e}")))?;
    let written_keys = key_rows(&all, key)?;
    let mut at: std::collections::HashMap<&[u8], u32> =
        std::collections::HashMap::with_capacity(all.num_rows());
    for i in 0..all.num_rows() {
        at.insert(written_keys.row(i).data(), i as u32);
    }
    let proposed_keys = key_rows(proposed, key)?;
    let order: Vec<u32> = (0..proposed.num_rows())
        .filter_map(|i| at.get(proposed_keys.row(i).data()).copied())
        .collect();
    arrow::compute::take_record_batch(&all, &arrow::array::UInt32Array::from(order))
        .map_err(|e| Error::internal(format!("written rows in order: {e}")))
}
