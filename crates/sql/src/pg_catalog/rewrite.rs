//! Rewrites of what clients' catalog queries say that DataFusion would refuse or read
//! differently, before planning:
//!
//! - functions and table functions named with `pg_catalog.` lose the prefix (`pg_catalog.version()`);
//! - `OPERATOR(pg_catalog.~)` is `~`; `COLLATE pg_catalog.default` goes (Eddy has one collation);
//! - casts to `regclass`, `regtype`, `regnamespace`, `regproc` and `oid` call Eddy's functions:
//!   they yield OIDs, so comparisons with OID columns work, and read as names where PostgreSQL
//!   shows names (`x::regclass::text`, or a result column that is such a cast);
//! - casts to `pg_catalog.text`, `name`, `"char"`, ... are casts to the types Eddy has;
//! - in a statement that reads the catalogs, a scalar subquery that does not aggregate takes
//!   the `max` of its one column (what DataFusion needs to decorrelate it; catalog subqueries
//!   return at most one row), and `ARRAY(SELECT ...)` is an `array_agg` subquery;
//! - a few psql queries over catalogs that are always empty in Eddy (row security policies,
//!   extended statistics, publications) are replaced by an empty result of the same shape;
//! - pgjdbc's `getPrimaryKeys` expands `pg_index.indkey` with the set-returning
//!   `information_schema._pg_expandarray`; it is rewritten to the same answer with
//!   `array_position(i.indkey, a.attnum)` as the key's position (see [`EXPANDARRAY`]).

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    self, BinaryOperator, CastKind, DataType, Expr, FunctionArg, FunctionArgExpr,
    FunctionArgumentList, FunctionArguments, Ident, ObjectName, ObjectNamePart, Query, SelectItem,
    SetExpr, TableFactor, VisitMut, VisitorMut,
};

use super::functions::{
    REGCLASS, REGCLASS_TEXT, REGNAMESPACE, REGNAMESPACE_TEXT, REGPROC, REGPROC_TEXT, REGTYPE,
    REGTYPE_TEXT, TO_OID,
};

/// psql queries over catalogs Eddy never fills, by a phrase only they contain, and the empty
/// result of the same columns that stands for them.
const EMPTY_QUERIES: [(&str, &str); 3] = [
    (
        "FROM pg_catalog.pg_policy pol",
        "SELECT pol.polname, pol.polpermissive, NULL::text AS roles, NULL::text AS qual, NULL::text AS withcheck, NULL::text AS cmd FROM pg_catalog.pg_policy pol WHERE false",
    ),
    (
        "FROM pg_catalog.pg_statistic_ext",
        "SELECT oid, stxrelid, NULL::text AS nsp, stxname, NULL::text AS columns, false AS ndist_enabled, false AS deps_enabled, false AS mcv_enabled, stxstattarget FROM pg_catalog.pg_statistic_ext WHERE false",
    ),
    (
        "pg_relation_is_publishable",
        "SELECT pubname, NULL::text AS qual, NULL::text AS attrs FROM pg_catalog.pg_publication WHERE false",
    ),
];

/// pgjdbc's primary-key query (`PgDatabaseMetaData.getPrimaryKeys`) joins each attribute of
/// the table with the expanded key (`(x, n)` rows of `_pg_expandarray(i.indkey)`) and keeps
/// the attribute numbers that are key members: the same rows as keeping the attributes whose
/// `array_position` in `indkey` is not NULL, with that position as `KEY_SEQ`.
const EXPANDARRAY: [(&str, &str); 3] = [
    (
        "(information_schema._pg_expandarray(i.indkey)).n",
        "array_position(i.indkey, a.attnum)",
    ),
    (
        "information_schema._pg_expandarray(i.indkey) AS KEYS",
        "a.attnum AS KEYS",
    ),
    (
        "result.A_ATTNUM = (result.KEYS).x",
        "result.KEY_SEQ IS NOT NULL",
    ),
];

