//! Planning statements with DataFusion against a session's view of the catalog.
//!
//! Queries become [`QueryPlan`]s; `INSERT`, `UPDATE` and `DELETE` become [`Planned`] DML whose
//! parts are ordinary queries (the rows to insert, the rows to retract, their replacements),
//! so the engine turns every write into changes with weights and never mutates in place.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNode;
use datafusion::common::{ParamValues, ScalarValue};
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::{DmlStatement, Expr, LogicalPlan, LogicalPlanBuilder, WriteOp};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::sqlparser::ast;
use eddy_common::{Error, Result};
use futures::TryStreamExt;

use crate::catalog::{CatalogBridge, CatalogSource};
use crate::error::from_datafusion;
use crate::functions;
use crate::names::{Mode, QualifiedName};

pub const CATALOG_NAME: &str = "eddy";
pub const SCHEMA_NAME: &str = "public";

/// What a session's planner needs to know about the session.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub database: String,
    pub user: String,
    pub version: String,
    pub backend_pid: i32,
}

/// A planned statement.
#[derive(Debug)]
pub enum Planned {
    Query(QueryPlan),
    /// Insert the rows `source` produces (already cast to the table's columns, in order).
    Insert {
        table: QualifiedName,
        source: QueryPlan,
    },
    /// Retract the rows `old_rows` produces.
    Delete {
        table: QualifiedName,
        old_rows: QueryPlan,
    },
    /// `rows` has the table's columns (the row replaced) then the row's new version (the
    /// assignments applied, cast to the columns' types): one scan, so the rows replaced and
    /// their new versions are the same rows even when the filter is not deterministic
    /// (`WHERE random() < 0.5`).
    Update {
        table: QualifiedName,
        rows: QueryPlan,
    },
    /// `UPDATE ... FROM`: `rows` has the table's columns (the row replaced) then its new
    /// values (not yet cast to the columns' types), once per matching FROM row (PostgreSQL
    /// updates a row once, with one of its matches).
    UpdateJoined {
        table: QualifiedName,
        rows: QueryPlan,
    },
}

/// An optimizable, executable query.
#[derive(Debug, Clone)]
pub struct QueryPlan {
    plan: LogicalPlan,
    /// The result columns once types are coerced (a `CASE` of an integer and a numeric is
    /// a numeric only then): what execution will produce.
    analyzed: datafusion::common::DFSchemaRef,
    /// Column names PostgreSQL would give, read from the query as written
    /// ([`crate::pg::names`]), where DataFusion's differ.
    names: Option<Arc<Vec<Option<String>>>>,
}

impl QueryPlan {
    fn new(plan: LogicalPlan, state: &SessionState) -> Self {
        let analyzed = state
            .analyzer()
            .execute_and_check(plan.clone(), state.config_options(), |_, _| {})
            .map(|p| std::sync::Arc::clone(p.schema()))
            .unwrap_or_else(|_| std::sync::Arc::clone(plan.schema()));
        QueryPlan {
            plan,
            analyzed,
            names: None,
        }
    }

