//! Plain views (`CREATE [OR REPLACE] VIEW`): named queries, kept in the catalog and expanded
//! by the planner wherever a statement names them (ad-hoc queries, materialized views, other
//! views), so a materialized view over a plain view is maintained from the tables beneath it.
//!
//! Entry points: [`Session::create_plain_view`], [`Engine::plain_view`]. Invariants: a view's
//! columns (names and types) are fixed when it is created; `OR REPLACE` may only add columns
//! at the end (PostgreSQL's rule, 42P16 otherwise); a view records the relations it names, so
//! dropping one of them is refused (2BP01) unless CASCADE.

use std::sync::Arc;

use eddy_common::{Error, ObjectId, Result, SqlState};
use eddy_sql::ast;
use eddy_sql::{Planned, QualifiedName, normalize_ident};
use serde::{Deserialize, Serialize};

use crate::catalog::{ColumnDef, ObjectDef, public_schema, sql_name};
use crate::session::Outcome;
use crate::{Engine, Session};

/// A plain view as the catalog keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlainViewDef {
    pub id: ObjectId,
    #[serde(default = "public_schema")]
    pub schema: String,
    pub name: String,
    /// Its query, with the names a `public` search path would not find qualified.
    pub query: String,
    /// Its columns as they were when it was created (or replaced).
    pub columns: Vec<ColumnDef>,
    /// Whether the statement named the columns (`CREATE VIEW v (a, b) AS ...`).
    #[serde(default)]
    pub named_columns: bool,
    /// The relations and plain views its query names.
    pub dependencies: Vec<ObjectId>,
}

impl PlainViewDef {
    pub fn qualified(&self) -> QualifiedName {
        QualifiedName::new(self.schema.clone(), self.name.clone())
    }

    /// `CREATE VIEW` text equivalent to this definition (SHOW CREATE VIEW).
    pub fn create_sql(&self) -> String {
        let columns = if self.named_columns {
            let names: Vec<String> = self
                .columns
                .iter()
                .map(|c| crate::quote_ident(&c.name))
                .collect();
            format!(" ({})", names.join(", "))
        } else {
            String::new()
        };
        format!(
            "CREATE VIEW {}{columns} AS {}",
            sql_name(&self.qualified()),
            self.query
        )
    }

    /// The view's Arrow schema (columns nullable: a view's rows come from a query).
    pub fn arrow_schema(&self) -> Result<arrow::datatypes::SchemaRef> {
        let columns: Vec<ColumnDef> = self
            .columns
            .iter()
            .map(|c| ColumnDef {
                nullable: true,
                ..c.clone()
            })
            .collect();
        let table = crate::TableDef {
            id: self.id,
            schema: self.schema.clone(),
            name: self.name.clone(),
            columns,
            primary_key: Vec::new(),
            append_only: false,
            watermark: None,
            options: Vec::new(),
            partitions: 1,
            format: None,
            includes: Vec::new(),
        };
        table.schema()
    }
}

