//! `pg_catalog` as PostgreSQL 15 has it, served live from the engine's catalog: each table is
//! built from [`CatalogSource`] when a statement reads it, so it never lags the objects.
//!
//! Entry points: [`PgCatalog`] (the schema provider, also reached by unqualified names such as
//! `pg_class`), [`functions::register`] (the catalog functions: `format_type`, `::regclass`, ...)
//! and [`rewrite::rewrite`] (what clients write that DataFusion would not plan as PostgreSQL
//! does). Files: [`spec`] (every catalog's PostgreSQL columns), [`relations`], [`types`],
//! [`system`], [`objects`] (what the engine supplies, and the OID scheme).
//! Catalogs of things Eddy does not have (`pg_trigger`, `pg_policy`, `pg_enum`, ...) exist
//! with PostgreSQL's columns and no rows, so the queries that join them run.

pub mod functions;
mod information_schema;
mod keywords;
pub mod objects;
pub(crate) mod relations;
pub mod rewrite;
pub(crate) mod spec;
mod system;
pub(crate) mod types;

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::error::Result as DfResult;

pub use objects::{
    Activity, INFORMATION_SCHEMA_OID, Namespace, PG_CATALOG_OID, PUBLIC_OID, Relation, RelationKind,
};

use crate::catalog::CatalogSource;

pub(crate) const SCHEMA: &str = "pg_catalog";

/// Everything a catalog query may read, taken once per table built.
pub(crate) struct Snapshot {
    /// Users' relations, then the catalogs themselves.
    pub relations: Vec<Relation>,
    pub user_relations: usize,
    pub namespaces: Vec<Namespace>,
}

impl Snapshot {
    pub(crate) fn take(source: &dyn CatalogSource) -> Snapshot {
        let mut relations = source.relations();
        relations.sort_by(|a, b| (&a.schema, &a.name).cmp(&(&b.schema, &b.name)));
        let user_relations = relations.len();
        relations.extend(relations::system_relations());
        Snapshot {
            relations,
            user_relations,
            namespaces: source.namespaces(),
        }
    }

    pub(crate) fn users(&self) -> &[Relation] {
        &self.relations[..self.user_relations]
    }

    /// Every schema: the system ones and the users'.
    pub(crate) fn all_namespaces(&self) -> Vec<Namespace> {
        let mut all = relations::system_namespaces();
        all.extend(self.namespaces.iter().cloned());
        all
    }

    pub(crate) fn relation(&self, oid: u32) -> Option<&Relation> {
        self.relations.iter().find(|r| r.oid == oid)
    }

    /// The relation whose primary key has index `oid` or constraint `oid`.
    pub(crate) fn keyed_by(&self, oid: u32) -> Option<&Relation> {
        self.users().iter().find(|r| {
            !r.primary_key.is_empty() && (r.index_oid() == oid || r.constraint_oid() == oid)
        })
    }
}

/// The `pg_catalog` schema of one session.
#[derive(Debug)]
pub(crate) struct PgCatalog {
    pub source: Arc<dyn CatalogSource>,
    pub info: crate::SessionInfo,
    /// The session's functions (`pg_proc`).
    pub functions: Arc<Vec<system::Function>>,
}

impl PgCatalog {
    pub(crate) fn build(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        // (Each name here is in POPULATED; every other catalog is always empty.)
        let Some(spec) = spec::spec(SCHEMA, name) else {
            return Ok(None);
        };
        let snapshot = || Snapshot::take(self.source.as_ref());
        let user = self.info.user.as_str();
        let rows = match name {
            "pg_namespace" => relations::pg_namespace(&self.source.namespaces())?,
            "pg_class" => relations::pg_class(&snapshot().relations)?,
            "pg_attribute" => relations::pg_attribute(&snapshot().relations)?,
            "pg_index" => relations::pg_index(snapshot().users())?,
            "pg_constraint" => relations::pg_constraint(snapshot().users())?,
            "pg_depend" => relations::pg_depend(snapshot().users())?,
            "pg_rewrite" => relations::pg_rewrite(snapshot().users())?,
            "pg_tables" => relations::pg_tables(&snapshot().relations)?,
            "pg_views" => relations::pg_views(&snapshot().relations)?,
            "pg_matviews" => relations::pg_matviews(snapshot().users())?,
            "pg_indexes" => relations::pg_indexes(snapshot().users())?,
            "pg_type" => types::pg_type(snapshot().users())?,
            "pg_description" => relations::pg_description()?,
            "pg_attrdef" => relations::pg_attrdef(snapshot().users())?,
            "pg_stat_user_tables" => relations::pg_stat_user_tables(snapshot().users())?,
            "pg_database" => system::pg_database(&self.info.database)?,
            "pg_roles" | "pg_authid" => system::pg_roles(user, name)?,
            "pg_user" => system::pg_user(user)?,
            "pg_settings" => system::pg_settings(&self.source.settings())?,
            "pg_stat_activity" => {
                system::pg_stat_activity(&self.source.activity(), &self.info.database)?
            }
            "pg_am" => system::pg_am()?,
            "pg_collation" => system::pg_collation()?,
            "pg_tablespace" => system::pg_tablespace()?,
            "pg_language" => system::pg_language()?,
            "pg_proc" => system::pg_proc(&self.functions)?,
            _ => spec.builder(),
        };
        Ok(Some(rows.table()?))
    }
}

