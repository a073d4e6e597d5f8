//! DROP of tables, sources, materialized and plain views and sinks, with everything that reads
//! them: refused with 2BP01 unless CASCADE, as PostgreSQL does, with its messages and NOTICEs.
//!
//! Entry points: [`Engine::drop_objects`] (a DROP statement) and [`Engine::drop_ids_now`]
//! (DROP SCHEMA). Invariants: dependents go before what they read, newest first; a catalog
//! entry is deleted before the data it describes (a crash leaves orphans the next start removes).

use std::sync::Arc;

use eddy_common::{Error, ObjectId, Result, SqlState};
use eddy_sql::QualifiedName;

use crate::session::Notice;
use crate::views::View;
use crate::{Engine, ObjectKind};

/// PostgreSQL's NOTICE for what a CASCADE drops besides the objects named.
pub(crate) fn cascade_notice(dropped: Vec<String>) -> Option<Notice> {
    match dropped.as_slice() {
        [] => None,
        [one] => Some(format!("drop cascades to {one}").into()),
        many => Some(Notice {
            state: SqlState::SUCCESSFUL_COMPLETION,
            message: format!("drop cascades to {} other objects", many.len()),
            detail: Some(
                many.iter()
                    .map(|d| format!("drop cascades to {d}"))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
        }),
    }
}

/// An object that goes with a DROP, and why.
struct Doomed {
    id: ObjectId,
    /// `view v`, `materialized view s.m`, ...
    description: String,
    /// What it reads that is dropped too.
    reads: String,
}

impl ObjectKind {
    /// How PostgreSQL names the kind in messages.
    pub(crate) fn noun(self) -> &'static str {
        match self {
            ObjectKind::Table => "table",
            ObjectKind::MaterializedView => "materialized view",
            ObjectKind::Source => "source",
            ObjectKind::View => "view",
        }
    }
}

impl Engine {
    /// Drops the objects of one kind named; returns the NOTICEs to send (names missing under
    /// `IF EXISTS`, objects dropped by `CASCADE`).
    pub(crate) async fn drop_objects(
        &self,
        names: &[QualifiedName],
        if_exists: bool,
        cascade: bool,
        kind: ObjectKind,
    ) -> Result<Vec<Notice>> {
        let _guard = self.lock_writes().await;
        let mut ids = Vec::new();
        let mut notices = Vec::new();
        for name in names {
            let id = match kind {
                ObjectKind::Table => self.table(name).map(|t| t.def.id),
                ObjectKind::MaterializedView => self.view(name).map(|v| v.def.id),
                ObjectKind::Source => self.source(name).map(|s| s.def.id),
                ObjectKind::View => self.plain_view(name).map(|v| v.id),
            };
            match id {
                Some(id) => ids.push(id),
                None if self.name_taken(name) => return Err(self.wrong_kind(name, kind)),
                None if if_exists => notices.push(
                    format!("{} \"{}\" does not exist, skipping", kind.noun(), name.name).into(),
                ),
                None => {
                    return Err(Error::new(
                        SqlState::UNDEFINED_TABLE,
                        format!("{} \"{}\" does not exist", kind.noun(), name.name),
                    ));
                }
            }
        }
        notices.extend(self.drop_ids_now(&ids, cascade, None)?);
        // What a statement after the DROP reads (eddy_dead_letters, eddy_late_events) no
        // longer shows the dropped views.
        self.runtime.barrier().await?;
        Ok(notices)
    }

    /// PostgreSQL's answer to `DROP VIEW t` for a table `t`: `"t" is not a view` (42809).
    fn wrong_kind(&self, name: &QualifiedName, kind: ObjectKind) -> Error {
        let actual = if self.table(name).is_some() {
            Some("TABLE")
        } else if self.view(name).is_some() {
            Some("MATERIALIZED VIEW")
        } else if self.plain_view(name).is_some() {
            Some("VIEW")
        } else if self.source(name).is_some() {
            Some("SOURCE")
        } else {
            None
        };
        let error = Error::new(
            SqlState::WRONG_OBJECT_TYPE,
            format!("\"{}\" is not a {}", name.name, kind.noun()),
        );
        match actual {
            Some(what) => error.with_hint(format!(
                "Use DROP {what} to remove a {}.",
                what.to_lowercase()
            )),
            None => error,
        }
    }

