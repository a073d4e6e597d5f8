//! Stateless operators: source, filter, project, union. Each change maps to changes with the
//! same weight, so they emit immediately and hold nothing at the end of an epoch.

use arrow::array::{Array, AsArray, BooleanArray};
use arrow::datatypes::SchemaRef;
use eddy_common::{ChangeBatch, Error, ObjectId, Result};

use crate::plan::Expr;
use crate::{Operator, OperatorState};
use std::sync::Arc;

use crate::EventTime;
use crate::rows::{batch_of, evaluate_or_set_aside, filter_changes};

pub struct Source {
    pub object: ObjectId,
    /// The columns the view was planned with; a table's rows may carry columns added later.
    pub schema: SchemaRef,
}

impl Operator for Source {
    fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        if source != self.object || changes.is_empty() {
            return Ok(Vec::new());
        }
        let width = self.schema.fields().len();
        if changes.rows().num_columns() <= width {
            return Ok(vec![changes.clone()]);
        }
        let columns = changes.rows().columns()[..width].to_vec();
        Ok(vec![ChangeBatch::new(
            batch_of(&self.schema, columns, changes.len())?,
            changes.diffs().clone(),
        )])
    }

    fn end_epoch(&mut self) -> Result<Vec<ChangeBatch>> {
        Ok(Vec::new())
    }

    fn state(&self) -> OperatorState {
        OperatorState::stateless(format!("Source {}", self.object))
    }

    fn children(&self) -> Vec<&dyn Operator> {
        Vec::new()
    }

    fn children_mut(&mut self) -> Vec<&mut dyn Operator> {
        Vec::new()
    }
}

pub struct Filter {
    pub input: Box<dyn Operator>,
    pub predicate: Expr,
    /// Where rows whose predicate fails to evaluate are set aside.
    pub context: Arc<EventTime>,
}

impl Filter {
    fn apply(&self, batches: Vec<ChangeBatch>) -> Result<Vec<ChangeBatch>> {
        let mut out = Vec::with_capacity(batches.len());
        for changes in batches {
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
            let kept = filter_changes(&changes, &mask)?;
            if !kept.is_empty() {
                out.push(kept);
            }
        }
        Ok(out)
    }
}

impl Operator for Filter {
    fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        let batches = self.input.push(source, changes)?;
        self.apply(batches)
    }

    fn end_epoch(&mut self) -> Result<Vec<ChangeBatch>> {
        let batches = self.input.end_epoch()?;
        self.apply(batches)
    }

    fn state(&self) -> OperatorState {
        OperatorState::stateless(format!("Filter {}", self.predicate))
    }

    fn children(&self) -> Vec<&dyn Operator> {
        vec![self.input.as_ref()]
    }

    fn children_mut(&mut self) -> Vec<&mut dyn Operator> {
        vec![self.input.as_mut()]
    }
}

pub struct Project {
    pub input: Box<dyn Operator>,
    pub exprs: Vec<Expr>,
    pub schema: SchemaRef,
    /// Where rows whose expressions fail to evaluate are set aside.
    pub context: Arc<EventTime>,
}

impl Project {
    fn apply(&self, batches: Vec<ChangeBatch>) -> Result<Vec<ChangeBatch>> {
        let exprs: Vec<&Expr> = self.exprs.iter().collect();
        batches
            .into_iter()
            .map(|changes| {
                let (changes, columns) = evaluate_or_set_aside(&exprs, changes, &self.context)?;
                let n = changes.len();
                let (_, diffs) = changes.into_parts();
                Ok(ChangeBatch::new(batch_of(&self.schema, columns, n)?, diffs))
            })
            .collect()
    }
}

impl Operator for Project {
    fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        let batches = self.input.push(source, changes)?;
        self.apply(batches)
    }

    fn end_epoch(&mut self) -> Result<Vec<ChangeBatch>> {
        let batches = self.input.end_epoch()?;
        self.apply(batches)
    }

    fn state(&self) -> OperatorState {
        OperatorState::stateless(format!("Project {} columns", self.exprs.len()))
    }

    fn children(&self) -> Vec<&dyn Operator> {
        vec![self.input.as_ref()]
    }

    fn children_mut(&mut self) -> Vec<&mut dyn Operator> {
        vec![self.input.as_mut()]
    }
}

pub struct Union {
    pub inputs: Vec<Box<dyn Operator>>,
    pub schema: SchemaRef,
}

impl Union {
    fn relabel(&self, batches: Vec<ChangeBatch>) -> Result<Vec<ChangeBatch>> {
        batches
            .into_iter()
            .map(|b| {
                let n = b.len();
                let (rows, diffs) = b.into_parts();
                Ok(ChangeBatch::new(
                    batch_of(&self.schema, rows.columns().to_vec(), n)?,
                    diffs,
                ))
            })
            .collect()
    }
}

impl Operator for Union {
    fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        let mut out = Vec::new();
        for input in &mut self.inputs {
            out.extend(input.push(source, changes)?);
        }
        self.relabel(out)
    }

    fn end_epoch(&mut self) -> Result<Vec<ChangeBatch>> {
        let mut out = Vec::new();
        for input in &mut self.inputs {
            out.extend(input.end_epoch()?);
        }
        self.relabel(out)
    }

    fn state(&self) -> OperatorState {
        OperatorState::stateless("Union".to_owned())
    }

    fn children(&self) -> Vec<&dyn Operator> {
        self.inputs.iter().map(|i| i.as_ref()).collect()
    }

    fn children_mut(&mut self) -> Vec<&mut dyn Operator> {
        self.inputs
            .iter_mut()
            .map(|i| i.as_mut() as &mut dyn Operator)
            .collect()
    }
}
