//! Schemas: `CREATE SCHEMA`, `DROP SCHEMA`, and the list the catalog shows (`pg_namespace`).
//!
//! Entry points: [`Engine::create_schema`], [`Engine::drop_schemas`], [`Engine::schema_entries`].
//! `public` and `eddy_catalog` always exist and are not stored (so data directories from
//! before schemas read as they were: every object there is in `public`); a created schema is a
//! catalog entry, with an OID allocated like every object's (kept in the metadata store).

use eddy_common::{Error, ObjectId, Result, SqlState};
use eddy_sql::pg_catalog::Namespace;
use eddy_sql::pg_catalog::objects::{FIRST_USER_OID, OIDS_PER_OBJECT, PUBLIC_OID};
use eddy_sql::{EDDY_CATALOG_OID, EDDY_CATALOG_SCHEMA, PUBLIC_SCHEMA, QualifiedName};
use serde::{Deserialize, Serialize};

use crate::Engine;
use crate::catalog::ObjectDef;
use crate::session::Notice;

/// A schema made with `CREATE SCHEMA`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SchemaDef {
    pub id: ObjectId,
    pub name: String,
}

/// Schemas nothing can be created in or dropped.
fn is_system(name: &str) -> bool {
    name == EDDY_CATALOG_SCHEMA
        || name == crate::names::PG_CATALOG
        || name == "information_schema"
        || name.starts_with("pg_")
}

impl Engine {
    pub(crate) fn schema_exists(&self, name: &str) -> bool {
        name == PUBLIC_SCHEMA
            || name == EDDY_CATALOG_SCHEMA
            || self
                .schemas
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(name)
    }

    /// Every schema users' objects live in (`pg_namespace`), in OID order: `public` and
    /// `eddy_catalog` with fixed OIDs, created ones with OIDs allocated once and kept.
    pub(crate) fn namespaces(&self) -> Vec<Namespace> {
        let created: Vec<SchemaDef> = self
            .schemas
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let ids: Vec<ObjectId> = created.iter().map(|s| s.id).collect();
        let oids = self.meta.object_oids(&ids, OIDS_PER_OBJECT, FIRST_USER_OID).unwrap_or_else(|e| {
            tracing::error!(error = %e, "allocating schema OIDs failed; pg_namespace lists only public and eddy_catalog");
            Vec::new()
        });
        let mut out = vec![
            Namespace {
                oid: PUBLIC_OID,
                name: PUBLIC_SCHEMA.to_owned(),
            },
            Namespace {
                oid: EDDY_CATALOG_OID,
                name: EDDY_CATALOG_SCHEMA.to_owned(),
            },
        ];
        out.extend(
            created
                .into_iter()
                .zip(oids)
                .map(|(s, oid)| Namespace { oid, name: s.name }),
        );
        out.sort_by_key(|n| n.oid);
        out
    }

    /// Refuses a new object in a system schema (as PostgreSQL refuses one in `pg_catalog`).
    pub(crate) fn check_schema_for_create(&self, name: &QualifiedName) -> Result<()> {
        if is_system(&name.schema) {
            return Err(Error::new(
                SqlState::INSUFFICIENT_PRIVILEGE,
                format!(
                    "permission denied to create \"{}.{}\"",
                    name.schema, name.name
                ),
            )
            .with_detail("System catalog modifications are currently disallowed."));
        }
        if !self.schema_exists(&name.schema) {
            return Err(Error::new(
                SqlState::INVALID_SCHEMA_NAME,
                format!("schema \"{}\" does not exist", name.schema),
            ));
        }
        Ok(())
    }