/// Applies the rewrites to one statement.
pub fn rewrite(statement: &mut ast::Statement) {
    let mut text = statement.to_string();
    if text.contains(EXPANDARRAY[0].0) {
        for (from, to) in EXPANDARRAY {
            text = text.replace(from, to);
        }
        if let Ok(mut parsed) = datafusion::sql::sqlparser::parser::Parser::parse_sql(
            &datafusion::sql::sqlparser::dialect::PostgreSqlDialect {},
            &text,
        ) && let Some(replaced) = parsed.pop()
        {
            *statement = replaced;
        }
    }
    if let Some((_, replacement)) = EMPTY_QUERIES
        .iter()
        .find(|(phrase, _)| text.contains(phrase))
        && let Ok(mut parsed) = datafusion::sql::sqlparser::parser::Parser::parse_sql(
            &datafusion::sql::sqlparser::dialect::PostgreSqlDialect {},
            replacement,
        )
        && let Some(replaced) = parsed.pop()
    {
        *statement = replaced;
    }
    let catalogs = reads_catalogs(&text);
    let _ = statement.visit(&mut Rewriter { catalogs });
}

/// Whether a statement names a catalog relation (a `pg_*` table or an `information_schema` view).
fn reads_catalogs(text: &str) -> bool {
    let lower = text.to_lowercase();
    lower.contains("pg_catalog.")
        || lower.contains("information_schema.")
        || lower
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .any(|w| w.starts_with("pg_") && super::spec::spec("pg_catalog", w).is_some())
}

struct Rewriter {
    catalogs: bool,
}

fn ident_name(part: &ObjectNamePart) -> String {
    part.as_ident()
        .map(|i| i.value.to_lowercase())
        .unwrap_or_default()
}

/// `pg_catalog.f` -> `f`.
fn strip_catalog(name: &mut ObjectName) {
    if name.0.len() == 2 && ident_name(&name.0[0]) == "pg_catalog" {
        name.0.remove(0);
    }
}

fn call(name: &str, args: Vec<Expr>) -> Expr {
    Expr::Function(ast::Function {
        name: ObjectName::from(vec![Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|e| FunctionArg::Unnamed(FunctionArgExpr::Expr(e)))
                .collect(),
            clauses: Vec::new(),
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: Vec::new(),
    })
}

fn function_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Function(f) => f.name.0.last().map(ident_name),
        _ => None,
    }
}

/// The `reg*` kind a type names (`regclass`, `pg_catalog.regtype`), with its cast and text functions.
fn reg_kind(data_type: &DataType) -> Option<(&'static str, &'static str, &'static str)> {
    let name = match data_type {
        DataType::Regclass => "regclass".to_owned(),
        DataType::Custom(name, _) => name.0.last().map(ident_name)?,
        _ => return None,
    };
    match name.as_str() {
        "regclass" => Some(("regclass", REGCLASS, REGCLASS_TEXT)),
        "regtype" => Some(("regtype", REGTYPE, REGTYPE_TEXT)),
        "regnamespace" => Some(("regnamespace", REGNAMESPACE, REGNAMESPACE_TEXT)),
        "regproc" | "regprocedure" => Some(("regproc", REGPROC, REGPROC_TEXT)),
        _ => None,
    }
}

/// What `pg_catalog.text`, `name`, `"char"`, `oid`... are among the types Eddy plans with.
fn plain_type(data_type: &DataType) -> Option<DataType> {
    let DataType::Custom(name, modifiers) = data_type else {
        return None;
    };
    let last = name.0.last().map(ident_name)?;
    let qualified = name.0.len() == 2 && ident_name(&name.0[0]) == "pg_catalog";
    match last.as_str() {
        "name" | "char" | "text" | "bpchar" => Some(DataType::Text),
        _ if qualified => {
            let text = if modifiers.is_empty() {
                last
            } else {
                format!("{last}({})", modifiers.join(","))
            };
            datafusion::sql::sqlparser::parser::Parser::new(
                &datafusion::sql::sqlparser::dialect::PostgreSqlDialect {},
            )
            .try_with_sql(&text)
            .and_then(|mut p| p.parse_data_type())
            .ok()
        }
        _ => None,
    }
}

