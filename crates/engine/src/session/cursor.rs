//! SQL cursors: `DECLARE name [BINARY] [NO SCROLL] CURSOR [WITH HOLD] FOR <query | SUBSCRIBE>`,
//! `FETCH`, `MOVE` and `CLOSE`, as PostgreSQL has them (psycopg's server-side cursors use them).
//!
//! A query cursor plans its query at DECLARE and reads the tables and views as they were then
//! (their snapshots are frozen when the statement resolves them), so FETCH returns the rows of
//! that moment however long the cursor lives; rows are produced as they are fetched. Without
//! `WITH HOLD` a cursor needs a transaction block and closes when it ends; a held cursor
//! outlives the COMMIT of the transaction that declared it (not its ROLLBACK). Cursors scan
//! forward only: `SCROLL` and the backward directions are refused.
//!
//! A `SUBSCRIBE` cursor reads the never-ending change stream of a view; FETCH waits for the
//! next epoch (up to its timeout). It lives until CLOSE or the end of the session.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use eddy_common::{Error, ObjectId, Result, SqlState};
use eddy_sql::ast;
use futures::StreamExt;

use super::{Outcome, Session, change_rows};
use crate::catalog::normalize_ident;

/// An open cursor and the rows it read ahead of the client.
pub(super) struct Cursor {
    pub(super) schema: SchemaRef,
    buffered: VecDeque<RecordBatch>,
    kind: CursorKind,
    /// `WITH HOLD`: survives the commit of the transaction that declared it.
    hold: bool,
    /// `BINARY`: FETCH sends binary values (the simple protocol; Bind's formats win otherwise).
    pub(super) binary: bool,
    /// Declared inside the open transaction (a ROLLBACK closes it even when held).
    in_transaction: bool,
    /// How many savepoints were open when it was declared (ROLLBACK TO closes later ones).
    savepoint_depth: usize,
}

enum CursorKind {
    Subscribe {
        subscription: crate::views::Subscription,
        progress: bool,
        /// A view made for `SUBSCRIBE (query)` or a table, dropped with the cursor.
        temporary_view: Option<ObjectId>,
    },
    /// The query's remaining rows; `None` once they are all read.
    /// (In a mutex only to make the session `Sync`; it is reached through `get_mut`.)
    Query {
        rows: std::sync::Mutex<Option<futures::stream::BoxStream<'static, Result<RecordBatch>>>>,
    },
}

/// Refuses what Eddy's forward-only cursors cannot do, with PostgreSQL's SQLSTATEs.
fn check_declare(declare: &ast::Declare) -> Result<()> {
    if declare.scroll == Some(true) {
        return Err(Error::unsupported(
            "SCROLL cursors are not supported: Eddy's cursors scan forward only (NO SCROLL)",
        ));
    }
    if declare.names.len() != 1 {
        return Err(Error::new(
            SqlState::SYNTAX_ERROR,
            "DECLARE names one cursor",
        ));
    }
    Ok(())
}

impl Session {
    fn insert_cursor(
        &mut self,
        name: String,
        schema: SchemaRef,
        kind: CursorKind,
        hold: bool,
        binary: bool,
    ) -> Result<Outcome> {
        if self.cursors.contains_key(&name) {
            if let CursorKind::Subscribe {
                temporary_view: Some(id),
                ..
            } = kind
            {
                self.engine.drop_temporary_view(id);
            }
            return Err(Error::new(
                SqlState::DUPLICATE_CURSOR,
                format!("cursor \"{name}\" already exists"),
            ));
        }
        let in_transaction = self.transaction.is_some();
        let savepoint_depth = self.transaction.as_ref().map_or(0, |t| t.savepoints.len());
        self.cursors.insert(
            name,
            Cursor {
                schema,
                buffered: VecDeque::new(),
                kind,
                hold,
                binary,
                in_transaction,
                savepoint_depth,
            },
        );
        Ok(Outcome::Command {
            tag: "DECLARE CURSOR",
            rows: None,
        })
    }

