//! Transaction blocks: `BEGIN`, `COMMIT`, `ROLLBACK` and savepoints (`SAVEPOINT`,
//! `RELEASE [SAVEPOINT]`, `ROLLBACK TO [SAVEPOINT]`), which SQLAlchemy and psycopg use for
//! nested transactions.
//!
//! An open transaction keeps its writes per table, in order, and private copies ("forks") of
//! the tables it wrote so that it reads its own writes. A savepoint records how many change
//! batches each table had; `ROLLBACK TO` cuts the writes back to that point, clears the failed
//! state and rebuilds the forks from the writes that remain (from the tables' current
//! contents, which is what a write made at that moment would have seen).

use std::collections::BTreeMap;
use std::sync::Arc;

use eddy_common::{ChangeBatch, Error, ObjectId, Result, SqlState};

use super::{Outcome, Session};
use crate::{Table, WriteGuard};

pub(super) struct Transaction {
    pub(super) failed: bool,
    pub(super) writes: BTreeMap<ObjectId, (Arc<Table>, Vec<ChangeBatch>)>,
    /// Open savepoints, oldest first (a name may repeat: the newest one answers to it).
    pub(super) savepoints: Vec<Savepoint>,
}

pub(super) struct Savepoint {
    name: String,
    /// Change batches per table when it was set.
    lengths: BTreeMap<ObjectId, usize>,
}

impl Session {
    pub(super) fn begin(&mut self) -> Outcome {
        if self.transaction.is_some() {
            return Outcome::Warning {
                state: SqlState::ACTIVE_SQL_TRANSACTION,
                message: "there is already a transaction in progress".into(),
                then: Box::new(Outcome::TransactionStart),
            };
        }
        self.transaction = Some(Transaction {
            failed: false,
            writes: BTreeMap::new(),
            savepoints: Vec::new(),
        });
        Outcome::TransactionStart
    }

    pub(super) async fn commit(&mut self) -> Result<Outcome> {
        let Some(txn) = self.transaction.take() else {
            return Ok(Outcome::Warning {
                state: SqlState::NO_ACTIVE_SQL_TRANSACTION,
                message: "there is no transaction in progress".into(),
                then: Box::new(Outcome::TransactionEnd { tag: "COMMIT" }),
            });
        };
        self.view
            .forks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.close_transaction_cursors(!txn.failed);
        if txn.failed {
            return Ok(Outcome::TransactionEnd { tag: "ROLLBACK" });
        }
        let writes: Vec<_> = txn.writes.into_values().collect();
        let guard = self.engine.lock_writes().await;
        self.engine.commit(guard, writes, &[], None).await?;
        Ok(Outcome::TransactionEnd { tag: "COMMIT" })
    }

    pub(super) fn rollback(&mut self) -> Outcome {
        self.view
            .forks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        if self.transaction.take().is_none() {
            return Outcome::Warning {
                state: SqlState::NO_ACTIVE_SQL_TRANSACTION,
                message: "there is no transaction in progress".into(),
                then: Box::new(Outcome::TransactionEnd { tag: "ROLLBACK" }),
            };
        }
        self.close_transaction_cursors(false);
        Outcome::TransactionEnd { tag: "ROLLBACK" }
    }

    fn open_transaction(&mut self, statement: &str) -> Result<&mut Transaction> {
        self.transaction.as_mut().ok_or_else(|| {
            Error::new(
                SqlState::NO_ACTIVE_SQL_TRANSACTION,
                format!("{statement} can only be used in transaction blocks"),
            )
        })
    }

    /// `SAVEPOINT name`.
    pub(super) fn savepoint(&mut self, name: String) -> Result<Outcome> {
        let txn = self.open_transaction("SAVEPOINT")?;
        let lengths = txn
            .writes
            .iter()
            .map(|(id, (_, changes))| (*id, changes.len()))
            .collect();
        txn.savepoints.push(Savepoint { name, lengths });
        Ok(Outcome::Command {
            tag: "SAVEPOINT",
            rows: None,
        })
    }

    /// `RELEASE [SAVEPOINT] name`: forgets it and every later savepoint; the writes stay.
    pub(super) fn release_savepoint(&mut self, name: &str) -> Result<Outcome> {
        let txn = self.open_transaction("RELEASE SAVEPOINT")?;
        let at = find(txn, name)?;
        txn.savepoints.truncate(at);
        Ok(Outcome::Command {
            tag: "RELEASE",
            rows: None,
        })
    }

    /// `ROLLBACK TO [SAVEPOINT] name`: undoes what followed it (it stays set), and a failed
    /// transaction can go on.
    pub(super) fn rollback_to_savepoint(&mut self, name: &str) -> Result<Outcome> {
        let txn = self.transaction.as_mut().ok_or_else(|| {
            Error::new(
                SqlState::NO_ACTIVE_SQL_TRANSACTION,
                "ROLLBACK TO SAVEPOINT can only be used in transaction blocks",
            )
        })?;
        let at = find(txn, name)?;
        txn.savepoints.truncate(at + 1);
        let lengths = &txn.savepoints[at].lengths;
        txn.writes.retain(|id, (_, changes)| match lengths.get(id) {
            Some(&n) => {
                changes.truncate(n);
                n > 0
            }
            None => false,
        });
        txn.failed = false;
        let mut forks = self.view.forks.lock().unwrap_or_else(|p| p.into_inner());
        forks.clear();
        for (id, (table, changes)) in &txn.writes {
            let mut fork = table.read().fork()?;
            fork.check(changes)?;
            fork.apply(changes)?;
            forks.insert(*id, fork);
        }
        drop(forks);
        self.close_cursors_after(at + 1);
        Ok(Outcome::Command {
            tag: "ROLLBACK",
            rows: None,
        })
    }

    /// Writes `changes` to `table`: committed now outside a transaction, else kept in the
    /// transaction and applied to its private copy of the table.
    pub(super) async fn write(
        &mut self,
        guard: Option<WriteGuard>,
        table: Arc<Table>,
        changes: Vec<ChangeBatch>,
    ) -> Result<()> {
        match self.transaction.as_mut() {
            None => {
                let guard = match guard {
                    Some(g) => g,
                    None => self.engine.lock_writes().await,
                };
                self.engine
                    .commit(guard, vec![(table, changes)], &[], None)
                    .await
            }
            Some(txn) => {
                let mut forks = self.view.forks.lock().unwrap_or_else(|p| p.into_inner());
                let fork = match forks.entry(table.def.id) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => v.insert(table.read().fork()?),
                };
                fork.check(&changes)?;
                fork.apply(&changes)?;
                txn.writes
                    .entry(table.def.id)
                    .or_insert_with(|| (Arc::clone(&table), Vec::new()))
                    .1
                    .extend(changes);
                Ok(())
            }
        }
    }
}

/// The newest savepoint called `name`.
fn find(txn: &Transaction, name: &str) -> Result<usize> {
    txn.savepoints
        .iter()
        .rposition(|s| s.name == name)
        .ok_or_else(|| {
            Error::new(
                SqlState::INVALID_SAVEPOINT_SPECIFICATION,
                format!("savepoint \"{name}\" does not exist"),
            )
        })
}
