//! Result columns that share a name, as PostgreSQL allows them: `SELECT n.oid, n.* FROM
//! pg_namespace n` (DBeaver's first query), `SELECT 1 AS a, 2 AS a`.
//!
//! DataFusion refuses a projection whose expressions have the same name. When it does, the
//! query is planned again with its wildcards expanded into the columns they stand for and each
//! repeated column given an internal alias; [`rename`] returns the names the client sees, which
//! [`crate::QueryPlan::schema`] puts back.

use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionState;
use datafusion::sql::sqlparser::ast::{self, Expr, SelectItem, SetExpr};
use eddy_common::Result;

use crate::error::from_datafusion;
use crate::names::normalize_ident;

/// DataFusion's refusal of a projection with two columns of one name.
pub fn is_repeated_name_error(error: &DataFusionError) -> bool {
    error
        .to_string()
        .contains("Projections require unique expression names")
}

/// Rewrites `query` (already resolved) so no two result columns share a name, and returns the
/// names PostgreSQL gives its result columns. `written` is the query as the client wrote it:
/// the names come from it (Eddy's rewrites replace casts and operators by functions).
pub async fn rename(
    written: &ast::Query,
    query: &mut ast::Query,
    state: &SessionState,
) -> Result<Vec<Option<String>>> {
    let with = query.with.clone();
    let written_items = leftmost(written).map(|s| s.projection.as_slice());
    let mut names = Vec::new();
    let mut selects = Vec::new();
    collect_selects(query.body.as_mut(), &mut selects);
    for (index, select) in selects.into_iter().enumerate() {
        let written_items = if index == 0 {
            written_items.filter(|w| w.len() == select.projection.len())
        } else {
            None
        };
        let mut items = Vec::with_capacity(select.projection.len());
        let mut shown = Vec::with_capacity(select.projection.len());
        for (i, item) in select.projection.iter().enumerate() {
            if matches!(
                item,
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
            ) {
                for column in expand(with.as_ref(), select, item, state).await? {
                    shown.push(column_name(&column));
                    items.push(SelectItem::UnnamedExpr(column));
                }
            } else {
                let named = written_items.map_or(item, |w| &w[i]);
                shown.push(item_name(named));
                items.push(item.clone());
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (i, item) in items.iter_mut().enumerate() {
            if seen.insert(shown[i].clone()) {
                continue;
            }
            let expr = match item {
                SelectItem::UnnamedExpr(expr) | SelectItem::ExprWithAlias { expr, .. } => {
                    expr.clone()
                }
                _ => continue,
            };
            *item = SelectItem::ExprWithAlias {
                expr,
                alias: ast::Ident::with_quote('"', format!("{}\u{1}{i}", shown[i])),
            };
        }
        select.projection = items;
        if index == 0 {
            names = shown.into_iter().map(Some).collect();
        }
    }
    Ok(names)
}

/// The selects whose columns are the query's: the body's, each branch of a set operation's.
fn collect_selects<'a>(body: &'a mut SetExpr, out: &mut Vec<&'a mut ast::Select>) {
    match body {
        SetExpr::Select(select) => out.push(select),
        SetExpr::SetOperation { left, right, .. } => {
            collect_selects(left, out);
            collect_selects(right, out);
        }
        SetExpr::Query(query) => collect_selects(query.body.as_mut(), out),
        _ => {}
    }
}

fn leftmost(query: &ast::Query) -> Option<&ast::Select> {
    let mut body = query.body.as_ref();
    loop {
        match body {
            SetExpr::Select(select) => return Some(select),
            SetExpr::SetOperation { left, .. } => body = left,
            SetExpr::Query(query) => body = query.body.as_ref(),
            _ => return None,
        }
    }
}

/// The columns a wildcard of `select` stands for, as qualified column references: planned
/// alone over the same FROM, so DataFusion's own expansion (USING columns once, EXCLUDE, ...)
/// decides.
async fn expand(
    with: Option<&ast::With>,
    select: &ast::Select,
    item: &SelectItem,
    state: &SessionState,
) -> Result<Vec<Expr>> {
    let mut probe = select.clone();
    probe.projection = vec![item.clone()];
    probe.distinct = None;
    probe.selection = None;
    probe.group_by = ast::GroupByExpr::Expressions(vec![], vec![]);
    probe.having = None;
    probe.qualify = None;
    probe.named_window = vec![];
    let query = ast::Query {
        with: with.cloned(),
        body: Box::new(SetExpr::Select(Box::new(probe))),
        order_by: None,
        limit_clause: None,
        fetch: None,
        locks: vec![],
        for_clause: None,
        settings: None,
        format_clause: None,
        pipe_operators: vec![],
    };
    let statement = datafusion::sql::parser::Statement::Statement(Box::new(ast::Statement::Query(
        Box::new(query),
    )));
    let plan = state
        .statement_to_plan(statement)
        .await
        .map_err(from_datafusion)?;
    Ok(plan
        .schema()
        .iter()
        .map(|(qualifier, field)| {
            let quoted = |s: &str| ast::Ident::with_quote('"', s);
            let mut parts: Vec<ast::Ident> = qualifier
                .map(|q| {
                    let mut parts = Vec::new();
                    if let Some(catalog) = q.catalog() {
                        parts.push(quoted(catalog));
                    }
                    if let Some(schema) = q.schema() {
                        parts.push(quoted(schema));
                    }
                    parts.push(quoted(q.table()));
                    parts
                })
                .unwrap_or_default();
            parts.push(quoted(field.name()));
            Expr::CompoundIdentifier(parts)
        })
        .collect())
}

/// The name PostgreSQL gives a select-list item.
fn item_name(item: &SelectItem) -> String {
    match item {
        SelectItem::ExprWithAlias { alias, .. } => normalize_ident(alias),
        SelectItem::UnnamedExpr(expr) => column_name(expr),
        _ => "?column?".to_owned(),
    }
}

fn column_name(expr: &Expr) -> String {
    crate::pg::names::expr_name(expr).unwrap_or_else(|| "?column?".to_owned())
}