    /// The result columns (Arrow field metadata carries declared PostgreSQL types).
    pub fn schema(&self) -> SchemaRef {
        let schema = self.analyzed.as_arrow();
        // A name the query gave (`AS "ICU Locale"`) stays as written.
        let aliased = aliased_columns(&self.plan);
        let fields: Vec<Field> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                // The name the query as written gives (PostgreSQL's), else an alias DataFusion
                // kept (`AS "ICU Locale"`), else PostgreSQL's name for DataFusion's.
                let written = self
                    .names
                    .as_ref()
                    .filter(|n| n.len() == schema.fields().len())
                    .and_then(|n| n[i].clone());
                match written {
                    Some(name) => f.as_ref().clone().with_name(name),
                    // (`count(*)` is DataFusion's own alias of `count(1)`.)
                    None if aliased.get(i).copied().unwrap_or(false)
                        && !f.name().ends_with("(*)") =>
                    {
                        f.as_ref().clone()
                    }
                    None => f.as_ref().clone().with_name(pg_column_name(f.name())),
                }
            })
            .collect();
        Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
    }

    /// The type of each `$n` parameter, `None` where DataFusion could not infer it.
    pub fn parameter_types(&self) -> Result<Vec<Option<DataType>>> {
        let types = self.plan.get_parameter_types().map_err(from_datafusion)?;
        let mut out = Vec::new();
        for (name, ty) in types {
            let index: usize = name.trim_start_matches('$').parse().map_err(|_| {
                Error::unsupported(format!("named parameter {name}: use $1, $2, ..."))
            })?;
            if index == 0 {
                return Err(Error::syntax("parameters are numbered from $1"));
            }
            if out.len() < index {
                out.resize(index, None);
            }
            out[index - 1] = ty;
        }
        // `$1::int[]`: a parameter only cast has the cast's type, as in PostgreSQL.
        let mut casts: Vec<(usize, DataType)> = Vec::new();
        let _ = self.plan.apply_with_subqueries(|node| {
            node.apply_expressions(|e| {
                e.apply(|e| {
                    if let datafusion::logical_expr::Expr::Cast(cast) = e
                        && let datafusion::logical_expr::Expr::Placeholder(p) = cast.expr.as_ref()
                        && let Some(index) =
                            p.id.trim_start_matches('$')
                                .parse::<usize>()
                                .ok()
                                .filter(|i| *i > 0)
                    {
                        casts.push((index, cast.field.data_type().clone()));
                    }
                    Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
                })
            })
        });
        for (index, ty) in casts {
            if out.len() < index {
                out.resize(index, None);
            }
            out[index - 1].get_or_insert(ty);
        }
        Ok(out)
    }

    /// Substitutes parameter values (one-row arrays, in order $1, $2, ...).
    pub fn bind(self, values: &[ArrayRef]) -> Result<Self> {
        if values.is_empty() {
            return Ok(self);
        }
        let scalars = values
            .iter()
            .map(|a| ScalarValue::try_from_array(a, 0).map_err(from_datafusion))
            .collect::<Result<Vec<_>>>()?;
        let plan = self
            .plan
            .with_param_values(ParamValues::from(scalars))
            .map_err(from_datafusion)?;
        Ok(QueryPlan {
            plan,
            analyzed: self.analyzed,
            names: self.names,
        })
    }
}

/// A view's dataflow and its output schema (PostgreSQL-style column names).
pub struct ViewPlan {
    pub node: eddy_dataflow::Node,
    pub schema: SchemaRef,
    /// The view's first column that carries a stream's watermark (its name), and the sources
    /// (tables or views) whose watermark it is: readers of the view can close windows by it.
    pub watermark: Option<(String, Vec<eddy_common::ObjectId>)>,
    /// The plain views the query names (expanded into the dataflow): the view depends on them.
    pub views: Vec<eddy_common::ObjectId>,
    /// `WITH (max_state_rows = n)`: the view's cap on any one operator's state.
    pub max_state_rows: Option<u64>,
}

/// One session's DataFusion context: its catalog view, functions and settings.
pub struct SessionPlanner {
    ctx: SessionContext,
    catalog: Arc<CatalogBridge>,
}

