//! Relation names: qualifying them through the session's search path, and expanding plain
//! views where a statement names them.
//!
//! Entry points: [`QualifiedName`], [`name_parts`], and [`resolve`], the pass the planner runs
//! over a statement before DataFusion sees it. Invariants: after [`Mode::Plan`], every relation
//! a statement reads is `schema.name` (DataFusion never applies a default schema) and no plain
//! view is left (each became a derived table of its query, resolved as it was when the view was
//! created: with `public` on the path); [`Mode::Store`] only qualifies the names that a restart's
//! planner (whose path is `public`) would not find the same way.

use std::fmt;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{self, VisitMut, VisitorMut};
use eddy_common::{Error, ObjectId, Result, SqlState};

use crate::catalog::{CatalogBridge, EDDY_CATALOG_SCHEMA, PUBLIC_SCHEMA};

/// Deepest nesting of plain views in one statement.
const VIEW_NESTING_MAX: usize = 32;

/// Schemas a stored definition's names resolve in (implicit system schemas, then `public`).
pub(crate) const STORED_PATH: [&str; 3] = ["pg_catalog", EDDY_CATALOG_SCHEMA, PUBLIC_SCHEMA];

/// A relation's schema and name, both normalized.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QualifiedName {
    pub schema: String,
    pub name: String,
}

impl QualifiedName {
    pub fn new(schema: impl Into<String>, name: impl Into<String>) -> Self {
        QualifiedName {
            schema: schema.into(),
            name: name.into(),
        }
    }

    pub fn public(name: impl Into<String>) -> Self {
        QualifiedName::new(PUBLIC_SCHEMA, name)
    }

    /// How PostgreSQL names the object in messages: bare in `public`, `schema.name` elsewhere
    /// (PostgreSQL qualifies a name that is not visible on the search path).
    pub fn display(&self) -> String {
        if self.schema == PUBLIC_SCHEMA {
            self.name.clone()
        } else {
            format!("{}.{}", self.schema, self.name)
        }
    }

    /// [`QualifiedName::display`] with each part quoted where SQL needs it, as PostgreSQL
    /// describes objects (`table "Mixed".t`).
    pub fn described(&self) -> String {
        use crate::pg::strings::quote_ident;
        if self.schema == PUBLIC_SCHEMA {
            quote_ident(&self.name)
        } else {
            format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
        }
    }
}

/// `schema.name`, each part quoted when SQL needs it.
impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::pg::strings::quote_ident;
        write!(
            f,
            "{}.{}",
            quote_ident(&self.schema),
            quote_ident(&self.name)
        )
    }
}

/// Normalizes an identifier as PostgreSQL does: lowercase unless quoted.
pub fn normalize_ident(ident: &ast::Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

/// The schema (when given) and the name of `name`, normalized.
pub fn name_parts(name: &ast::ObjectName) -> Result<(Option<String>, String)> {
    let parts: Vec<String> = name
        .0
        .iter()
        .filter_map(|p| p.as_ident())
        .map(normalize_ident)
        .collect();
    match parts.as_slice() {
        [relation] => Ok((None, relation.clone())),
        [schema, relation] => Ok((Some(schema.clone()), relation.clone())),
        [_, _, _] => Err(Error::unsupported(format!(
            "cross-database references are not implemented: {name}"
        ))),
        _ => Err(Error::syntax(format!(
            "improper qualified name (too many dotted names): {name}"
        ))),
    }
}

/// What [`resolve`] does to the names it meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// For planning: qualify every name, expand plain views (their queries rewritten for a
    /// materialized view's dataflow when `for_view`).
    Plan { for_view: bool },
    /// For storing a definition: qualify the names a `public` search path would not find.
    Store,
}

/// What a statement names.
#[derive(Debug, Default)]
pub(crate) struct Resolution {
    /// The relations it names itself (not through a view), in order, without repeats.
    pub relations: Vec<ObjectId>,
    /// The plain views it names itself.
    pub views: Vec<ObjectId>,
    /// Tables read `FOR SYSTEM_TIME AS OF PROCTIME()` inside expanded views.
    pub temporal: Vec<String>,
}

struct Resolver<'a> {
    catalog: &'a CatalogBridge,
    path: Vec<String>,
    mode: Mode,
    /// The CTE names in scope, per enclosing query.
    ctes: Vec<Vec<String>>,
    depth: usize,
    out: Resolution,
}

