//! `CREATE TABLE t AS query [WITH [NO] DATA]` and `CREATE TABLE t (LIKE s)`: a table whose
//! columns come from a query's result or another relation, created through the ordinary
//! `CREATE TABLE` path (so it is stored, logged and listed like any other) and, for CTAS,
//! filled with the query's rows in one write.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::Schema;
use eddy_common::{ChangeBatch, Error, Result, SqlState};
use eddy_sql::{Planned, Statement, ast};

use super::{Outcome, Session, conform};

impl Session {
    pub(super) async fn create_table_as(
        &mut self,
        name: &ast::ObjectName,
        if_not_exists: bool,
        query: &ast::Query,
        with_data: bool,
        params: &[ArrayRef],
    ) -> Result<Outcome> {
        let table_name = self.new_name(name)?;
        if self.engine.name_taken(&table_name) && if_not_exists {
            return Ok(exists_skipping(&table_name.name, "CREATE TABLE AS"));
        }
        let Planned::Query(plan) = self
            .planner
            .plan(&ast::Statement::Query(Box::new(query.clone())))
            .await?
        else {
            return Err(Error::internal("CREATE TABLE AS did not plan a query"));
        };
        let plan = plan.bind(params)?;
        let schema = plan.schema();
        let batches = if with_data {
            self.planner.execute(plan).await?
        } else {
            Vec::new()
        };
        self.create_table_with_columns(name, &schema, false).await?;
        let table = self.writable_table(&table_name)?;
        let mut rows = Vec::with_capacity(batches.len());
        for batch in batches.into_iter().filter(|b| b.num_rows() > 0) {
            // The stored column types may be wider than the query's (an unconstrained numeric).
            let options = arrow::compute::CastOptions {
                safe: false,
                ..Default::default()
            };
            let columns = batch
                .columns()
                .iter()
                .zip(table.schema.fields())
                .map(|(c, f)| {
                    arrow::compute::cast_with_options(c, f.data_type(), &options).map_err(|e| {
                        Error::new(
                            SqlState::DATATYPE_MISMATCH,
                            format!("column \"{}\": {e}", f.name()),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let options =
                arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
            let batch =
                RecordBatch::try_new_with_options(Arc::clone(&table.schema), columns, &options)
                    .map_err(|e| Error::internal(format!("CREATE TABLE AS rows: {e}")))?;
            rows.push(conform(&table, batch)?);
        }
        let count = rows.iter().map(RecordBatch::num_rows).sum();
        if count > 0 {
            self.write(
                None,
                table,
                rows.into_iter().map(ChangeBatch::inserts).collect(),
            )
            .await?;
        }
        if !with_data {
            return Ok(Outcome::Command {
                tag: "CREATE TABLE AS",
                rows: None,
            });
        }
        Ok(Outcome::Command {
            tag: "SELECT",
            rows: Some(count),
        })
    }

    pub(super) async fn create_table_like(
        &mut self,
        name: &ast::ObjectName,
        if_not_exists: bool,
        like: &ast::ObjectName,
        including: &[String],
    ) -> Result<Outcome> {
        if let Some(what) = including.first() {
            return Err(Error::unsupported(format!(
                "CREATE TABLE (LIKE ... INCLUDING {what}) is not supported: LIKE copies the columns, their types and NOT NULL"
            )));
        }
        let table_name = self.new_name(name)?;
        if self.engine.name_taken(&table_name) && if_not_exists {
            return Ok(exists_skipping(&table_name.name, "CREATE TABLE"));
        }
        let source = self.existing_name(like)?;
        let schema = match (
            self.engine.table(&source),
            self.engine.view(&source),
            self.engine.source(&source),
        ) {
            (Some(t), _, _) => Arc::clone(&t.schema),
            (_, Some(v), _) => Arc::clone(&v.schema),
            (_, _, Some(s)) => Arc::clone(&s.schema),
            _ => match self.engine.plain_view(&source) {
                Some(view) => view.arrow_schema()?,
                None => {
                    return Err(Error::new(
                        SqlState::UNDEFINED_TABLE,
                        format!("relation \"{}\" does not exist", source.display()),
                    ));
                }
            },
        };
        self.create_table_with_columns(name, &schema, true).await?;
        Ok(Outcome::Command {
            tag: "CREATE TABLE",
            rows: None,
        })
    }

    /// `CREATE TABLE name (columns of schema)`; NOT NULL kept when `not_null`.
    async fn create_table_with_columns(
        &mut self,
        name: &ast::ObjectName,
        schema: &Schema,
        not_null: bool,
    ) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        let mut columns = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            if !seen.insert(field.name().clone()) {
                return Err(Error::new(
                    SqlState::DUPLICATE_COLUMN,
                    format!("column \"{}\" specified more than once", field.name()),
                ));
            }
            let null = if not_null && !field.is_nullable() {
                " NOT NULL"
            } else {
                ""
            };
            columns.push(format!(
                "{} {}{null}",
                crate::quote_ident(field.name()),
                eddy_sql::types::pg_type_name(field)
            ));
        }
        let sql = format!("CREATE TABLE {name} ({})", columns.join(", "));
        let parsed = eddy_sql::parse_statements(&sql)?;
        let Some(statement @ Statement::CreateTable(_)) =
            parsed.into_iter().next().map(|p| p.statement)
        else {
            return Err(Error::internal("a derived CREATE TABLE did not parse"));
        };
        Box::pin(self.execute_statement(&statement, &[]))
            .await
            .map(|_| ())
    }
}

fn exists_skipping(name: &str, tag: &'static str) -> Outcome {
    super::relation_exists(name, Outcome::Command { tag, rows: None })
}
