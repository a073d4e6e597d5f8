//! What the engine tells the catalogs about its objects, sessions and settings, and how an
//! object's OIDs follow from the one the engine keeps for it.
//!
//! Each object owns a block of [`OIDS_PER_OBJECT`] consecutive OIDs, allocated once and kept in
//! Eddy's metadata store (so a client that caches OIDs stays right across restarts): the
//! relation itself, its primary key's index, the primary key constraint and its row type.

use arrow::datatypes::SchemaRef;

/// OIDs one object takes: relation, primary key index, primary key constraint, row type, and
/// one per possible column for its `DEFAULT` (`pg_attrdef`).
pub const OIDS_PER_OBJECT: u32 = 4 + eddy_common::limits::TABLE_COLUMNS_MAX as u32;
/// The first OID for users' objects, as in PostgreSQL.
pub const FIRST_USER_OID: u32 = 16384;

pub const PG_CATALOG_OID: u32 = 11;
pub const PUBLIC_OID: u32 = 2200;
pub const PUBLIC_SCHEMA: &str = "public";
pub const INFORMATION_SCHEMA_OID: u32 = 13207;
pub const PG_TOAST_OID: u32 = 99;
/// The bootstrap superuser's OID in PostgreSQL: Eddy's `eddy`.
pub const SUPERUSER_OID: u32 = 10;
pub const DATABASE_OID: u32 = 5;
pub const HEAP_AM_OID: u32 = 2;
pub const BTREE_AM_OID: u32 = 403;

/// What kind of relation an object is, in PostgreSQL's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelationKind {
    Table,
    /// A materialized view (`relkind` `m`).
    MaterializedView,
    /// A plain view (`relkind` `v`): a named query.
    View,
    /// A source: its records live in an external system, so PostgreSQL's nearest kind is a
    /// foreign table (`relkind` `f`, `FOREIGN` in `information_schema.tables`).
    Source,
}

impl RelationKind {
    pub fn relkind(self) -> &'static str {
        match self {
            RelationKind::Table => "r",
            RelationKind::MaterializedView => "m",
            RelationKind::View => "v",
            RelationKind::Source => "f",
        }
    }
}

/// One relation of the engine's catalog.
#[derive(Debug, Clone)]
pub struct Relation {
    /// The first OID of the object's block.
    pub oid: u32,
    pub schema: String,
    /// The OID of its schema (`pg_namespace`).
    pub namespace_oid: u32,
    pub name: String,
    pub kind: RelationKind,
    /// The columns; field metadata carries the declared PostgreSQL types, nullability is
    /// what `NOT NULL` declared.
    pub columns: SchemaRef,
    /// Indexes into `columns`.
    pub primary_key: Vec<usize>,
    /// A view's query, as `pg_get_viewdef` shows it.
    pub definition: Option<String>,
    /// OIDs of the relations a view reads.
    pub inputs: Vec<u32>,
}

impl Relation {
    pub fn index_oid(&self) -> u32 {
        self.oid + 1
    }
    /// A view's `_RETURN` rule (`pg_rewrite`); views have no index, so it takes that OID.
    pub fn rule_oid(&self) -> u32 {
        self.oid + 1
    }
    pub fn constraint_oid(&self) -> u32 {
        self.oid + 2
    }
    pub fn rowtype_oid(&self) -> u32 {
        self.oid + 3
    }
    /// The `pg_attrdef` OID of column `index`'s default.
    pub fn default_oid(&self, index: usize) -> u32 {
        self.oid + 4 + index as u32
    }
    /// Column `index`'s `DEFAULT` expression (tables only).
    pub fn column_default(&self, index: usize) -> Option<&str> {
        if self.kind != RelationKind::Table {
            return None;
        }
        self.columns
            .fields()
            .get(index)?
            .metadata()
            .get(crate::types::DEFAULT_KEY)
            .map(String::as_str)
    }
    /// The primary key index's name, as PostgreSQL names it.
    pub fn index_name(&self) -> String {
        format!("{}_pkey", self.name)
    }
}

/// A schema and its OID.
#[derive(Debug, Clone)]
pub struct Namespace {
    pub oid: u32,
    pub name: String,
}

/// One client session, as `pg_stat_activity` shows it.
#[derive(Debug, Clone)]
pub struct Activity {
    pub pid: i32,
    pub user: String,
    pub database: String,
    pub application_name: String,
    pub client_addr: Option<String>,
    pub client_port: Option<i32>,
    pub backend_start_micros: i64,
    pub transaction_start_micros: Option<i64>,
    pub query_start_micros: Option<i64>,
    pub state_change_micros: Option<i64>,
    /// `active`, `idle`, `idle in transaction`, ...
    pub state: String,
    pub query: String,
}