/// Qualifies the target of an INSERT, UPDATE or DELETE through `path` and returns it.
pub(crate) fn qualify_dml_target(
    statement: &mut ast::Statement,
    catalog: &CatalogBridge,
    path: Vec<String>,
) -> Result<Option<QualifiedName>> {
    let mut resolver = Resolver {
        catalog,
        path,
        mode: Mode::Plan { for_view: false },
        ctes: Vec::new(),
        depth: 0,
        out: Resolution::default(),
    };
    resolver.dml_target(statement)
}

/// Resolves every relation name of `statement` through `path` (see [`Mode`]).
pub(crate) fn resolve(
    statement: &mut ast::Statement,
    catalog: &CatalogBridge,
    path: Vec<String>,
    mode: Mode,
) -> Result<Resolution> {
    resolve_at(statement, catalog, path, mode, 0)
}

fn resolve_at(
    statement: &mut ast::Statement,
    catalog: &CatalogBridge,
    path: Vec<String>,
    mode: Mode,
    depth: usize,
) -> Result<Resolution> {
    let mut resolver = Resolver {
        catalog,
        path,
        mode,
        ctes: Vec::new(),
        depth,
        out: Resolution::default(),
    };
    resolver.dml_target(statement)?;
    match statement.visit(&mut resolver) {
        ControlFlow::Break(e) => Err(e),
        ControlFlow::Continue(()) => Ok(resolver.out),
    }
}

