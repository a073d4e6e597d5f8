//! A [`Handler`] as a node of the operator tree (ADR 0009, step 1): the tree the engine drives
//! today calls `push` and `end_epoch`; this node feeds what its inputs return to the handler
//! (`on_data` per input, then `on_barrier` at the end of the epoch). An operator moved onto
//! [`Handler`] thus runs unchanged in meaning until the graph executor drives the views.

use eddy_common::{ChangeBatch, ObjectId, Result};

use crate::graph::{Barrier, Handler, Output};
use crate::{Operator, OperatorState};

pub(crate) struct TreeNode {
    handler: Box<dyn Handler>,
    inputs: Vec<Box<dyn Operator>>,
    epoch: u64,
}

impl TreeNode {
    pub(crate) fn new(handler: Box<dyn Handler>, inputs: Vec<Box<dyn Operator>>) -> Self {
        TreeNode {
            handler,
            inputs,
            epoch: 0,
        }
    }

    fn feed(&mut self, outputs: Vec<Vec<ChangeBatch>>, out: &mut Output) -> Result<()> {
        for (input, batches) in outputs.into_iter().enumerate() {
            for changes in batches {
                self.handler.on_data(input, changes, out)?;
            }
        }
        Ok(())
    }
}

impl Operator for TreeNode {
    fn push(&mut self, source: ObjectId, changes: &ChangeBatch) -> Result<Vec<ChangeBatch>> {
        let outputs = self
            .inputs
            .iter_mut()
            .map(|i| i.push(source, changes))
            .collect::<Result<Vec<_>>>()?;
        let mut out = Output::default();
        self.feed(outputs, &mut out)?;
        Ok(out.into_changes())
    }

    fn end_epoch(&mut self) -> Result<Vec<ChangeBatch>> {
        let outputs = self
            .inputs
            .iter_mut()
            .map(|i| i.end_epoch())
            .collect::<Result<Vec<_>>>()?;
        let mut out = Output::default();
        self.feed(outputs, &mut out)?;
        self.epoch += 1;
        let barrier = Barrier {
            epoch: self.epoch,
            checkpoint: false,
        };
        self.handler.on_barrier(&barrier, &mut out)?;
        Ok(out.into_changes())
    }

    fn state(&self) -> OperatorState {
        self.handler.state()
    }

    fn save_state(&mut self) -> Result<crate::checkpoint::Parts> {
        self.handler.save()
    }

    fn load_state(&mut self, name: &str, batch: &arrow::array::RecordBatch) -> Result<()> {
        self.handler.load(name, batch)
    }

    fn children(&self) -> Vec<&dyn Operator> {
        crate::inputs_of(&self.inputs)
    }

    fn children_mut(&mut self) -> Vec<&mut dyn Operator> {
        crate::inputs_of_mut(&mut self.inputs)
    }
}