fn is_oid_type(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Custom(name, _) if name.0.last().map(ident_name).as_deref() == Some("oid"))
}

fn is_text_type(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Text | DataType::Varchar(_) | DataType::CharacterVarying(_)
    ) || plain_type(data_type) == Some(DataType::Text)
}

fn rewrite_cast(expr: &mut Expr) {
    let Expr::Cast {
        expr: inner,
        data_type,
        kind,
        ..
    } = expr
    else {
        return;
    };
    if !matches!(kind, CastKind::Cast | CastKind::DoubleColon) {
        return;
    }
    let inner_function = function_name(inner);
    if let Some((_, cast, _)) = reg_kind(data_type) {
        *expr = call(cast, vec![*inner.clone()]);
        return;
    }
    if is_oid_type(data_type) {
        // Of a `reg*` cast too: the result is then an OID, not a name.
        *expr = call(TO_OID, vec![*inner.clone()]);
        return;
    }
    if is_text_type(data_type)
        && let Some(f) = inner_function.as_deref()
        && let Some(text) = [
            (REGCLASS, REGCLASS_TEXT),
            (REGTYPE, REGTYPE_TEXT),
            (REGNAMESPACE, REGNAMESPACE_TEXT),
            (REGPROC, REGPROC_TEXT),
        ]
        .iter()
        .find(|(c, _)| *c == f)
        .map(|(_, t)| *t)
    {
        *expr = call(text, vec![*inner.clone()]);
        return;
    }
    if let Some(plain) = plain_type(data_type) {
        *data_type = plain;
    }
}

fn custom_operator(op: &mut BinaryOperator) {
    let BinaryOperator::PGCustomBinaryOperator(parts) = op else {
        return;
    };
    let Some(symbol) = parts.last() else { return };
    let plain = match symbol.as_str() {
        "~" => BinaryOperator::PGRegexMatch,
        "~*" => BinaryOperator::PGRegexIMatch,
        "!~" => BinaryOperator::PGRegexNotMatch,
        "!~*" => BinaryOperator::PGRegexNotIMatch,
        "~~" => BinaryOperator::PGLikeMatch,
        "!~~" => BinaryOperator::PGNotLikeMatch,
        "=" => BinaryOperator::Eq,
        "<>" | "!=" => BinaryOperator::NotEq,
        "<" => BinaryOperator::Lt,
        ">" => BinaryOperator::Gt,
        "<=" => BinaryOperator::LtEq,
        ">=" => BinaryOperator::GtEq,
        "||" => BinaryOperator::StringConcat,
        "+" => BinaryOperator::Plus,
        "-" => BinaryOperator::Minus,
        _ => return,
    };
    *op = plain;
}

const AGGREGATES: [&str; 10] = [
    "count",
    "max",
    "min",
    "sum",
    "avg",
    "array_agg",
    "string_agg",
    "bool_and",
    "bool_or",
    "every",
];

/// The one projected expression of a plain `SELECT` that does not aggregate, if that is what
/// `query` is.
fn single_plain_item(query: &mut Query) -> Option<&mut Expr> {
    if query.limit_clause.is_some() {
        return None;
    }
    let SetExpr::Select(select) = query.body.as_mut() else {
        return None;
    };
    let no_grouping =
        matches!(&select.group_by, ast::GroupByExpr::Expressions(e, _) if e.is_empty());
    if select.projection.len() != 1
        || select.distinct.is_some()
        || !no_grouping
        || select.having.is_some()
    {
        return None;
    }
    let expr = match &mut select.projection[0] {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e,
        _ => return None,
    };
    if function_name(expr).is_some_and(|f| AGGREGATES.contains(&f.as_str())) {
        return None;
    }
    Some(expr)
}