    /// `CREATE SCHEMA [IF NOT EXISTS] name`: `Some(notice)` when it existed and `IF NOT
    /// EXISTS` was given.
    pub(crate) async fn create_schema(
        &self,
        name: &str,
        if_not_exists: bool,
    ) -> Result<Option<Notice>> {
        let _guard = self.lock_writes().await;
        if self.schema_exists(name)
            || name == crate::names::PG_CATALOG
            || name == "information_schema"
        {
            if if_not_exists {
                return Ok(Some(Notice {
                    state: SqlState::DUPLICATE_SCHEMA,
                    message: format!("schema \"{name}\" already exists, skipping"),
                    detail: None,
                }));
            }
            return Err(Error::new(
                SqlState::DUPLICATE_SCHEMA,
                format!("schema \"{name}\" already exists"),
            ));
        }
        if name.starts_with("pg_") {
            return Err(Error::new(
                SqlState::RESERVED_NAME,
                format!("unacceptable schema name \"{name}\""),
            )
            .with_detail("The prefix \"pg_\" is reserved for system schemas."));
        }
        let def = SchemaDef {
            id: self.meta.allocate_object_id()?,
            name: name.to_owned(),
        };
        self.meta
            .put_object(def.id, &ObjectDef::Schema(def.clone()).encode()?)?;
        self.schemas
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_owned(), def);
        Ok(None)
    }

    /// The objects `ids` of a schema, each followed by what reads it from elsewhere
    /// (transitively), in PostgreSQL's order: (description, what it depends on when that is
    /// not the schema).
    fn schema_dependents(&self, ids: &[ObjectId]) -> Vec<(String, Option<String>)> {
        let mut out = Vec::new();
        let mut listed: Vec<ObjectId> = ids.to_vec();
        for id in ids {
            out.push((self.description(*id), None));
            let others = self.dependents_of_one(*id, &listed);
            listed.extend(others.iter().map(|(id, _, _)| *id));
            out.extend(others.into_iter().map(|(_, what, on)| (what, Some(on))));
        }
        out
    }

    /// The ids of every object in `schema`, oldest first.
    fn objects_in(&self, schema: &str) -> Vec<ObjectId> {
        let mut ids: Vec<ObjectId> = Vec::new();
        ids.extend(
            self.tables
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|(n, _)| n.schema == schema)
                .map(|(_, t)| t.def.id),
        );
        ids.extend(
            self.views
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|(n, _)| n.schema == schema)
                .map(|(_, v)| v.def.id),
        );
        ids.extend(
            self.sources
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|(n, _)| n.schema == schema)
                .map(|(_, s)| s.def.id),
        );
        ids.extend(
            self.plain_views
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|(n, _)| n.schema == schema)
                .map(|(_, v)| v.id),
        );
        ids.extend(
            self.sinks
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|(n, _)| n.schema == schema)
                .map(|(_, s)| s.def.id),
        );
        ids.sort();
        ids
    }

    /// `DROP SCHEMA [IF EXISTS] names [CASCADE]`: a schema that holds objects is refused
    /// (2BP01) unless `cascade`, which drops them and everything that reads them. Returns the
    /// NOTICEs to send.
    pub(crate) async fn drop_schemas(
        &self,
        names: &[String],
        if_exists: bool,
        cascade: bool,
    ) -> Result<Vec<Notice>> {
        let _guard = self.lock_writes().await;
        let mut notices = Vec::new();
        let mut doomed: Vec<(String, Vec<ObjectId>)> = Vec::new();
        for name in names {
            if name == PUBLIC_SCHEMA || is_system(name) {
                if is_system(name) {
                    return Err(Error::new(
                        SqlState::DEPENDENT_OBJECTS_STILL_EXIST,
                        format!(
                            "cannot drop schema {name} because it is required by the database system"
                        ),
                    ));
                }
                return Err(Error::unsupported(
                    "dropping schema public is not supported",
                ));
            }
            if !self.schema_exists(name) {
                if if_exists {
                    notices.push(format!("schema \"{name}\" does not exist, skipping").into());
                    continue;
                }
                return Err(Error::new(
                    SqlState::INVALID_SCHEMA_NAME,
                    format!("schema \"{name}\" does not exist"),
                ));
            }
            doomed.push((name.clone(), self.objects_in(name)));
        }
        let inside: Vec<(ObjectId, String)> = doomed
            .iter()
            .flat_map(|(schema, ids)| ids.iter().map(move |id| (*id, schema.clone())))
            .collect();
        let ids: Vec<ObjectId> = inside.iter().map(|(id, _)| *id).collect();
        if let Some((_, schema)) = inside.first()
            && !cascade
        {
            let quoted = eddy_sql::pg::strings::quote_ident(schema);
            let own: Vec<ObjectId> = inside
                .iter()
                .filter(|(_, s)| s == schema)
                .map(|(id, _)| *id)
                .collect();
            let detail: Vec<String> = self
                .schema_dependents(&own)
                .into_iter()
                .map(|(what, on)| {
                    format!(
                        "{what} depends on {}",
                        on.unwrap_or_else(|| format!("schema {quoted}"))
                    )
                })
                .collect();
            return Err(Error::new(
                SqlState::DEPENDENT_OBJECTS_STILL_EXIST,
                format!("cannot drop schema {quoted} because other objects depend on it"),
            )
            .with_detail(detail.join("\n"))
            .with_hint("Use DROP ... CASCADE to drop the dependent objects too."));
        }
        notices.extend(crate::dropping::cascade_notice(
            self.schema_dependents(&ids)
                .into_iter()
                .map(|(what, _)| what)
                .collect(),
        ));
        if !ids.is_empty() {
            self.drop_ids_now(&ids, true, None)?;
            self.runtime.barrier().await?;
        }
        for (name, _) in &doomed {
            if let Some(def) = self
                .schemas
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(name)
            {
                self.meta.delete_object(def.id)?;
            }
        }
        Ok(notices)
    }
}