    /// Drops `ids` (call under the write lock) and, with `cascade`, everything that reads them;
    /// without it, anything that reads them is a 2BP01 error naming `blame` (default: the first
    /// object with dependents). Returns the NOTICEs `CASCADE` sends.
    pub(crate) fn drop_ids_now(
        &self,
        ids: &[ObjectId],
        cascade: bool,
        blame: Option<&str>,
    ) -> Result<Vec<Notice>> {
        let doomed = self.dependents_of(ids);
        if let Some(first) = doomed.first()
            && !cascade
        {
            let blamed = blame.map_or_else(|| first.reads.clone(), str::to_owned);
            let detail: Vec<String> = doomed
                .iter()
                .map(|d| format!("{} depends on {}", d.description, d.reads))
                .collect();
            return Err(Error::new(
                SqlState::DEPENDENT_OBJECTS_STILL_EXIST,
                format!("cannot drop {blamed} because other objects depend on it"),
            )
            .with_detail(detail.join("\n"))
            .with_hint("Use DROP ... CASCADE to drop the dependent objects too."));
        }
        let notices = cascade_notice(doomed.iter().map(|d| d.description.clone()).collect())
            .into_iter()
            .collect();
        // Dependents first (newest first), then the named objects.
        let mut order: Vec<ObjectId> = doomed.iter().map(|d| d.id).collect();
        order.sort_by_key(|id| std::cmp::Reverse(*id));
        for id in order.into_iter().chain(ids.iter().copied()) {
            self.drop_one_now(id)?;
        }
        Ok(notices)
    }

    /// The materialized views that read `id`, directly or through other views.
    pub(crate) fn materialized_readers(&self, id: ObjectId) -> Vec<String> {
        let views = self.views.read().unwrap_or_else(|p| p.into_inner());
        self.dependents_of(&[id])
            .into_iter()
            .filter(|d| views.values().any(|v| v.def.id == d.id))
            .map(|d| d.description)
            .collect()
    }

    /// What reads `id`, transitively, leaving out `listed`: (id, description, what it reads).
    pub(crate) fn dependents_of_one(
        &self,
        id: ObjectId,
        listed: &[ObjectId],
    ) -> Vec<(ObjectId, String, String)> {
        let mut doomed = Vec::new();
        self.collect_dependents(id, listed, &mut doomed);
        doomed
            .into_iter()
            .map(|d| (d.id, d.description, d.reads))
            .collect()
    }

    /// Everything that reads `ids`, transitively (sinks included), depth first in id order
    /// (the order PostgreSQL lists them in).
    fn dependents_of(&self, ids: &[ObjectId]) -> Vec<Doomed> {
        let mut doomed: Vec<Doomed> = Vec::new();
        for id in ids {
            self.collect_dependents(*id, ids, &mut doomed);
        }
        doomed
    }

    fn collect_dependents(&self, id: ObjectId, named: &[ObjectId], doomed: &mut Vec<Doomed>) {
        let reads = self.description(id);
        for dependent in self.direct_dependents(id) {
            if !named.contains(&dependent) && !doomed.iter().any(|d| d.id == dependent) {
                doomed.push(Doomed {
                    id: dependent,
                    description: self.description(dependent),
                    reads: reads.clone(),
                });
                self.collect_dependents(dependent, named, doomed);
            }
        }
    }