/// `ARRAY(SELECT x FROM unnest(e) x)` over an outer column: Eddy's catalogs hold no such
/// arrays (reloptions), so it is `e`; any other `ARRAY(SELECT x ...)` is `(SELECT array_agg(x) ...)`.
fn array_subquery(expr: &mut Expr) {
    let Expr::Function(f) = expr else { return };
    if f.name.0.len() != 1 || ident_name(&f.name.0[0]) != "array" {
        return;
    }
    let FunctionArguments::Subquery(query) = &mut f.args else {
        return;
    };
    let mut query = query.clone();
    if let SetExpr::Select(select) = query.body.as_ref()
        && let Some(TableFactor::Table {
            name,
            args: Some(args),
            ..
        }) = select.from.first().map(|t| &t.relation)
        && name.0.last().map(ident_name).as_deref() == Some("unnest")
        && let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(array))) = args.args.first()
    {
        *expr = array.clone();
        return;
    }
    query.order_by = None;
    let Some(item) = single_plain_item(&mut query) else {
        return;
    };
    *item = call("array_agg", vec![item.clone()]);
    // ARRAY() of no rows is an empty array, not NULL.
    *expr = call(
        "coalesce",
        vec![Expr::Subquery(query), call("make_array", Vec::new())],
    );
}

/// The names a subquery's FROM gives its relations (aliases, else table names).
fn local_names(select: &ast::Select) -> Vec<String> {
    let mut names = Vec::new();
    let mut add = |factor: &TableFactor| match factor {
        TableFactor::Table { alias: Some(a), .. } | TableFactor::Derived { alias: Some(a), .. } => {
            names.push(a.name.value.to_lowercase())
        }
        TableFactor::Table { name, .. } => names.extend(name.0.last().map(ident_name)),
        _ => {}
    };
    for t in &select.from {
        add(&t.relation);
        for j in &t.joins {
            add(&j.relation);
        }
    }
    names
}

/// The qualifiers of the columns an expression names (`a` of `a.attnum`); `None` for an
/// unqualified column (taken as the subquery's own).
fn qualifiers(expr: &Expr) -> Vec<Option<String>> {
    struct Collect(Vec<Option<String>>);
    impl ast::Visitor for Collect {
        type Break = ();
        fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
            match expr {
                Expr::CompoundIdentifier(parts) if parts.len() >= 2 => self
                    .0
                    .push(Some(parts[parts.len() - 2].value.to_lowercase())),
                Expr::Identifier(_) => self.0.push(None),
                _ => {}
            }
            ControlFlow::Continue(())
        }
    }
    let mut c = Collect(Vec::new());
    let _ = ast::Visit::visit(expr, &mut c);
    c.0
}

fn conjuncts(expr: Expr, out: &mut Vec<Expr>) {
    match expr {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            conjuncts(*left, out);
            conjuncts(*right, out);
        }
        Expr::Nested(inner) => conjuncts(*inner, out),
        other => out.push(other),
    }
}

/// A correlated scalar subquery DataFusion can decorrelate: conditions on the outer row alone
/// move out (`CASE WHEN a.atthasdef THEN (SELECT ...) END`), and the projection takes the
/// `max` of its column. A subquery correlated by an inequality (psql's per-column collation
/// lookup, `a.attcollation <> t.typcollation`) is NULL: Eddy's columns have their type's
/// collation.
fn scalar_subquery(expr: &mut Expr) {
    let Expr::Subquery(query) = expr else { return };
    let SetExpr::Select(select) = query.body.as_mut() else {
        return;
    };
    let local = local_names(select);
    let is_local = |q: &Option<String>| q.as_ref().is_none_or(|q| local.contains(q));
    let mut outer_only = Vec::new();
    if let Some(selection) = select.selection.take() {
        let mut parts = Vec::new();
        conjuncts(selection, &mut parts);
        let mut kept = Vec::new();
        for part in parts {
            let names = qualifiers(&part);
            let inner = names.iter().any(is_local);
            let outer = names.iter().any(|q| !is_local(q));
            if outer && !inner {
                outer_only.push(part);
            } else if outer
                && matches!(
                    &part,
                    Expr::BinaryOp {
                        op: BinaryOperator::NotEq,
                        ..
                    }
                )
            {
                *expr = Expr::Value(ast::Value::Null.into());
                return;
            } else {
                kept.push(part);
            }
        }
        select.selection = kept.into_iter().reduce(|a, b| Expr::BinaryOp {
            left: Box::new(a),
            op: BinaryOperator::And,
            right: Box::new(b),
        });
    }
    if let Some(item) = single_plain_item(query) {
        let name = match &*item {
            Expr::Function(f) => f.name.0.last().map(ident_name),
            Expr::CompoundIdentifier(p) => p.last().map(|i| i.value.clone()),
            Expr::Identifier(i) => Some(i.value.clone()),
            _ => None,
        };
        *item = call("max", vec![item.clone()]);
        if let (Some(name), SetExpr::Select(select)) = (name, query.body.as_mut()) {
            let expr = match select.projection.pop() {
                Some(SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }) => e,
                _ => return,
            };
            select.projection.push(SelectItem::ExprWithAlias {
                expr,
                alias: Ident::new(name),
            });
        }
    }
    if let Some(condition) = outer_only.into_iter().reduce(|a, b| Expr::BinaryOp {
        left: Box::new(a),
        op: BinaryOperator::And,
        right: Box::new(b),
    }) {
        *expr = Expr::Case {
            case_token: ast::helpers::attached_token::AttachedToken::empty(),
            end_token: ast::helpers::attached_token::AttachedToken::empty(),
            operand: None,
            conditions: vec![ast::CaseWhen {
                condition,
                result: expr.clone(),
            }],
            else_result: None,
        };
    }
}