/// One schema name (`s`, not `a.b`), normalized.
fn schema_name(name: &eddy_sql::ast::ObjectName) -> Result<String> {
    match name.0.as_slice() {
        [part] => part
            .as_ident()
            .map(eddy_sql::normalize_ident)
            .ok_or_else(|| Error::syntax(format!("improper schema name: {name}"))),
        _ => Err(Error::syntax(format!(
            "improper qualified name (too many dotted names): {name}"
        ))),
    }
}

impl crate::Session {
    /// `CREATE SCHEMA [IF NOT EXISTS] name [AUTHORIZATION role]`.
    pub(crate) async fn create_schema_statement(
        &mut self,
        name: &eddy_sql::ast::SchemaName,
        if_not_exists: bool,
    ) -> Result<crate::Outcome> {
        use eddy_sql::ast::SchemaName;
        let name = match name {
            SchemaName::Simple(name) | SchemaName::NamedAuthorization(name, _) => {
                schema_name(name)?
            }
            SchemaName::UnnamedAuthorization(role) => eddy_sql::normalize_ident(role),
        };
        let done = crate::Outcome::Command {
            tag: "CREATE SCHEMA",
            rows: None,
        };
        let notices = self
            .engine
            .create_schema(&name, if_not_exists)
            .await?
            .into_iter()
            .collect();
        Ok(crate::session::with_notices(notices, done))
    }

    /// `DROP SCHEMA [IF EXISTS] names [CASCADE | RESTRICT]`.
    pub(crate) async fn drop_schema_statement(
        &mut self,
        names: &[eddy_sql::ast::ObjectName],
        if_exists: bool,
        cascade: bool,
    ) -> Result<crate::Outcome> {
        let names = names.iter().map(schema_name).collect::<Result<Vec<_>>>()?;
        let notices = self.engine.drop_schemas(&names, if_exists, cascade).await?;
        Ok(crate::session::with_notices(
            notices,
            crate::Outcome::Command {
                tag: "DROP SCHEMA",
                rows: None,
            },
        ))
    }
}