    /// The views (plain and materialized) and sinks that read `id` directly.
    fn direct_dependents(&self, id: ObjectId) -> Vec<ObjectId> {
        let mut out: Vec<ObjectId> = self
            .views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|v| v.def.dependencies.contains(&id))
            .map(|v| v.def.id)
            .collect();
        out.extend(
            self.plain_views
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .filter(|v| v.dependencies.contains(&id))
                .map(|v| v.id),
        );
        out.extend(
            self.sinks
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .filter(|s| s.def.view == id)
                .map(|s| s.def.id),
        );
        out.sort();
        out
    }

    /// Removes one object, whatever it is (call under the write lock).
    fn drop_one_now(&self, id: ObjectId) -> Result<()> {
        let sink = self
            .sinks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|s| s.def.id == id)
            .map(|s| s.def.qualified());
        if let Some(sink) = sink {
            return self.drop_sink_now(&sink);
        }
        let view = self
            .views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|v| v.def.id == id)
            .cloned();
        if let Some(view) = view {
            return self.drop_view_now(&view);
        }
        let plain = self
            .plain_views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|v| v.id == id)
            .map(|v| v.qualified());
        if let Some(plain) = plain {
            self.meta.delete_object(id)?;
            self.plain_views
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&plain);
            return Ok(());
        }
        if let Some(table) = self.table_by_id(id) {
            // The catalog first: a crash before the log is removed leaves an orphan log that
            // the next start deletes.
            self.meta.delete_object(id)?;
            self.tables
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&table.def.qualified());
            self.log.drop_object(id)?;
            // Subscriptions reading the table end.
            return self.runtime.drop_view(id);
        }
        if let Some(source) = self.source_by_id(id) {
            self.meta.delete_object(id)?;
            self.sources
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&source.def.qualified());
            // Subscriptions reading the source end (their readers stop with them).
            for reader in source.readers() {
                self.drop_temporary_view(reader.view);
            }
            return self.runtime.drop_view(id);
        }
        Ok(())
    }

    pub(crate) fn drop_view_now(&self, view: &Arc<View>) -> Result<()> {
        self.stop_readers(view.def.id);
        self.meta.delete_object(view.def.id)?;
        self.views
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&view.def.qualified());
        self.runtime.drop_view(view.def.id)
    }

    /// The name of a table, source or view, as messages show it (`s.t` outside `public`).
    pub(crate) fn object_name(&self, id: ObjectId) -> Option<String> {
        self.qualified_name_of(id).map(|n| n.display())
    }

    fn qualified_name_of(&self, id: ObjectId) -> Option<QualifiedName> {
        if let Some(t) = self.table_by_id(id) {
            return Some(t.def.qualified());
        }
        if let Some(s) = self.source_by_id(id) {
            return Some(s.def.qualified());
        }
        if let Some(v) = self
            .views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|v| v.def.id == id)
        {
            return Some(v.def.qualified());
        }
        if let Some(v) = self
            .plain_views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|v| v.id == id)
        {
            return Some(v.qualified());
        }
        self.sinks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|s| s.def.id == id)
            .map(|s| s.def.qualified())
    }

    /// `table t`, `view s.v`, ...: how PostgreSQL describes an object in DROP messages.
    pub(crate) fn description(&self, id: ObjectId) -> String {
        let noun = if self.table_by_id(id).is_some() {
            "table"
        } else if self.source_by_id(id).is_some() {
            "source"
        } else if self
            .views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|v| v.def.id == id)
        {
            "materialized view"
        } else if self
            .plain_views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|v| v.id == id)
        {
            "view"
        } else {
            "sink"
        };
        match self.qualified_name_of(id) {
            Some(name) => format!("{noun} {}", name.described()),
            None => format!("object {id}"),
        }
    }
}

impl crate::Session {
    /// `DROP TABLE | MATERIALIZED VIEW | VIEW | SOURCE [IF EXISTS] names [CASCADE]`.
    pub(crate) async fn drop_statement(
        &mut self,
        names: &[eddy_sql::ast::ObjectName],
        if_exists: bool,
        cascade: bool,
        kind: ObjectKind,
        tag: &'static str,
    ) -> Result<crate::Outcome> {
        let mut notices = Vec::new();
        let names = self.existing_names(names, if_exists, &mut notices)?;
        notices.extend(
            self.engine
                .drop_objects(&names, if_exists, cascade, kind)
                .await?,
        );
        Ok(crate::session::with_notices(
            notices,
            crate::Outcome::Command { tag, rows: None },
        ))
    }
}