impl SessionPlanner {
    pub fn new(catalog: Arc<dyn CatalogSource>, info: &SessionInfo) -> Result<Self> {
        let config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG_NAME, SCHEMA_NAME)
            .with_create_default_catalog_and_schema(false)
            .with_information_schema(false)
            .with_target_partitions(2)
            .set_str("datafusion.sql_parser.dialect", "PostgreSQL")
            .set_str("datafusion.execution.time_zone", "UTC");
        let ctx = SessionContext::new_with_state(crate::pg::session_state(config)?);
        functions::register(&ctx, info);
        crate::windows::register(&ctx);
        let system = crate::pg_catalog::register(&ctx, &catalog, info)?;
        let mut fixed: std::collections::BTreeMap<
            String,
            Arc<dyn datafusion::catalog::SchemaProvider>,
        > = std::collections::BTreeMap::new();
        fixed.insert(
            crate::pg_catalog::INFORMATION_SCHEMA.to_owned(),
            crate::pg_catalog::information_schema(&catalog, &system),
        );
        fixed.insert(crate::pg_catalog::SCHEMA.to_owned(), system);
        let eddy = Arc::new(CatalogBridge {
            source: catalog,
            fixed: std::sync::RwLock::new(fixed),
        });
        ctx.register_catalog(
            CATALOG_NAME,
            Arc::clone(&eddy) as Arc<dyn datafusion::catalog::CatalogProvider>,
        );
        Ok(SessionPlanner { ctx, catalog: eddy })
    }
    /// Qualifies, in place, the relation names of a definition about to be stored (a view's
    /// query) that a restart's planner, whose search path is `public`, would not find the
    /// same way. Returns the ids of the relations and plain views it names.
    pub fn qualify_for_storage(
        &self,
        query: &mut ast::Query,
    ) -> Result<Vec<eddy_common::ObjectId>> {
        let mut statement = ast::Statement::Query(Box::new(query.clone()));
        let resolution = crate::names::resolve(
            &mut statement,
            &self.catalog,
            self.catalog.source.search_path(),
            Mode::Store,
        )?;
        if let ast::Statement::Query(q) = statement {
            *query = *q;
        }
        Ok(resolution
            .relations
            .into_iter()
            .chain(resolution.views)
            .collect())
    }

    /// Qualifies every relation name and expands plain views (see [`crate::names`]).
    fn resolve(
        &self,
        statement: &mut ast::Statement,
        for_view: bool,
    ) -> Result<crate::names::Resolution> {
        crate::names::resolve(
            statement,
            &self.catalog,
            self.catalog.source.search_path(),
            Mode::Plan { for_view },
        )
    }

    /// An INSERT or UPDATE with the target table's column defaults filled in
    /// ([`crate::dml::fill_defaults`]); `None` for other statements.
    fn with_defaults(&self, statement: &ast::Statement) -> Result<Option<ast::Statement>> {
        if !matches!(
            statement,
            ast::Statement::Insert(_) | ast::Statement::Update(_)
        ) {
            return Ok(None);
        }
        let mut target = statement.clone();
        let Some(table) = crate::names::qualify_dml_target(
            &mut target,
            &self.catalog,
            self.catalog.source.search_path(),
        )?
        .and_then(|name| self.catalog.source.table(&name.schema, &name.name)) else {
            return Ok(None);
        };
        let mut filled = statement.clone();
        match &mut filled {
            ast::Statement::Insert(insert) => crate::dml::fill_defaults(insert, &table.schema())?,
            ast::Statement::Update(update) => {
                crate::dml::assign_defaults(&mut update.assignments, &table.schema())?
            }
            _ => {}
        }
        Ok(Some(filled))
    }

    fn state(&self) -> SessionState {
        self.ctx.state()
    }

    /// Plans a query or DML statement parsed by [`crate::parse_statements`].
    pub async fn plan(&self, statement: &ast::Statement) -> Result<Planned> {
        let returning = match statement {
            ast::Statement::Insert(i) => i.returning.is_some() || i.on.is_some(),
            ast::Statement::Update(u) => u.returning.is_some(),
            ast::Statement::Delete(d) => d.returning.is_some(),
            _ => false,
        };
        if returning {
            return Err(Error::internal(
                "RETURNING and ON CONFLICT are the engine's to take apart before planning",
            ));
        }
        // Defaults first, so Eddy's rewrites read them as they read the statement.
        let defaulted;
        let statement = match self.with_defaults(statement)? {
            Some(filled) => {
                defaulted = filled;
                &defaulted
            }
            None => statement,
        };
        if let ast::Statement::Update(update) = statement
            && update.from.is_some()
        {
            let mut qualified = statement.clone();
            let table = crate::names::qualify_dml_target(
                &mut qualified,
                &self.catalog,
                self.catalog.source.search_path(),
            )?
            .ok_or_else(|| Error::unsupported("UPDATE of something other than a table"))?;
            let ast::Statement::Update(update) = &qualified else {
                return Err(Error::internal("UPDATE ... FROM"));
            };
            let (_, select) = crate::dml::update_from_as_select(update)?;
            let Planned::Query(rows) = Box::pin(self.plan(&select)).await? else {
                return Err(Error::internal("UPDATE ... FROM as a query"));
            };
            return Ok(Planned::UpdateJoined { table, rows });
        }
        let mut rewritten = statement.clone();
        if let ast::Statement::Delete(delete) = &mut rewritten {
            crate::dml::delete_using_as_exists(delete)?;
        }
        crate::pg_catalog::rewrite::rewrite(&mut rewritten);
        crate::pg::ast::rewrite(&mut rewritten)?;
        crate::windows::rewrite(&mut rewritten, false)?;
        self.resolve(&mut rewritten, false)?;
        if let ast::Statement::Insert(insert) = &mut rewritten
            && let Some(source) = insert.source.as_mut()
        {
            alias_repeated_columns(source);
        }
        // A query whose columns share a name is planned again with them renamed (PostgreSQL
        // allows it; DataFusion does not): kept for that, as only then is it needed.
        let query = match &rewritten {
            ast::Statement::Query(q) => Some(q.clone()),
            _ => None,
        };
        let df_statement = datafusion::sql::parser::Statement::Statement(Box::new(rewritten));
        let state = self.state();
        let mut renamed = None;
        let plan = match (
            state.statement_to_plan(df_statement).await,
            query,
            statement,
        ) {
            (Err(e), Some(mut query), ast::Statement::Query(written))
                if crate::pg::repeated_names::is_repeated_name_error(&e) =>
            {
                renamed =
                    Some(crate::pg::repeated_names::rename(written, &mut query, &state).await?);
                let again = datafusion::sql::parser::Statement::Statement(Box::new(
                    ast::Statement::Query(query),
                ));
                state
                    .statement_to_plan(again)
                    .await
                    .map_err(from_datafusion)?
            }
            (planned, ..) => planned.map_err(from_datafusion)?,
        };
        match plan {
            LogicalPlan::Dml(dml) => dml_plan(dml, &state),
            LogicalPlan::Ddl(_) | LogicalPlan::Statement(_) | LogicalPlan::Copy(_) => {
                Err(Error::unsupported(format!(
                    "statement not supported: {}",
                    first_words(statement)
                )))
            }
            plan => {
                let mut query = QueryPlan::new(plan, &state);
                query.names = match (renamed, statement) {
                    (Some(names), _) => Some(Arc::new(names)),
                    (None, ast::Statement::Query(written)) => {
                        crate::pg::names::output_names(written).map(Arc::new)
                    }
                    _ => None,
                };
                Ok(Planned::Query(query))
            }
        }
    }

    /// Runs a query to completion.
    pub async fn execute(&self, query: QueryPlan) -> Result<Vec<RecordBatch>> {
        let stream = self.execute_stream(query).await?;
        stream.try_collect().await
    }

    /// Runs a query, yielding batches as they are produced.
    pub async fn execute_stream(
        &self,
        query: QueryPlan,
    ) -> Result<futures::stream::BoxStream<'static, Result<RecordBatch>>> {
        let state = self.state();
        let physical = state
            .create_physical_plan(&query.plan)
            .await
            .map_err(from_datafusion)?;
        let stream = datafusion::physical_plan::execute_stream(physical, state.task_ctx())
            .map_err(from_datafusion)?;
        Ok(Box::pin(stream.map_err(from_datafusion)))
    }

    /// Plans the query of a materialized view into a dataflow.
    pub async fn plan_view(
        &self,
        query: &ast::Query,
        options: &crate::ViewOptions,
    ) -> Result<ViewPlan> {
        let mut statement = ast::Statement::Query(Box::new(query.clone()));
        crate::pg::ast::rewrite(&mut statement)?;
        let mut temporal = crate::windows::rewrite(&mut statement, true)?;
        let resolution = self.resolve(&mut statement, true)?;
        temporal.extend(resolution.temporal);
        crate::windows::rewrite_now(&mut statement);
        let df_statement = datafusion::sql::parser::Statement::Statement(Box::new(statement));
        let state = self.state();
        let plan = state
            .statement_to_plan(df_statement)
            .await
            .map_err(from_datafusion)?;
        if !plan
            .get_parameter_types()
            .map_err(from_datafusion)?
            .is_empty()
        {
            return Err(Error::unsupported("parameters ($1) in a materialized view"));
        }
        let optimized = state.optimize(&plan).map_err(from_datafusion)?;
        let lowering = crate::lower::Lowering {
            state: &state,
            options,
            temporal: &temporal,
            windowed: std::cell::Cell::new(false),
            sessions: std::cell::Cell::new(false),
        };
        let mut node = lowering.lower(&optimized)?;
        // The unoptimized plan too: the optimizer drops a SESSION whose bounds nothing reads,
        // which would silently turn sessions per key into one group per key.
        if !lowering.sessions.get()
            && (lowering.trace_sessions_anywhere(&optimized)
                || lowering.trace_sessions_anywhere(&plan))
        {
            return Err(Error::unsupported(
                "SESSION windows need GROUP BY window_start or window_end (sessions are per group key)",
            ));
        }
        if options.emit_on_close && !lowering.windowed.get() {
            // Rows of a watermarked stream, released in event-time order as the watermark passes.
            let Some((_, time, sources)) = crate::lower::release_time(&optimized) else {
                return Err(Error::unsupported(
                    "EMIT ON WINDOW CLOSE needs a GROUP BY over window_start or window_end of TUMBLE or HOP, or a watermark column among the view's columns, of a table with a WATERMARK",
                ));
            };
            node = eddy_dataflow::plan::Node::Release {
                input: Box::new(node),
                time,
                sources,
                lateness: options.lateness,
            };
        }
        // The view's columns as execution types them (after coercion).
        let analyzed = state
            .analyzer()
            .execute_and_check(plan.clone(), state.config_options(), |_, _| {})
            .map_err(from_datafusion)?;
        let schema = crate::lower::view_schema(&analyzed);
        if schema.fields().len() != node.schema().fields().len() {
            return Err(Error::internal("view schema and dataflow schema disagree"));
        }
        let watermark = crate::lower::release_time(&optimized)
            .map(|(column, _, sources)| (schema.field(column).name().clone(), sources));
        Ok(ViewPlan {
            node,
            schema,
            watermark,
            views: resolution.views,
            max_state_rows: options.max_state_rows,
        })
    }

    /// Sets the session time zone used by `now()` and casts to `timestamptz`.
    pub fn set_time_zone(&self, time_zone: &str) -> Result<()> {
        let state_ref = self.ctx.state_ref();
        let mut state = state_ref.write();
        state
            .config_mut()
            .options_mut()
            .set("datafusion.execution.time_zone", time_zone)
            .map_err(from_datafusion)
    }
}

