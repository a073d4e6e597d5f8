//! Sinks as the engine creates, starts (again after a restart), lists and drops them.

use super::*;

impl Engine {
    /// Creates a sink writing out materialized view `view` (its columns and key given), and
    /// starts it from the view's contents.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn create_sink(
        self: &Arc<Self>,
        name: QualifiedName,
        view: &QualifiedName,
        options: Vec<(String, String)>,
        format: Option<(String, String)>,
        sql: String,
        key: Vec<usize>,
        if_not_exists: bool,
    ) -> Result<()> {
        // A view behind is waited for before the write lock (the runtime waits for it too,
        // but then only for what came since).
        if let Some(v) = self.view(view) {
            self.runtime.caught_up(None, Some(&[v.def.id])).await?;
        }
        let guard = self.lock_writes().await;
        if self.name_taken(&name) {
            if if_not_exists
                && self
                    .sinks
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains_key(&name)
            {
                return Ok(());
            }
            return Err(Error::new(
                SqlState::DUPLICATE_TABLE,
                format!("relation \"{}\" already exists", name.name),
            ));
        }
        let view = self.view(view).ok_or_else(|| {
            Error::new(
                SqlState::UNDEFINED_TABLE,
                format!("materialized view \"{}\" does not exist", view.display()),
            )
        })?;
        sink::SinkDef::validate(&options, format.as_ref())?;
        let columns = view
            .schema
            .fields()
            .iter()
            .map(|f| (f.name().clone(), eddy_sql::types::pg_type_name(f)))
            .collect();
        let def = sink::SinkDef {
            id: self.meta.allocate_object_id()?,
            schema: name.schema.clone(),
            name: name.name.clone(),
            view: view.def.id,
            options,
            format,
            sql,
            key,
            columns,
        };
        let (sink, _, feed) = sink::Sink::start(
            def.clone(),
            true,
            Arc::clone(&self.meta),
            self.sink_buffer_bytes,
        )
        .await?;
        self.meta
            .put_object(def.id, &ObjectDef::Sink(def.clone()).encode()?)?;
        self.runtime.add_sink(def.id, def.view, None, feed).await?;
        self.sinks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, sink);
        drop(guard);
        Ok(())
    }

    /// Start-up: starts the stored sinks of the views `ready` (their progress decides what
    /// they write first; see `sink.rs`). A sink whose target cannot be reached is listed with
    /// its error and started in the background once it can be.
    pub(super) async fn start_stored_sinks(
        self: &Arc<Self>,
        ready: impl Fn(ObjectId) -> bool,
    ) -> Result<()> {
        let defs: Vec<sink::SinkDef> = {
            let mut stored = self.stored_sinks.lock().unwrap_or_else(|p| p.into_inner());
            let (now, later): (Vec<_>, Vec<_>) = stored.drain(..).partition(|d| ready(d.view));
            *stored = later;
            now
        };
        for def in defs {
            let name = def.qualified();
            match self.start_stored_sink(&def).await {
                Ok(sink) => {
                    self.sinks
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name, sink);
                }
                Err(e) => {
                    tracing::error!(sink = %name.display(), error = %e, "starting a sink failed; retrying in the background");
                    let retry =
                        tokio::spawn(Self::start_sink_later(Arc::downgrade(self), def.clone()));
                    self.sinks
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name, sink::Sink::waiting(def, e.message, retry));
                }
            }
        }
        Ok(())
    }

    /// Starts a stored sink (its progress decides what it writes first) and hands it its view.
    pub(super) async fn start_stored_sink(&self, def: &sink::SinkDef) -> Result<sink::Sink> {
        let (sink, resume, feed) = sink::Sink::start(
            def.clone(),
            false,
            Arc::clone(&self.meta),
            self.sink_buffer_bytes,
        )
        .await?;
        self.runtime
            .add_sink(def.id, def.view, resume, feed)
            .await?;
        Ok(sink)
    }

    /// Tries to start a stored sink every few seconds until it starts or is dropped.
    pub(super) async fn start_sink_later(engine: std::sync::Weak<Engine>, def: sink::SinkDef) {
        loop {
            tokio::time::sleep(sink::START_RETRY).await;
            let Some(engine) = engine.upgrade() else {
                return;
            };
            let _guard = engine.lock_writes().await;
            let still_waiting = engine
                .sinks
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(&def.qualified())
                .is_some_and(|s| s.def.id == def.id);
            if !still_waiting {
                return;
            }
            match engine.start_stored_sink(&def).await {
                Ok(sink) => {
                    tracing::info!(sink = %def.name, "the sink started");
                    let waiting = engine
                        .sinks
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(def.qualified(), sink);
                    // This task is the waiting sink's: let it end by itself rather than abort it.
                    if let Some(waiting) = waiting {
                        waiting.detach();
                    }
                    return;
                }
                Err(e) => {
                    tracing::warn!(sink = %def.name, error = %e, "starting a sink failed; retrying");
                    if let Some(s) = engine
                        .sinks
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(&def.qualified())
                    {
                        s.status.lock().unwrap_or_else(|p| p.into_inner()).error = Some(e.message);
                    }
                }
            }
        }
    }

    /// Drops sinks by name.
    /// Drops sinks by name; returns the NOTICEs for those missing under `IF EXISTS`.
    pub(crate) async fn drop_sinks(
        &self,
        names: &[QualifiedName],
        if_exists: bool,
    ) -> Result<Vec<session::Notice>> {
        let _guard = self.lock_writes().await;
        let mut notices = Vec::new();
        for name in names {
            if !self
                .sinks
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(name)
            {
                if if_exists {
                    notices.push(format!("sink \"{}\" does not exist, skipping", name.name).into());
                    continue;
                }
                let state = if self.name_taken(name) {
                    SqlState::WRONG_OBJECT_TYPE
                } else {
                    SqlState::UNDEFINED_OBJECT
                };
                return Err(Error::new(
                    state,
                    format!("sink \"{}\" does not exist", name.display()),
                ));
            }
            self.drop_sink_now(name)?;
        }
        Ok(notices)
    }

    pub(super) fn drop_sink_now(&self, name: &QualifiedName) -> Result<()> {
        let sink = self
            .sinks
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        if let Some(sink) = sink {
            self.meta.delete_object(sink.def.id)?;
            self.meta.delete_sink_progress(sink.def.id)?;
            self.runtime.drop_sink(sink.def.id)?;
        }
        Ok(())
    }

    /// `SHOW CREATE SINK`: the statement as written (without the password).
    pub(crate) fn sink_sql(&self, name: &QualifiedName) -> Result<String> {
        let sql = self
            .sinks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .map(|s| s.def.sql.clone());
        match sql {
            Some(sql) => Ok(sql),
            None if self.name_taken(name) => Err(Error::new(
                SqlState::WRONG_OBJECT_TYPE,
                format!("\"{}\" is not a sink", name.display()),
            )),
            None => Err(Error::new(
                SqlState::UNDEFINED_OBJECT,
                format!("sink \"{}\" does not exist", name.display()),
            )),
        }
    }

    /// `SHOW SINKS`: name, view, connector, target, last committed epoch, rows committed since
    /// start, last error.
    pub(crate) fn sink_rows(&self) -> Vec<Vec<String>> {
        let sinks = self.sinks.read().unwrap_or_else(|p| p.into_inner());
        sinks
            .values()
            .map(|s| {
                let status = s.status.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let target = s.def.target_text();
                vec![
                    s.def.qualified().display(),
                    self.object_name(s.def.view).unwrap_or_default(),
                    s.def.option("connector").unwrap_or_default(),
                    target,
                    status
                        .committed_epoch
                        .map(|e| e.to_string())
                        .unwrap_or_default(),
                    status.rows.to_string(),
                    status.error.unwrap_or_default(),
                ]
            })
            .collect()
    }
}
