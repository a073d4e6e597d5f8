//! How a session's statements name objects: `search_path`, and resolving the names DDL and
//! commands give (the planner resolves the names inside queries itself, through
//! [`eddy_sql::CatalogSource::search_path`]).
//!
//! Entry points: [`SearchPath`] (one per session) and the [`Session`] methods `existing_name`
//! and `new_name`. As PostgreSQL: an unqualified name is looked up in `pg_catalog`, then
//! `eddy_catalog` (both implicit unless the path places them), then the path's schemas that
//! exist; a new object goes to the first existing schema of the path.

use eddy_common::{Error, Result, SqlState};
use eddy_sql::ast::ObjectName;
use eddy_sql::{EDDY_CATALOG_SCHEMA, QualifiedName, name_parts};

use crate::{Engine, Session};

/// `pg_catalog`: served by the planner, never a place for Eddy's objects.
pub(crate) const PG_CATALOG: &str = "pg_catalog";

/// A session's `search_path`, parsed.
#[derive(Debug, Clone)]
pub(crate) struct SearchPath {
    /// The schemas as listed (normalized; `$user` kept as written).
    listed: Vec<String>,
    user: String,
}

impl SearchPath {
    pub(crate) fn new(text: &str, user: &str) -> Self {
        SearchPath {
            listed: parse(text),
            user: user.to_owned(),
        }
    }

    /// The listed schemas that exist, `$user` expanded, in order.
    fn existing(&self, engine: &Engine) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for schema in &self.listed {
            let schema = if schema == "$user" {
                self.user.clone()
            } else {
                schema.clone()
            };
            if (engine.schema_exists(&schema) || schema == PG_CATALOG) && !out.contains(&schema) {
                out.push(schema);
            }
        }
        out
    }

    /// Where an unqualified name is looked up, in order (implicit system schemas first).
    pub(crate) fn lookup(&self, engine: &Engine) -> Vec<String> {
        let listed = self.existing(engine);
        let mut out = Vec::new();
        for implicit in [PG_CATALOG, EDDY_CATALOG_SCHEMA] {
            if !listed.iter().any(|s| s == implicit) {
                out.push(implicit.to_owned());
            }
        }
        out.extend(listed);
        out
    }

    /// The schema a new object named without one goes to.
    pub(crate) fn creation_schema(&self, engine: &Engine) -> Result<String> {
        self.existing(engine).into_iter().next().ok_or_else(|| {
            Error::new(
                SqlState::INVALID_SCHEMA_NAME,
                "no schema has been selected to create in",
            )
        })
    }
}

/// The schemas of a `search_path` value: comma-separated identifiers, double quotes keeping
/// case (`"$user", public`).
fn parse(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let name = match part.strip_prefix('"').and_then(|p| p.strip_suffix('"')) {
            Some(quoted) => quoted.replace("\"\"", "\""),
            None => part.to_lowercase(),
        };
        out.push(name);
    }
    out
}

impl Session {
    /// The object an existing name refers to: the schema given, or the first schema on the
    /// path holding an object of that name (when none does: the name in the path's first
    /// schema, for the caller's "does not exist"). A schema given that does not exist is 3F000.
    pub(crate) fn existing_name(&self, name: &ObjectName) -> Result<QualifiedName> {
        let (schema, relation) = name_parts(name)?;
        if let Some(schema) = schema {
            if !self.engine.schema_exists(&schema) {
                return Err(schema_missing(&schema));
            }
            return Ok(QualifiedName::new(schema, relation));
        }
        let path = self.view.path().lookup(&self.engine);
        for schema in &path {
            let candidate = QualifiedName::new(schema.clone(), relation.clone());
            if self.engine.name_taken(&candidate) {
                return Ok(candidate);
            }
        }
        let fallback = path
            .into_iter()
            .find(|s| s == eddy_sql::PUBLIC_SCHEMA)
            .or_else(|| self.view.path().existing(&self.engine).into_iter().next());
        Ok(QualifiedName::new(
            fallback.unwrap_or_else(|| eddy_sql::PUBLIC_SCHEMA.to_owned()),
            relation,
        ))
    }

    /// Existing names for a DROP: with `IF EXISTS`, a name whose schema does not exist is
    /// skipped with PostgreSQL's NOTICE.
    pub(crate) fn existing_names(
        &self,
        names: &[ObjectName],
        if_exists: bool,
        notices: &mut Vec<crate::session::Notice>,
    ) -> Result<Vec<QualifiedName>> {
        let mut out = Vec::new();
        for name in names {
            match self.existing_name(name) {
                Ok(name) => out.push(name),
                Err(e) if if_exists && e.state == SqlState::INVALID_SCHEMA_NAME => {
                    notices.push(format!("{}, skipping", e.message).into())
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The name a new object gets: the schema given, or the path's creation schema.
    pub(crate) fn new_name(&self, name: &ObjectName) -> Result<QualifiedName> {
        let (schema, relation) = name_parts(name)?;
        let schema = match schema {
            Some(schema) if !self.engine.schema_exists(&schema) && schema != PG_CATALOG => {
                return Err(schema_missing(&schema));
            }
            Some(schema) => schema,
            None => self.view.path().creation_schema(&self.engine)?,
        };
        Ok(QualifiedName::new(schema, relation))
    }
}

impl Session {
    /// A `CREATE MATERIALIZED VIEW` as the catalog keeps it: named by its schema when that is
    /// not `public`, its query's names qualified where a restart's `public` path needs it.
    pub(crate) fn stored_form(
        &self,
        create: &eddy_sql::ast::CreateView,
        name: &QualifiedName,
    ) -> Result<eddy_sql::ast::CreateView> {
        let mut stored = create.clone();
        self.planner.qualify_for_storage(&mut stored.query)?;
        if name.schema != eddy_sql::PUBLIC_SCHEMA {
            let ident = |part: &str| {
                if crate::quote_ident(part) == part {
                    eddy_sql::ast::Ident::new(part)
                } else {
                    eddy_sql::ast::Ident::with_quote('"', part)
                }
            };
            stored.name = ObjectName::from(vec![ident(&name.schema), ident(&name.name)]);
        }
        Ok(stored)
    }
}

fn schema_missing(schema: &str) -> Error {
    Error::new(
        SqlState::INVALID_SCHEMA_NAME,
        format!("schema \"{schema}\" does not exist"),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn search_paths_parse_as_postgres_reads_them() {
        assert_eq!(super::parse("\"$user\", public"), vec!["$user", "public"]);
        assert_eq!(
            super::parse("Analytics,\"Mixed\" , x"),
            vec!["analytics", "Mixed", "x"]
        );
        assert!(super::parse("").is_empty());
    }
}
