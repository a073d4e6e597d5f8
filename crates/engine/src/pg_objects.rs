//! The engine's side of `pg_catalog` and `information_schema`: its relations with their OIDs
//! (allocated once per object and kept in the metadata store), their sizes, and the live
//! sessions (`pg_stat_activity`).
//!
//! Tables are relkind `r`, materialized views `m`, plain views `v`, sources `f` (foreign tables:
//! their records live elsewhere); sinks are not relations and do not appear. Each relation is
//! in its schema (`pg_namespace`: [`Engine::namespaces`]).

use std::collections::BTreeMap;
use std::sync::Mutex;

use eddy_common::ObjectId;
use eddy_sql::pg_catalog::objects::{FIRST_USER_OID, OIDS_PER_OBJECT};
use eddy_sql::pg_catalog::{Activity, PUBLIC_OID, Relation, RelationKind};

use crate::{Engine, QualifiedName};

/// One relation before its OIDs are known.
struct Object {
    id: ObjectId,
    name: QualifiedName,
    kind: RelationKind,
    columns: arrow::datatypes::SchemaRef,
    primary_key: Vec<usize>,
    definition: Option<String>,
    inputs: Vec<ObjectId>,
}

fn objects(engine: &Engine) -> Vec<Object> {
    let mut out = Vec::new();
    for table in engine.tables() {
        let def = &table.def;
        out.push(Object {
            id: def.id,
            name: def.qualified(),
            kind: RelationKind::Table,
            columns: table.schema.clone(),
            primary_key: def.primary_key.clone(),
            definition: None,
            inputs: Vec::new(),
        });
    }
    for view in engine
        .views
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
    {
        let def = &view.def;
        out.push(Object {
            id: def.id,
            name: def.qualified(),
            kind: RelationKind::MaterializedView,
            columns: view.schema.clone(),
            primary_key: Vec::new(),
            definition: view_query(&def.sql),
            inputs: def.dependencies.clone(),
        });
    }
    for source in engine
        .sources
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
    {
        let def = &source.def;
        out.push(Object {
            id: def.id,
            name: def.qualified(),
            kind: RelationKind::Source,
            columns: source.schema.clone(),
            primary_key: def.primary_key.clone(),
            definition: None,
            inputs: Vec::new(),
        });
    }
    for view in engine
        .plain_views
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .values()
    {
        let columns = view.arrow_schema().unwrap_or_else(|e| {
            tracing::error!(view = %view.qualified().display(), error = %e, "a plain view's columns are unreadable");
            std::sync::Arc::new(arrow::datatypes::Schema::empty())
        });
        out.push(Object {
            id: view.id,
            name: view.qualified(),
            kind: RelationKind::View,
            columns,
            primary_key: Vec::new(),
            definition: Some(view.query.clone()),
            inputs: view.dependencies.clone(),
        });
    }
    out
}

/// The query of a `CREATE MATERIALIZED VIEW` statement, as Eddy prints it back.
fn view_query(sql: &str) -> Option<String> {
    let parsed = eddy_sql::parse_statements(sql).ok()?;
    match &parsed.first()?.statement {
        eddy_sql::Statement::CreateMaterializedView { create, .. } => {
            Some(create.query.to_string())
        }
        _ => None,
    }
}