    /// `DECLARE c CURSOR FOR <query>`.
    pub(super) async fn declare_query(
        &mut self,
        declare: &ast::Declare,
        params: &[arrow::array::ArrayRef],
    ) -> Result<Outcome> {
        check_declare(declare)?;
        let hold = declare.hold == Some(true);
        if !hold && self.transaction.is_none() {
            return Err(Error::new(
                SqlState::NO_ACTIVE_SQL_TRANSACTION,
                "DECLARE CURSOR can only be used in transaction blocks",
            ));
        }
        let Some(query) = &declare.for_query else {
            return Err(Error::unsupported(
                "DECLARE without a cursor (a variable) is not supported",
            ));
        };
        let name = normalize_ident(&declare.names[0]);
        if self.cursors.contains_key(&name) {
            return Err(Error::new(
                SqlState::DUPLICATE_CURSOR,
                format!("cursor \"{name}\" already exists"),
            ));
        }
        let statement = ast::Statement::Query(query.clone());
        let eddy_sql::Planned::Query(plan) = self.planner.plan(&statement).await? else {
            return Err(Error::internal("a cursor's query planned as a write"));
        };
        let plan = plan.bind(params)?;
        let schema = plan.schema();
        let rows = self.planner.execute_stream(plan).await?;
        let binary = declare.binary == Some(true);
        self.insert_cursor(
            name,
            schema,
            CursorKind::Query {
                rows: std::sync::Mutex::new(Some(rows)),
            },
            hold,
            binary,
        )
    }

    /// `DECLARE c CURSOR FOR SUBSCRIBE ...`.
    pub(super) async fn declare_subscribe(
        &mut self,
        cursor: &str,
        subscribe: &eddy_sql::Subscribe,
    ) -> Result<Outcome> {
        if self.cursors.contains_key(cursor) {
            return Err(Error::new(
                SqlState::DUPLICATE_CURSOR,
                format!("cursor \"{cursor}\" already exists"),
            ));
        }
        let (subscription, schema, temporary_view) = self.start_subscription(subscribe).await?;
        let kind = CursorKind::Subscribe {
            subscription,
            progress: subscribe.progress,
            temporary_view,
        };
        self.insert_cursor(cursor.to_owned(), schema, kind, true, false)
    }

    /// `CLOSE name | ALL`.
    pub(super) fn close(&mut self, close: &ast::CloseCursor) -> Result<Outcome> {
        match close {
            ast::CloseCursor::All => {
                let names: Vec<String> = self.cursors.keys().cloned().collect();
                for name in names {
                    self.close_cursor(&name);
                }
                return Ok(Outcome::Command {
                    tag: "CLOSE CURSOR ALL",
                    rows: None,
                });
            }
            ast::CloseCursor::Specific { name } => {
                let name = normalize_ident(name);
                if !self.close_cursor(&name) {
                    return Err(no_cursor(&name));
                }
            }
        }
        Ok(Outcome::Command {
            tag: "CLOSE CURSOR",
            rows: None,
        })
    }

    pub(super) fn close_cursor(&mut self, name: &str) -> bool {
        match self.cursors.remove(name) {
            Some(cursor) => {
                if let CursorKind::Subscribe {
                    temporary_view: Some(id),
                    ..
                } = cursor.kind
                {
                    self.engine.drop_temporary_view(id);
                }
                true
            }
            None => false,
        }
    }

    /// The transaction ended: its cursors close, held ones survive a commit.
    pub(super) fn close_transaction_cursors(&mut self, committed: bool) {
        let closing: Vec<String> = self
            .cursors
            .iter()
            .filter(|(_, c)| c.in_transaction && !(committed && c.hold))
            .map(|(n, _)| n.clone())
            .collect();
        for name in closing {
            self.close_cursor(&name);
        }
        for cursor in self.cursors.values_mut() {
            cursor.in_transaction = false;
        }
    }

    /// `ROLLBACK TO` a savepoint, leaving `open` savepoints (it among them): cursors declared
    /// after it close.
    pub(super) fn close_cursors_after(&mut self, open: usize) {
        let closing: Vec<String> = self
            .cursors
            .iter()
            .filter(|(_, c)| c.in_transaction && c.savepoint_depth >= open)
            .map(|(n, _)| n.clone())
            .collect();
        for name in closing {
            self.close_cursor(&name);
        }
    }