impl Resolver<'_> {
    /// The schema `schema.name` is found in, with the relation.
    fn find(
        &self,
        schema: Option<&str>,
        name: &str,
    ) -> Result<(String, std::sync::Arc<dyn crate::TableSource>)> {
        if let Some(schema) = schema {
            // PostgreSQL answers a query naming a missing schema as for a missing relation.
            return self
                .relation(schema, name)
                .map(|t| (schema.to_owned(), t))
                .ok_or_else(|| undefined(&format!("{schema}.{name}")));
        }
        for schema in &self.path {
            if let Some(table) = self.relation(schema, name) {
                return Ok((schema.clone(), table));
            }
        }
        Err(undefined(name))
    }

    /// A relation of the engine's catalog, or of a schema the planner serves itself (which
    /// is described as a system table).
    fn relation(&self, schema: &str, name: &str) -> Option<std::sync::Arc<dyn crate::TableSource>> {
        let fixed = self
            .catalog
            .fixed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(schema)
            .cloned();
        match fixed {
            Some(fixed) => fixed.table_exist(name).then(|| {
                std::sync::Arc::new(SystemRelation) as std::sync::Arc<dyn crate::TableSource>
            }),
            None => self.catalog.source.table(schema, name),
        }
    }

    fn is_view(&self, schema: &str, name: &str) -> bool {
        self.catalog.source.view_definition(schema, name).is_some()
    }

    fn in_cte_scope(&self, name: &str) -> bool {
        self.ctes
            .iter()
            .any(|scope| scope.iter().any(|c| c == name))
    }

    /// Records that the statement names `schema.name` (`table`).
    fn note(&mut self, schema: &str, name: &str, table: &dyn crate::TableSource) {
        let id = table.object_id();
        if id.0 == 0 {
            return;
        }
        let list = if self.is_view(schema, name) {
            &mut self.out.views
        } else {
            &mut self.out.relations
        };
        if !list.contains(&id) {
            list.push(id);
        }
    }

    /// Qualifies the target of INSERT, UPDATE or DELETE (a table, never a view).
    fn dml_target(&mut self, statement: &mut ast::Statement) -> Result<Option<QualifiedName>> {
        let (name, verb) = match statement {
            ast::Statement::Insert(insert) => match &mut insert.table {
                ast::TableObject::TableName(name) => (name, "insert into"),
                _ => return Ok(None),
            },
            ast::Statement::Update(update) => match &mut update.table.relation {
                ast::TableFactor::Table { name, .. } => (name, "update"),
                _ => return Ok(None),
            },
            ast::Statement::Delete(delete) => match &mut delete.from {
                ast::FromTable::WithFromKeyword(tables)
                | ast::FromTable::WithoutKeyword(tables) => {
                    match tables.first_mut().map(|t| &mut t.relation) {
                        Some(ast::TableFactor::Table { name, .. }) => (name, "delete from"),
                        _ => return Ok(None),
                    }
                }
            },
            _ => return Ok(None),
        };
        let (schema, relation) = name_parts(name)?;
        let (schema, _) = self.find(schema.as_deref(), &relation)?;
        if self.is_view(&schema, &relation) {
            return Err(Error::unsupported(format!(
                "cannot {verb} view \"{relation}\": views are not updatable in Eddy"
            ))
            .with_hint(format!("{verb} the view's tables instead")));
        }
        *name = qualified_object_name(&schema, &relation);
        Ok(Some(QualifiedName::new(schema, relation)))
    }

    fn table_factor(&mut self, factor: &mut ast::TableFactor) -> Result<()> {
        let ast::TableFactor::Table {
            name, alias, args, ..
        } = factor
        else {
            return Ok(());
        };
        if let Some(args) = args {
            // TUMBLE(t, ...), HOP, SESSION and FOR SYSTEM_TIME AS OF name their relation in
            // their first argument: stored definitions qualify it too.
            if self.mode == Mode::Store && is_relation_function(name) {
                self.store_argument(args)?;
            }
            // DataFusion looks a table function up by the first part of its name:
            // `pg_catalog.pg_get_keywords()` is `pg_get_keywords()`.
            if let [schema, _] = name.0.as_slice()
                && schema
                    .as_ident()
                    .is_some_and(|i| normalize_ident(i) == crate::pg_catalog::SCHEMA)
            {
                name.0.remove(0);
            }
            return Ok(());
        }
        let (schema, relation) = name_parts(name)?;
        if schema.is_none() && self.in_cte_scope(&relation) {
            return Ok(());
        }
        let (found, table) = self.find(schema.as_deref(), &relation)?;
        self.note(&found, &relation, table.as_ref());
        match self.mode {
            Mode::Store => {
                if schema.is_none() && !STORED_PATH.contains(&found.as_str()) {
                    *name = qualified_object_name(&found, &relation);
                }
            }
            Mode::Plan { for_view } => match self.catalog.source.view_definition(&found, &relation)
            {
                Some(view) => *factor = self.expand(&relation, view, alias.take(), for_view)?,
                None => *name = qualified_object_name(&found, &relation),
            },
        }
        Ok(())
    }

    fn store_argument(&mut self, args: &mut ast::TableFunctionArgs) -> Result<()> {
        let Some(ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(expr))) =
            args.args.first_mut()
        else {
            return Ok(());
        };
        let idents = match expr {
            ast::Expr::Identifier(i) => vec![i.clone()],
            ast::Expr::CompoundIdentifier(parts) => parts.clone(),
            _ => return Ok(()),
        };
        let (schema, relation) = name_parts(&ast::ObjectName::from(idents))?;
        let (found, table) = self.find(schema.as_deref(), &relation)?;
        self.note(&found, &relation, table.as_ref());
        if schema.is_none() && !STORED_PATH.contains(&found.as_str()) {
            *expr = ast::Expr::CompoundIdentifier(vec![ident(&found), ident(&relation)]);
        }
        Ok(())
    }

    /// A plain view as a derived table: its query, resolved as stored, named as the view (or
    /// the alias given), with the view's column names.
    fn expand(
        &mut self,
        relation: &str,
        view: crate::catalog::ViewDefinition,
        alias: Option<ast::TableAlias>,
        for_view: bool,
    ) -> Result<ast::TableFactor> {
        if self.depth >= VIEW_NESTING_MAX {
            return Err(Error::new(
                SqlState::INVALID_RECURSION,
                format!("infinite recursion detected in rules for relation \"{relation}\""),
            ));
        }
        let mut statement = parse_query(&view.query)?;
        let path = STORED_PATH.iter().map(|s| (*s).to_owned()).collect();
        let inner = resolve_at(
            &mut statement,
            self.catalog,
            path,
            self.mode,
            self.depth + 1,
        )?;
        crate::pg::ast::rewrite(&mut statement)?;
        self.out
            .temporal
            .extend(crate::windows::rewrite(&mut statement, for_view)?);
        self.out.temporal.extend(inner.temporal);
        let ast::Statement::Query(subquery) = statement else {
            return Err(Error::internal("a view's query is not a query"));
        };
        let mut alias = alias.unwrap_or_else(|| ast::TableAlias {
            explicit: true,
            at: None,
            name: ast::Ident::new(relation),
            columns: Vec::new(),
        });
        // Columns the alias does not rename keep the view's names.
        for column in view.columns.iter().skip(alias.columns.len()) {
            alias.columns.push(ast::TableAliasColumnDef {
                name: ident(column),
                data_type: None,
            });
        }
        Ok(ast::TableFactor::Derived {
            lateral: false,
            subquery,
            alias: Some(alias),
            sample: None,
        })
    }
}

