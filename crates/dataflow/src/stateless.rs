//! Stateless operators: source, filter, project, union. Each change maps to changes with the
//! same weight, so they emit immediately and hold nothing at the end of an epoch.

use arrow::array::{Array, AsArray, BooleanArray};
use arrow::datatypes::SchemaRef;
use eddy_common::{ChangeBatch, Error, ObjectId, Result};

use crate::graph::{Handler, Output};
use crate::plan::Expr;
use std::sync::Arc;

use crate::EventTime;
use crate::rows::{batch_of, evaluate_or_set_aside, filter_changes};

pub struct Source {
    pub object: ObjectId,
    /// The columns the view was planned with; a table's rows may carry columns added later.
    pub schema: SchemaRef,
}

impl Source {
    /// The changes with the columns the view was planned with.
    fn planned(&self, changes: &ChangeBatch) -> Result<ChangeBatch> {
        let width = self.schema.fields().len();
        if changes.rows().num_columns() <= width {
            return Ok(changes.clone());
        }
        let columns = changes.rows().columns()[..width].to_vec();
        Ok(ChangeBatch::new(
            batch_of(&self.schema, columns, changes.len())?,
            changes.diffs().clone(),
        ))
    }
}

/// In the graph the runtime sends a source node its table's changes only.
impl Handler for Source {
    fn on_data(&mut self, _input: usize, changes: ChangeBatch, out: &mut Output) -> Result<()> {
        out.data(self.planned(&changes)?);
        Ok(())
    }

    fn name(&self) -> String {
        format!("Source {}", self.object)
    }
}

/// Keeps the rows whose predicate is true (NULL is not).
pub struct Filter {
    pub predicate: Expr,
    /// Where rows whose predicate fails to evaluate are set aside.
    pub context: Arc<EventTime>,
}

impl Handler for Filter {
    fn on_data(&mut self, _input: usize, changes: ChangeBatch, out: &mut Output) -> Result<()> {
        let (changes, mut values) =
            evaluate_or_set_aside(&[&self.predicate], changes, &self.context)?;
        let mask = values
            .pop()
            .ok_or_else(|| Error::internal("filter predicate"))?;
        let mask = mask
            .as_boolean_opt()
            .ok_or_else(|| Error::internal("filter predicate is not boolean"))?;
        // NULL is not true: those rows are dropped, as WHERE does.
        let mask = match mask.nulls() {
            Some(_) => BooleanArray::from_iter(mask.iter().map(|v| Some(v == Some(true)))),
            None => mask.clone(),
        };
        out.data(filter_changes(&changes, &mask)?);
        Ok(())
    }

    fn name(&self) -> String {
        format!("Filter {}", self.predicate)
    }
}

/// Computes the output columns from each row.
pub struct Project {
    pub exprs: Vec<Expr>,
    pub schema: SchemaRef,
    /// Where rows whose expressions fail to evaluate are set aside.
    pub context: Arc<EventTime>,
}

impl Handler for Project {
    fn on_data(&mut self, _input: usize, changes: ChangeBatch, out: &mut Output) -> Result<()> {
        let exprs: Vec<&Expr> = self.exprs.iter().collect();
        let (changes, columns) = evaluate_or_set_aside(&exprs, changes, &self.context)?;
        let n = changes.len();
        let (_, diffs) = changes.into_parts();
        out.data(ChangeBatch::new(batch_of(&self.schema, columns, n)?, diffs));
        Ok(())
    }

    fn name(&self) -> String {
        format!("Project {} columns", self.exprs.len())
    }
}

/// UNION ALL: every input's rows, under the union's column names.
pub struct Union {
    pub schema: SchemaRef,
}

impl Handler for Union {
    fn on_data(&mut self, _input: usize, changes: ChangeBatch, out: &mut Output) -> Result<()> {
        let n = changes.len();
        let (rows, diffs) = changes.into_parts();
        out.data(ChangeBatch::new(
            batch_of(&self.schema, rows.columns().to_vec(), n)?,
            diffs,
        ));
        Ok(())
    }

    fn name(&self) -> String {
        "Union".to_owned()
    }
}