impl Engine {
    pub(crate) fn plain_view(&self, name: &QualifiedName) -> Option<Arc<PlainViewDef>> {
        self.plain_views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// The plain views, in every schema.
    pub(crate) fn plain_view_names(&self) -> Vec<QualifiedName> {
        self.plain_views
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Stores a new plain view, or (`or_replace`) replaces one keeping its id. The definition's
    /// id is ignored for a new view.
    async fn put_plain_view(&self, mut def: PlainViewDef, or_replace: bool) -> Result<()> {
        let _guard = self.lock_writes().await;
        let name = def.qualified();
        match self.plain_view(&name) {
            Some(old) if or_replace => {
                check_replacement(&old.columns, &def.columns)?;
                // A materialized view's dataflow (and its checkpointed state) was built from
                // the old query: it would silently disagree with the new one.
                if let Some(reader) = self.materialized_readers(old.id).first() {
                    return Err(Error::unsupported(format!("cannot replace view \"{}\" because {reader} reads it", name.name))
                        .with_hint("drop the materialized views that read it, replace the view, then create them again"));
                }
                def.id = old.id;
            }
            Some(_) => {
                return Err(Error::new(
                    SqlState::DUPLICATE_TABLE,
                    format!("relation \"{}\" already exists", name.name),
                ));
            }
            None if self.name_taken(&name) && or_replace => {
                return Err(Error::new(
                    SqlState::WRONG_OBJECT_TYPE,
                    format!("\"{}\" is not a view", name.name),
                ));
            }
            None if self.name_taken(&name) => {
                return Err(Error::new(
                    SqlState::DUPLICATE_TABLE,
                    format!("relation \"{}\" already exists", name.name),
                ));
            }
            None => {
                self.check_schema_for_create(&name)?;
                def.id = self.meta.allocate_object_id()?;
            }
        }
        if def.dependencies.contains(&def.id) {
            return Err(Error::new(
                SqlState::INVALID_RECURSION,
                format!(
                    "infinite recursion detected in rules for relation \"{}\"",
                    name.name
                ),
            ));
        }
        self.meta
            .put_object(def.id, &ObjectDef::View(def.clone()).encode()?)?;
        self.plain_views
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, Arc::new(def));
        Ok(())
    }
}

/// PostgreSQL's rule for `CREATE OR REPLACE VIEW`: the old columns stay, in order, with their
/// names and types; new ones may follow.
fn check_replacement(old: &[ColumnDef], new: &[ColumnDef]) -> Result<()> {
    if new.len() < old.len() {
        return Err(Error::new(
            SqlState::INVALID_TABLE_DEFINITION,
            "cannot drop columns from view",
        ));
    }
    for (old, new) in old.iter().zip(new) {
        if old.name != new.name {
            return Err(Error::new(
                SqlState::INVALID_TABLE_DEFINITION,
                format!(
                    "cannot change name of view column \"{}\" to \"{}\"",
                    old.name, new.name
                ),
            )
            .with_hint(
                "Use ALTER VIEW ... RENAME COLUMN ... to change name of view column instead.",
            ));
        }
        if old.pg_type != new.pg_type {
            return Err(Error::new(
                SqlState::INVALID_TABLE_DEFINITION,
                format!(
                    "cannot change data type of view column \"{}\" from {} to {}",
                    old.name, old.pg_type, new.pg_type
                ),
            ));
        }
    }
    Ok(())
}

impl Session {
    /// `CREATE [OR REPLACE] VIEW name [(columns)] AS query`.
    pub(crate) async fn create_plain_view(&mut self, create: &ast::CreateView) -> Result<Outcome> {
        if create.temporary {
            return Err(Error::unsupported("CREATE TEMPORARY VIEW is not supported"));
        }
        if create.if_not_exists {
            return Err(Error::syntax("syntax error at or near \"NOT\"")
                .with_hint("CREATE VIEW takes no IF NOT EXISTS: use CREATE OR REPLACE VIEW"));
        }
        if !matches!(create.options, ast::CreateTableOptions::None) {
            return Err(Error::unsupported(
                "CREATE VIEW ... WITH (options) is not supported",
            ));
        }
        let name = self.new_name(&create.name)?;
        let mut query = (*create.query).clone();
        let dependencies = self.planner.qualify_for_storage(&mut query)?;
        let Planned::Query(plan) = self
            .planner
            .plan(&ast::Statement::Query(create.query.clone()))
            .await?
        else {
            return Err(Error::internal("a view's query did not plan as a query"));
        };
        let columns = view_columns(&plan.schema(), &create.columns)?;
        let def = PlainViewDef {
            id: ObjectId(0),
            schema: name.schema.clone(),
            name: name.name.clone(),
            query: eddy_sql::display_temporal(&query.to_string()),
            columns,
            named_columns: !create.columns.is_empty(),
            dependencies,
        };
        self.engine.put_plain_view(def, create.or_replace).await?;
        Ok(Outcome::Command {
            tag: "CREATE VIEW",
            rows: None,
        })
    }

    /// `SHOW CREATE VIEW name`.
    pub(crate) fn show_create_view(&self, name: &ast::ObjectName) -> Result<Outcome> {
        let name = self.existing_name(name)?;
        let view = self.engine.plain_view(&name).ok_or_else(|| {
            let state = if self.engine.name_taken(&name) {
                SqlState::WRONG_OBJECT_TYPE
            } else {
                SqlState::UNDEFINED_TABLE
            };
            Error::new(state, format!("view \"{}\" does not exist", name.name))
        })?;
        crate::session::rows_of_text(
            &["name", "create_sql"],
            vec![vec![name.display(), view.create_sql()]],
        )
    }
}

/// The view's columns: the query's, renamed by the column list when one is given.
fn view_columns(
    schema: &arrow::datatypes::SchemaRef,
    names: &[ast::ViewColumnDef],
) -> Result<Vec<ColumnDef>> {
    if names.len() > schema.fields().len() {
        return Err(Error::syntax(
            "CREATE VIEW specifies more column names than columns",
        ));
    }
    let mut columns: Vec<ColumnDef> = Vec::with_capacity(schema.fields().len());
    for (i, field) in schema.fields().iter().enumerate() {
        let name = names
            .get(i)
            .map_or_else(|| field.name().clone(), |c| normalize_ident(&c.name));
        if columns.iter().any(|c| c.name == name) {
            return Err(Error::new(
                SqlState::DUPLICATE_COLUMN,
                format!("column \"{name}\" specified more than once"),
            ));
        }
        columns.push(ColumnDef {
            name,
            pg_type: eddy_sql::types::pg_type_name(field),
            arrow_type: field.data_type().to_string(),
            nullable: true,
            proctime: false,
            default: None,
        });
    }
    Ok(columns)
}