impl VisitorMut for Resolver<'_> {
    type Break = Error;

    fn pre_visit_query(&mut self, query: &mut ast::Query) -> ControlFlow<Error> {
        let names = query
            .with
            .as_ref()
            .map(|w| {
                w.cte_tables
                    .iter()
                    .map(|c| normalize_ident(&c.alias.name))
                    .collect()
            })
            .unwrap_or_default();
        self.ctes.push(names);
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, query: &mut ast::Query) -> ControlFlow<Error> {
        self.ctes.pop();
        if let ast::SetExpr::Select(select) = query.body.as_mut() {
            qualify_wildcards(select);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &mut ast::TableFactor) -> ControlFlow<Error> {
        match self.table_factor(factor) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => ControlFlow::Break(e),
        }
    }
}

/// `t.*` over a relation written `t` and now named `schema.t` reads `schema.t.*` (DataFusion
/// matches a wildcard's qualifier exactly, where it matches a column's by suffix).
fn qualify_wildcards(select: &mut ast::Select) {
    let mut unaliased: Vec<ast::ObjectName> = Vec::new();
    for from in &select.from {
        for factor in std::iter::once(&from.relation).chain(from.joins.iter().map(|j| &j.relation))
        {
            if let ast::TableFactor::Table {
                name,
                alias: None,
                args: None,
                ..
            } = factor
                && name.0.len() == 2
            {
                unaliased.push(name.clone());
            }
        }
    }
    if unaliased.is_empty() {
        return;
    }
    for item in &mut select.projection {
        let ast::SelectItem::QualifiedWildcard(
            ast::SelectItemQualifiedWildcardKind::ObjectName(name),
            _,
        ) = item
        else {
            continue;
        };
        let [part] = name.0.as_slice() else { continue };
        let Some(ident) = part.as_ident() else {
            continue;
        };
        let written = normalize_ident(ident);
        if let Some(full) = unaliased.iter().find(|n| {
            n.0.last()
                .and_then(|p| p.as_ident())
                .is_some_and(|i| normalize_ident(i) == written)
        }) {
            *name = full.clone();
        }
    }
}

/// A stored query's text as a statement.
fn parse_query(text: &str) -> Result<ast::Statement> {
    let parsed = crate::parse_statements(text)?;
    match parsed.into_iter().next().map(|p| p.statement) {
        Some(crate::Statement::Sql(statement))
            if matches!(statement.as_ref(), ast::Statement::Query(_)) =>
        {
            Ok(*statement)
        }
        _ => Err(Error::internal(format!(
            "a stored view's query does not parse as a query: {text}"
        ))),
    }
}

fn is_relation_function(name: &ast::ObjectName) -> bool {
    let name = name.to_string().to_lowercase();
    matches!(name.as_str(), "tumble" | "hop" | "session")
        || name.eq_ignore_ascii_case(crate::parser::TEMPORAL_MARK)
}

fn qualified_object_name(schema: &str, name: &str) -> ast::ObjectName {
    ast::ObjectName::from(vec![ident(schema), ident(name)])
}

/// An identifier that reads back as `name`: quoted only when it must be.
fn ident(name: &str) -> ast::Ident {
    if crate::pg::strings::quote_ident(name) == name {
        ast::Ident::new(name)
    } else {
        ast::Ident::with_quote('"', name)
    }
}

fn undefined(name: &str) -> Error {
    Error::new(
        SqlState::UNDEFINED_TABLE,
        format!("relation \"{name}\" does not exist"),
    )
}

/// A relation of a schema the planner serves itself (`information_schema`, `pg_catalog`):
/// found, never named in a dependency.
#[derive(Debug)]
struct SystemRelation;

#[async_trait::async_trait]
impl crate::TableSource for SystemRelation {
    fn object_id(&self) -> ObjectId {
        ObjectId(0)
    }

    fn schema(&self) -> arrow::datatypes::SchemaRef {
        std::sync::Arc::new(arrow::datatypes::Schema::empty())
    }

    async fn scan(&self) -> Result<std::sync::Arc<Vec<arrow::array::RecordBatch>>> {
        Err(Error::internal(
            "a system relation is read through its own schema provider",
        ))
    }
}