    pub(super) fn cursor_schema(&self, name: &str) -> Result<SchemaRef> {
        self.open_cursor(name).ok_or_else(|| no_cursor(name))
    }

    /// The columns of the open cursor `name` (a SQL cursor is also a portal: psycopg sends
    /// Describe Portal with its name).
    pub fn open_cursor(&self, name: &str) -> Option<SchemaRef> {
        self.cursors.get(name).map(|c| Arc::clone(&c.schema))
    }

    /// Whether a FETCH from this cursor sends binary values (a `BINARY` cursor).
    pub fn cursor_is_binary(&self, name: &str) -> bool {
        self.cursors.get(name).is_some_and(|c| c.binary)
    }

    /// `FETCH` (or `MOVE`, when `skip`) up to `count` rows, all when `None`. A SUBSCRIBE cursor
    /// waits (up to `timeout_ms`, or forever) for its first row.
    pub(super) async fn fetch(
        &mut self,
        name: &str,
        count: Option<u64>,
        timeout_ms: Option<u64>,
        skip: bool,
    ) -> Result<Outcome> {
        let cursor = self.cursors.get_mut(name).ok_or_else(|| no_cursor(name))?;
        let limit = count.map_or(usize::MAX, |c| c as usize);
        let deadline =
            timeout_ms.map(|ms| tokio::time::Instant::now() + std::time::Duration::from_millis(ms));
        let mut out: Vec<RecordBatch> = Vec::new();
        let mut rows = 0usize;
        loop {
            while rows < limit
                && let Some(batch) = cursor.buffered.pop_front()
            {
                let take = (limit - rows).min(batch.num_rows());
                if take < batch.num_rows() {
                    cursor
                        .buffered
                        .push_front(batch.slice(take, batch.num_rows() - take));
                }
                rows += take;
                if !skip {
                    out.push(batch.slice(0, take));
                }
            }
            if rows >= limit {
                break;
            }
            match &mut cursor.kind {
                CursorKind::Query { rows: stream } => {
                    let stream = stream.get_mut().unwrap_or_else(|p| p.into_inner());
                    let Some(next) = stream.as_mut() else { break };
                    match next.next().await {
                        Some(batch) => cursor.buffered.push_back(batch?),
                        None => {
                            *stream = None;
                            break;
                        }
                    }
                }
                CursorKind::Subscribe {
                    subscription,
                    progress,
                    ..
                } => {
                    let event = match subscription.events.try_recv() {
                        Ok(event) => Some(event),
                        Err(tokio::sync::mpsc::error::TryRecvError::Empty) if rows > 0 || skip => {
                            break;
                        }
                        Err(tokio::sync::mpsc::error::TryRecvError::Empty) => match deadline {
                            Some(deadline) => {
                                match tokio::time::timeout_at(deadline, subscription.events.recv())
                                    .await
                                {
                                    Ok(event) => event,
                                    Err(_) => break,
                                }
                            }
                            None => subscription.events.recv().await,
                        },
                        Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => None,
                    };
                    let Some(event) = event else {
                        // Why it ended comes with the next FETCH when this one has rows.
                        if rows == 0 {
                            subscription.end()?;
                        }
                        break;
                    };
                    cursor
                        .buffered
                        .extend(change_rows(&cursor.schema, *progress, &event)?);
                }
            }
        }
        if skip {
            return Ok(Outcome::Command {
                tag: "MOVE",
                rows: Some(rows),
            });
        }
        let schema = Arc::clone(&cursor.schema);
        Ok(Outcome::TaggedRows {
            tag: "FETCH",
            schema,
            batches: out,
            binary: cursor.binary,
        })
    }
}

fn no_cursor(name: &str) -> Error {
    Error::new(
        SqlState::INVALID_CURSOR_NAME,
        format!("cursor \"{name}\" does not exist"),
    )
}