/// `CASE WHEN c THEN (SELECT x ... WHERE w) [ELSE NULL] END` is `(SELECT x ... WHERE (c) AND
/// (w))`: both are NULL unless `c` holds and the subquery finds a row. DataFusion cannot plan
/// a correlated subquery inside CASE (SQLAlchemy's column reflection writes three), but plans
/// the second form.
fn case_subquery(expr: &mut Expr) {
    empty_subquery(expr);
    let Expr::Case {
        operand: None,
        conditions,
        else_result,
        ..
    } = expr
    else {
        return;
    };
    let else_null = match else_result.as_deref() {
        None => true,
        Some(Expr::Value(v)) => matches!(v.value, ast::Value::Null),
        Some(_) => false,
    };
    if !else_null || conditions.len() != 1 {
        return;
    }
    let ast::CaseWhen {
        condition,
        result: Expr::Subquery(query),
    } = &conditions[0]
    else {
        return;
    };
    let mut query = query.clone();
    let SetExpr::Select(select) = query.body.as_mut() else {
        return;
    };
    let condition = Expr::Nested(Box::new(condition.clone()));
    select.selection = Some(match select.selection.take() {
        Some(w) => Expr::BinaryOp {
            left: Box::new(condition),
            op: BinaryOperator::And,
            right: Box::new(Expr::Nested(Box::new(w))),
        },
        None => condition,
    });
    *expr = Expr::Subquery(query);
}

/// A scalar subquery that reads one catalog Eddy never fills, and aggregates nothing, is NULL
/// (DataFusion cannot decorrelate some that SQLAlchemy writes over `pg_sequence`).
fn empty_subquery(expr: &mut Expr) {
    let Expr::Case { conditions, .. } = expr else {
        return;
    };
    for when in conditions.iter_mut() {
        let Expr::Subquery(query) = &when.result else {
            continue;
        };
        let SetExpr::Select(select) = query.body.as_ref() else {
            continue;
        };
        let [from] = select.from.as_slice() else {
            continue;
        };
        let TableFactor::Table { name, .. } = &from.relation else {
            continue;
        };
        let table = name.0.last().map(ident_name).unwrap_or_default();
        let aggregates = select
            .projection
            .iter()
            .any(|item| item.to_string().to_lowercase().contains("count("));
        if from.joins.is_empty()
            && !aggregates
            && select.group_by == ast::GroupByExpr::Expressions(Vec::new(), Vec::new())
            && super::always_empty(&table)
        {
            when.result = Expr::Value(ast::Value::Null.into());
        }
    }
}

impl VisitorMut for Rewriter {
    type Break = ();