/// Every relation of the engine, with its OIDs (allocated on first sight, then kept).
pub(crate) fn relations(engine: &Engine) -> Vec<Relation> {
    let objects = objects(engine);
    let ids: Vec<ObjectId> = objects.iter().map(|o| o.id).collect();
    let oids = match engine
        .meta
        .object_oids(&ids, OIDS_PER_OBJECT, FIRST_USER_OID)
    {
        Ok(oids) => oids,
        Err(e) => {
            tracing::error!(error = %e, "allocating OIDs failed; the catalogs list no relations");
            return Vec::new();
        }
    };
    let oid_of: BTreeMap<ObjectId, u32> = ids.iter().copied().zip(oids.iter().copied()).collect();
    let namespaces: BTreeMap<String, u32> = engine
        .namespaces()
        .into_iter()
        .map(|n| (n.name, n.oid))
        .collect();
    objects
        .into_iter()
        .zip(oids)
        .map(|(o, oid)| Relation {
            oid,
            namespace_oid: namespaces
                .get(&o.name.schema)
                .copied()
                .unwrap_or(PUBLIC_OID),
            schema: o.name.schema,
            name: o.name.name,
            kind: o.kind,
            columns: o.columns,
            primary_key: o.primary_key,
            definition: o.definition,
            inputs: o
                .inputs
                .iter()
                .filter_map(|i| oid_of.get(i).copied())
                .collect(),
        })
        .collect()
}

/// Bytes the relation with this OID takes: a table's log; a materialized view's operator state.
pub(crate) fn relation_size(engine: &Engine, oid: u32) -> Option<u64> {
    let objects = objects(engine);
    let ids: Vec<ObjectId> = objects.iter().map(|o| o.id).collect();
    let oids = engine
        .meta
        .object_oids(&ids, OIDS_PER_OBJECT, FIRST_USER_OID)
        .ok()?;
    let object = objects
        .iter()
        .zip(oids)
        .find(|(_, o)| *o == oid)
        .map(|(o, _)| o)?;
    match object.kind {
        RelationKind::Table => Some(engine.log.object_bytes(object.id)),
        RelationKind::MaterializedView => {
            let operators = engine.runtime().operators();
            let name = object.name.display();
            Some(
                operators
                    .iter()
                    .filter(|(view, _)| *view == name)
                    .map(|(_, s)| s.state_bytes as u64)
                    .sum(),
            )
        }
        RelationKind::Source | RelationKind::View => Some(0),
    }
}

/// The sessions connected now, by backend pid.
#[derive(Debug)]
pub(crate) struct Sessions {
    sessions: Mutex<BTreeMap<i32, Activity>>,
    clock: std::sync::Arc<dyn eddy_common::time::Clock>,
}

impl Sessions {
    pub(crate) fn new(clock: std::sync::Arc<dyn eddy_common::time::Clock>) -> Self {
        Sessions {
            sessions: Mutex::default(),
            clock,
        }
    }

    pub(crate) fn register(&self, info: &eddy_sql::SessionInfo) {
        let now = self.clock.now_micros();
        let activity = Activity {
            pid: info.backend_pid,
            user: info.user.clone(),
            database: info.database.clone(),
            application_name: String::new(),
            client_addr: None,
            client_port: None,
            backend_start_micros: now,
            transaction_start_micros: None,
            query_start_micros: None,
            state_change_micros: Some(now),
            state: "idle".into(),
            query: String::new(),
        };
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(info.backend_pid, activity);
    }

    pub(crate) fn remove(&self, pid: i32) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&pid);
    }

    /// A statement starts (`query` is its text) or ends (`None`); `in_transaction` says
    /// whether a transaction block is open.
    pub(crate) fn update(
        &self,
        pid: i32,
        query: Option<String>,
        in_transaction: bool,
        application_name: &str,
    ) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let Some(s) = sessions.get_mut(&pid) else {
            return;
        };
        let now = self.clock.now_micros();
        application_name.clone_into(&mut s.application_name);
        s.state_change_micros = Some(now);
        s.transaction_start_micros = match (in_transaction, s.transaction_start_micros) {
            (true, Some(t)) => Some(t),
            (true, None) => Some(now),
            (false, _) if query.is_some() => Some(now),
            (false, _) => None,
        };
        match query {
            Some(q) => {
                s.query = q;
                s.query_start_micros = Some(now);
                s.state = "active".into();
            }
            None => {
                s.state = if in_transaction {
                    "idle in transaction"
                } else {
                    "idle"
                }
                .into()
            }
        }
    }

    pub(crate) fn list(&self) -> Vec<Activity> {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }
}