#[async_trait]
impl SchemaProvider for PgCatalog {
    fn table_names(&self) -> Vec<String> {
        spec::specs()
            .iter()
            .filter(|s| s.schema == SCHEMA)
            .map(|s| s.name.to_owned())
            .collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        self.build(name)
    }

    fn table_exist(&self, name: &str) -> bool {
        spec::spec(SCHEMA, name).is_some()
    }
}

/// The pg_catalog relations [`PgCatalog::build`] fills; the others never have rows in Eddy.
const POPULATED: [&str; 26] = [
    "pg_attrdef",
    "pg_namespace",
    "pg_class",
    "pg_attribute",
    "pg_index",
    "pg_constraint",
    "pg_depend",
    "pg_rewrite",
    "pg_tables",
    "pg_views",
    "pg_matviews",
    "pg_indexes",
    "pg_type",
    "pg_description",
    "pg_stat_user_tables",
    "pg_database",
    "pg_roles",
    "pg_authid",
    "pg_user",
    "pg_settings",
    "pg_stat_activity",
    "pg_am",
    "pg_collation",
    "pg_tablespace",
    "pg_language",
    "pg_proc",
];

/// Whether `pg_catalog.name` is a catalog Eddy never fills (`pg_sequence`, `pg_attrdef`, ...).
pub(crate) fn always_empty(name: &str) -> bool {
    spec::spec(SCHEMA, name).is_some() && !POPULATED.contains(&name)
}

pub(crate) use system::Function;

pub(crate) const INFORMATION_SCHEMA: &str = information_schema::SCHEMA;

/// Registers the catalog functions of a session whose other functions are registered, and
/// returns its `pg_catalog` (which lists them in `pg_proc`).
pub(crate) fn register(
    ctx: &datafusion::prelude::SessionContext,
    source: &Arc<dyn CatalogSource>,
    info: &crate::SessionInfo,
) -> eddy_common::Result<Arc<PgCatalog>> {
    let state = ctx.state();
    let mut named: Vec<(String, &'static str)> = Vec::new();
    named.extend(state.scalar_functions().keys().map(|n| (n.clone(), "f")));
    named.extend(state.aggregate_functions().keys().map(|n| (n.clone(), "a")));
    named.extend(state.window_functions().keys().map(|n| (n.clone(), "w")));
    for name in [
        "pg_get_constraintdef",
        "pg_get_indexdef",
        "pg_get_viewdef",
        "pg_get_expr",
        "format_type",
        "pg_table_is_visible",
        "pg_type_is_visible",
        "pg_get_userbyid",
        "current_setting",
        "set_config",
        "pg_size_pretty",
        "pg_total_relation_size",
        "to_regclass",
        "to_regtype",
    ] {
        named.push((name.to_owned(), "f"));
    }
    named.retain(|(n, _)| !functions::is_internal(n));
    let functions = Arc::new(system::functions(named));
    functions::register(ctx, Arc::clone(source), &info.user, Arc::clone(&functions));
    Ok(Arc::new(PgCatalog {
        source: Arc::clone(source),
        info: info.clone(),
        functions,
    }))
}

/// The `information_schema` of a session, next to its `pg_catalog`.
pub(crate) fn information_schema(
    source: &Arc<dyn CatalogSource>,
    system: &PgCatalog,
) -> Arc<dyn SchemaProvider> {
    Arc::new(information_schema::InformationSchema {
        source: Arc::clone(source),
        database: system.info.database.clone(),
        functions: Arc::clone(&system.functions),
    })
}