    fn pre_visit_table_factor(&mut self, table: &mut TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table {
            name,
            args: Some(_),
            ..
        } = table
        {
            strip_catalog(name);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::Function(f) = expr {
            strip_catalog(&mut f.name);
        }
        if self.catalogs {
            array_subquery(expr);
            case_subquery(expr);
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        match expr {
            Expr::Collate { expr: inner, .. } => *expr = *inner.clone(),
            Expr::BinaryOp { op, .. } => custom_operator(op),
            Expr::Cast { .. } => rewrite_cast(expr),
            Expr::Subquery(_) if self.catalogs => scalar_subquery(expr),
            _ => {}
        }
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        // A result column that is a `reg*` cast reads as a name, as in PostgreSQL, and is
        // named after the column cast (or the type).
        let SetExpr::Select(select) = query.body.as_mut() else {
            return ControlFlow::Continue(());
        };
        for item in &mut select.projection {
            let SelectItem::UnnamedExpr(e) = item else {
                continue;
            };
            let Some(f) = function_name(e) else { continue };
            // `to_regclass(...)` and the like return the reg* type too: a name, so named.
            if let Some(text) = [
                ("to_regclass", REGCLASS_TEXT),
                ("to_regtype", REGTYPE_TEXT),
                ("to_regnamespace", REGNAMESPACE_TEXT),
                ("to_regproc", REGPROC_TEXT),
            ]
            .iter()
            .find(|(name, _)| f.eq_ignore_ascii_case(name))
            .map(|(_, t)| *t)
            {
                let alias = Ident::new(f.to_lowercase());
                *item = SelectItem::ExprWithAlias {
                    expr: call(text, vec![e.clone()]),
                    alias,
                };
                continue;
            }
            let Some((kind, text)) = [
                ("regclass", REGCLASS, REGCLASS_TEXT),
                ("regtype", REGTYPE, REGTYPE_TEXT),
                ("regnamespace", REGNAMESPACE, REGNAMESPACE_TEXT),
                ("regproc", REGPROC, REGPROC_TEXT),
            ]
            .iter()
            .find(|(_, c, _)| *c == f)
            .map(|(k, _, t)| (*k, *t)) else {
                continue;
            };
            let alias = match e {
                Expr::Function(call) => match &call.args {
                    FunctionArguments::List(list) => match list.args.first() {
                        Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Identifier(i)))) => {
                            i.value.clone()
                        }
                        Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(
                            Expr::CompoundIdentifier(p),
                        ))) => p.last().map_or(kind.to_owned(), |i| i.value.clone()),
                        _ => kind.to_owned(),
                    },
                    _ => kind.to_owned(),
                },
                _ => kind.to_owned(),
            };
            *item = SelectItem::ExprWithAlias {
                expr: call(text, vec![e.clone()]),
                alias: Ident::new(alias),
            };
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> String {
        let mut statements = datafusion::sql::sqlparser::parser::Parser::parse_sql(
            &datafusion::sql::sqlparser::dialect::PostgreSqlDialect {},
            sql,
        )
        .unwrap();
        rewrite(&mut statements[0]);
        statements[0].to_string()
    }

    #[test]
    fn catalog_queries_become_plannable() {
        insta::assert_snapshot!(rewritten("SELECT pg_catalog.version()"), @"SELECT version()");
        insta::assert_snapshot!(
            rewritten("SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relname OPERATOR(pg_catalog.~) '^(t)$' COLLATE pg_catalog.default"),
            @"SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relname ~ '^(t)$'"
        );
        insta::assert_snapshot!(rewritten("SELECT 'users'::regclass, c.oid::pg_catalog.regclass::pg_catalog.text FROM pg_class c WHERE c.oid = 't'::regclass"), @"SELECT eddy_regclass_text(eddy_regclass('users')) AS regclass, eddy_regclass_text(eddy_regclass(c.oid)) FROM pg_class c WHERE c.oid = eddy_regclass('t')");
        insta::assert_snapshot!(rewritten("SELECT '1'::pg_catalog.oid, x::pg_catalog.int4 FROM t"), @"SELECT eddy_to_oid('1'), x::INT4 FROM t");
    }
}
