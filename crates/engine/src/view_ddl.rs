//! Materialized views as the engine creates them: planned, built as dataflows, backfilled from
//! their inputs' logs; the temporary views SUBSCRIBE reads.

use super::*;

impl Engine {
    /// A view's dataflow, its arrangements within the server's memory budget (spilling past
    /// it), its operators' state capped at the view's `max_state_rows` or the
    /// server's.
    pub(crate) fn view_dataflow(
        &self,
        plan: &eddy_sql::ViewPlan,
        event_time: &Arc<eddy_dataflow::EventTime>,
    ) -> Result<eddy_dataflow::Dataflow> {
        let mut dataflow = eddy_dataflow::build(&plan.node, event_time, &self.workers)?;
        dataflow.limit_state_rows(plan.max_state_rows.or(self.max_state_rows));
        if let Some(budget) = &self.memory {
            dataflow.spill_to(budget);
        }
        Ok(dataflow)
    }

    /// The most client connections at once ([`EngineConfig::max_connections`]).
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// Registers a materialized view and backfills it; `id` is given when restoring one.
    /// Returns how many table rows the backfill read and how many sources it read to their
    /// end (a new view over sources answers once it has).
    pub(crate) async fn create_view(
        self: &Arc<Self>,
        name: QualifiedName,
        sql: String,
        plan: eddy_sql::ViewPlan,
        id: Option<ObjectId>,
        progress: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    ) -> Result<(usize, usize)> {
        // Views it reads that are behind are waited for here, before the write lock: the
        // runtime waits for them too, but then only for what came since.
        self.runtime
            .caught_up(None, Some(&plan.node.sources()))
            .await?;
        let guard = self.lock_writes().await;
        // A view rebuilt in place (RESTART) keeps its name.
        let rebuilt = id.is_some() && self.view(&name).map(|v| v.def.id) == id;
        if self.name_taken(&name) && !rebuilt {
            return Err(Error::new(
                SqlState::DUPLICATE_TABLE,
                format!("relation \"{}\" already exists", name.name),
            ));
        }
        self.check_schema_for_create(&name)?;
        let sources = plan.node.sources();
        let event_time = Arc::new(eddy_dataflow::EventTime::new(&sources));
        let dataflow = self.view_dataflow(&plan, &event_time)?;
        let tables = self.backfill_inputs(&sources).await?;
        let is_new = id.is_none();
        let id = match id {
            Some(id) => id,
            None => self.meta.allocate_object_id()?,
        };
        let readers = self.new_readers(id, &sources, None)?;
        let mut dependencies = sources.clone();
        dependencies.extend(plan.views.iter().copied().filter(|v| !sources.contains(v)));
        let def = ViewDef {
            id,
            schema: name.schema.clone(),
            name: name.name.clone(),
            sql,
            dependencies,
        };
        if is_new {
            self.meta
                .put_object(id, &ObjectDef::MaterializedView(def.clone()).encode()?)?;
        }
        let view = Arc::new(View {
            def,
            schema: plan.schema,
            watermark: plan.watermark,
        });
        self.views
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.clone(), Arc::clone(&view));
        let done = self
            .runtime
            .add_view(view, dataflow, event_time, sources, tables, progress)?;
        let caught_up = self.start_readers(readers);
        drop(guard);
        let result = done
            .await
            .map_err(|_| Error::internal("the view runtime stopped"))?;
        let backfill_rows = match result {
            Ok(rows) => rows,
            Err(e) => {
                if is_new {
                    // A new view that cannot be built is not kept (unless it is gone already:
                    // dropped while it was being built, its name maybe taken again since).
                    if self.view(&name).map(|v| v.def.id) != Some(id) {
                        return Err(e);
                    }
                    let _ = self
                        .drop_objects(&[name], true, true, ObjectKind::MaterializedView)
                        .await;
                } else {
                    // A stored one keeps its catalog entry: recovery marks it failed.
                    self.stop_readers(id);
                    self.views
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&name);
                    let _ = self.runtime.drop_view(id);
                    // Handled before recovery marks the view failed (a drop handled after it
                    // would clear the failure: `eddy_views` would say `running`).
                    let _ = self.runtime.barrier().await;
                }
                return Err(e);
            }
        };
        let sources_read = caught_up.len();
        if is_new && sources_read > 0 {
            // A new view over sources answers once it has read what they hold now.
            for wait in caught_up {
                let _ = wait.await;
            }
            self.flush().await?;
        }
        Ok((backfill_rows, sources_read))
    }

    /// A view that lives only as long as a subscription: not in the catalog, not visible by
    /// name. Returns its id; drop it with [`Engine::drop_temporary_view`].
    pub(crate) async fn create_temporary_view(
        self: &Arc<Self>,
        plan: eddy_sql::ViewPlan,
    ) -> Result<ObjectId> {
        let sources = plan.node.sources();
        self.runtime.caught_up(None, Some(&sources)).await?;
        let guard = self.lock_writes().await;
        let event_time = Arc::new(eddy_dataflow::EventTime::new(&sources));
        let dataflow = self.view_dataflow(&plan, &event_time)?;
        let tables = self.backfill_inputs(&sources).await?;
        let id = self.meta.allocate_object_id()?;
        let def = ViewDef {
            id,
            schema: eddy_sql::PUBLIC_SCHEMA.to_owned(),
            name: format!("subscription {id}"),
            sql: String::new(),
            dependencies: sources.clone(),
        };
        let view = Arc::new(View {
            def,
            schema: plan.schema,
            watermark: plan.watermark,
        });
        let readers = self.new_readers(id, &sources, None)?;
        let done = self
            .runtime
            .add_view(view, dataflow, event_time, sources, tables, None)?;
        self.start_readers(readers);
        drop(guard);
        if let Err(e) = done
            .await
            .map_err(|_| Error::internal("the view runtime stopped"))?
        {
            self.drop_temporary_view(id);
            // As above: the drop is handled before recovery marks a stored view failed.
            let _ = self.runtime.barrier().await;
            return Err(e);
        }
        Ok(id)
    }

    pub(crate) fn drop_temporary_view(&self, id: ObjectId) {
        self.stop_readers(id);
        let _ = self.runtime.drop_view(id);
    }

    pub(crate) async fn subscribe(
        &self,
        view: ObjectId,
        snapshot: bool,
    ) -> Result<views::Subscription> {
        self.runtime.subscribe(view, snapshot).await
    }

    /// What a new view reads first from each table among `sources` (call under the write
    /// lock, so that it lines up with the changes the view runtime receives next): where each
    /// partition of the table's log starts and ends now. The view's lane reads them later, in
    /// commit order, a few records at a time — so a stream's watermark advances and late rows
    /// are judged exactly as they were live, and neither the write lock nor memory holds the
    /// whole log.
    pub(super) async fn backfill_inputs(
        &self,
        sources: &[ObjectId],
    ) -> Result<Vec<views::Backfill>> {
        // Commits queued before the write lock was taken may not be in the log files yet (their
        // changes already reached the runtime): an empty commit returns once they are.
        self.log
            .commit(Vec::new())
            .await
            .map_err(|_| Error::internal("the log committer stopped without answering"))??;
        let tables: Vec<Arc<Table>> = self
            .tables
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|t| sources.contains(&t.def.id))
            .cloned()
            .collect();
        let mut out = Vec::with_capacity(tables.len());
        for table in tables {
            // Pinned before the offsets are read: retention cannot cut what is about to be read.
            let pin = self.backfilling.pin(table.def.id);
            let ranges = (0..table.def.partitions)
                .map(|p| {
                    let start = self.log.start_offset(table.def.id, PartitionId(p))?.0;
                    let end = self.log.end_offset(table.def.id, PartitionId(p))?.0;
                    Ok((p, start, end))
                })
                .collect::<Result<Vec<_>>>()?;
            out.push(views::Backfill {
                object: table.def.id,
                name: table.def.qualified().display(),
                clock: table.clock,
                input: views::BackfillInput::Log {
                    log: Arc::clone(&self.log),
                    schema: Arc::clone(&table.schema),
                    ranges,
                    pin,
                },
            });
        }
        Ok(out)
    }
}