/// Which result columns the query named with `AS`.
fn aliased_columns(plan: &LogicalPlan) -> Vec<bool> {
    match plan {
        LogicalPlan::Projection(p) => p
            .expr
            .iter()
            .map(|e| matches!(e, datafusion::logical_expr::Expr::Alias(_)))
            .collect(),
        LogicalPlan::Sort(s) => aliased_columns(&s.input),
        LogicalPlan::Limit(l) => aliased_columns(&l.input),
        LogicalPlan::Distinct(datafusion::logical_expr::Distinct::All(input)) => {
            aliased_columns(input)
        }
        LogicalPlan::Union(u) => u
            .inputs
            .first()
            .map(|i| aliased_columns(i))
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// `INSERT ... SELECT x, x` is valid SQL, but DataFusion wants unique projection names: the
/// rows to insert are positional, so repeated names get aliases.
fn alias_repeated_columns(query: &mut ast::Query) {
    let ast::SetExpr::Select(select) = query.body.as_mut() else {
        return;
    };
    let mut seen = std::collections::HashSet::new();
    for (i, item) in select.projection.iter_mut().enumerate() {
        let ast::SelectItem::UnnamedExpr(expr) = item else {
            continue;
        };
        let name = match &*expr {
            ast::Expr::Identifier(id) => id.value.clone(),
            ast::Expr::CompoundIdentifier(parts) => {
                parts.last().map(|p| p.value.clone()).unwrap_or_default()
            }
            other => other.to_string(),
        };
        if !seen.insert(name) {
            *item = ast::SelectItem::ExprWithAlias {
                expr: expr.clone(),
                alias: ast::Ident::new(format!("eddy_column_{i}")),
            };
        }
    }
}

fn dml_plan(dml: DmlStatement, state: &SessionState) -> Result<Planned> {
    let table = QualifiedName::new(
        dml.table_name.schema().unwrap_or(SCHEMA_NAME),
        dml.table_name.table(),
    );
    let input = Arc::unwrap_or_clone(dml.input);
    match dml.op {
        WriteOp::Insert(_) => Ok(Planned::Insert {
            table,
            source: QueryPlan::new(input, state),
        }),
        WriteOp::Delete => Ok(Planned::Delete {
            table,
            old_rows: QueryPlan::new(input, state),
        }),
        WriteOp::Update => {
            // DataFusion plans UPDATE as Projection(assignments) over Filter(scan): the
            // projection's input is exactly the rows being replaced. One projection of both
            // (the input's columns, then the assignments) reads them once.
            let LogicalPlan::Projection(projection) = input else {
                return Err(Error::internal("UPDATE plan is not a projection"));
            };
            let old = projection
                .input
                .schema()
                .columns()
                .into_iter()
                .map(Expr::Column);
            let new = projection
                .expr
                .into_iter()
                .enumerate()
                .map(|(i, e)| e.unalias().alias(format!("eddy_new_{i}")));
            let rows = LogicalPlanBuilder::from(Arc::unwrap_or_clone(projection.input))
                .project(old.chain(new))
                .and_then(LogicalPlanBuilder::build)
                .map_err(from_datafusion)?;
            Ok(Planned::Update {
                table,
                rows: QueryPlan::new(rows, state),
            })
        }
        other => Err(Error::unsupported(format!("{other} is not supported"))),
    }
}

fn first_words(statement: &ast::Statement) -> String {
    statement
        .to_string()
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The column name PostgreSQL would show for an output column DataFusion named after its
/// expression: `count(*)` is `count`, `t.a` is `a`, other expressions are `?column?`.
pub fn pg_column_name(name: &str) -> String {
    let is_ident = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if let Some((head, _)) = name.split_once('(') {
        if is_ident(head) {
            // DataFusion's functions are lowercase; `Int64(1)`, `Utf8("x")` are literals.
            return if head.starts_with(|c: char| c.is_ascii_uppercase()) {
                "?column?".into()
            } else {
                head.to_owned()
            };
        }
        return "?column?".into();
    }
    if name.contains(' ') {
        return "?column?".into();
    }
    match name.rsplit_once('.') {
        Some((qualifier, column)) if !qualifier.is_empty() && !column.is_empty() => {
            column.to_owned()
        }
        _ => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::pg_column_name;

    #[test]
    fn column_names_follow_postgres() {
        assert_eq!(pg_column_name("count(*)"), "count");
        assert_eq!(pg_column_name("sum(users.score)"), "sum");
        assert_eq!(pg_column_name("users.score"), "score");
        assert_eq!(pg_column_name("Int64(1)"), "?column?");
        assert_eq!(pg_column_name("t.a + Int64(1)"), "?column?");
        assert_eq!(pg_column_name("total"), "total");
    }
}
