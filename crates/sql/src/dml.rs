//! Rewrites of PostgreSQL's write statements into what DataFusion plans.

use datafusion::sql::sqlparser::ast;
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use eddy_common::{Error, Result};

/// `DELETE FROM t USING u, v WHERE cond` deletes the rows of `t` for which some row of the
/// USING list satisfies `cond`: exactly `DELETE FROM t WHERE EXISTS (SELECT 1 FROM u, v
/// WHERE cond)`, which DataFusion plans (as a semi-join).
pub(crate) fn delete_using_as_exists(delete: &mut ast::Delete) -> Result<()> {
    let Some(using) = delete.using.take() else {
        return Ok(());
    };
    let from: Vec<String> = using.iter().map(ToString::to_string).collect();
    let mut text = format!("SELECT 1 FROM {}", from.join(", "));
    if let Some(selection) = &delete.selection {
        text.push_str(&format!(" WHERE {selection}"));
    }
    let query = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(&text)
        .and_then(|mut p| p.parse_query())
        .map_err(|e| Error::internal(format!("DELETE ... USING as EXISTS: {e}")))?;
    delete.selection = Some(ast::Expr::Exists {
        subquery: query,
        negated: false,
    });
    Ok(())
}

/// `UPDATE t [AS a] SET c = e, ... FROM f WHERE cond` as the query `SELECT a.*, <each column's
/// new value> FROM t AS a, f WHERE cond`, with the table's name (DataFusion plans no UPDATE
/// ... FROM). A column the SET list does not name keeps its value.
pub(crate) fn update_from_as_select(update: &ast::Update) -> Result<(String, ast::Statement)> {
    let ast::TableFactor::Table { name, alias, .. } = &update.table.relation else {
        return Err(Error::unsupported("UPDATE of something other than a table"));
    };
    if !update.table.joins.is_empty() {
        return Err(Error::unsupported(
            "UPDATE with a JOIN in its target: list the other tables in FROM",
        ));
    }
    let target = alias.as_ref().map_or_else(
        || name.0.last().map(ToString::to_string).unwrap_or_default(),
        |a| a.name.to_string(),
    );
    let from = match &update.from {
        Some(ast::UpdateTableFromKind::BeforeSet(f) | ast::UpdateTableFromKind::AfterSet(f)) => f,
        None => return Err(Error::internal("UPDATE without FROM")),
    };
    let mut sets = Vec::with_capacity(update.assignments.len());
    for assignment in &update.assignments {
        let ast::AssignmentTarget::ColumnName(column) = &assignment.target else {
            return Err(Error::unsupported(
                "UPDATE ... SET (a, b) = (...) is not supported: assign each column",
            ));
        };
        let column = column
            .0
            .last()
            .and_then(|p| p.as_ident())
            .cloned()
            .ok_or_else(|| Error::syntax("empty column name in SET"))?;
        sets.push((normalize(&column), assignment.value.to_string()));
    }
    // The new values are named `eddy_set_<column>`; the engine matches them to the columns.
    let mut list = vec![format!("{target}.*")];
    list.extend(sets.iter().map(|(column, value)| {
        format!("({value}) AS \"eddy_set_{}\"", column.replace('"', "\"\""))
    }));
    let mut text = format!(
        // Named as written (the target is schema-qualified by now): `t.*` reads it.
        "SELECT {} FROM {name} AS {target} , {}",
        list.join(", "),
        from.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(selection) = &update.selection {
        text.push_str(&format!(" WHERE {selection}"));
    }
    let query = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(&text)
        .and_then(|mut p| p.parse_query())
        .map_err(|e| Error::internal(format!("UPDATE ... FROM as a query: {e}")))?;
    let table = match name.0.as_slice() {
        [.., last] => last.as_ident().map(normalize).unwrap_or_default(),
        [] => String::new(),
    };
    Ok((table, ast::Statement::Query(query)))
}

fn normalize(ident: &ast::Ident) -> String {
    if ident.quote_style.is_some() {
        ident.value.clone()
    } else {
        ident.value.to_lowercase()
    }
}

/// Fills an INSERT's column defaults in, as PostgreSQL does: `DEFAULT` in a VALUES row, a
/// column the statement leaves out, and `DEFAULT VALUES` take the column's `DEFAULT`
/// expression (or NULL). The expressions are the table's as stored ([`DEFAULT_KEY`]), planned
/// with the statement like any other.
///
/// [`DEFAULT_KEY`]: crate::types::DEFAULT_KEY
pub(crate) fn fill_defaults(
    insert: &mut ast::Insert,
    table: &arrow::datatypes::Schema,
) -> Result<()> {
    let default_of = |index: usize| -> Result<ast::Expr> {
        match table.field(index).metadata().get(crate::types::DEFAULT_KEY) {
            Some(text) => parse_expr(text),
            None => Ok(ast::Expr::value(ast::Value::Null)),
        }
    };
    values_target_columns(insert, table)?;
    let named: Vec<usize> = if insert.columns.is_empty() {
        (0..table.fields().len()).collect()
    } else {
        insert
            .columns
            .iter()
            .map(|c| {
                let name =
                    c.0.last()
                        .and_then(|p| p.as_ident())
                        .map(crate::names::normalize_ident);
                name.and_then(|n| table.index_of(&n).ok()).ok_or_else(|| {
                    Error::new(
                        eddy_common::SqlState::UNDEFINED_COLUMN,
                        format!("column \"{c}\" of relation does not exist"),
                    )
                })
            })
            .collect::<Result<_>>()?
    };
    let omitted: Vec<usize> = (0..table.fields().len())
        .filter(|i| {
            !named.contains(i)
                && table
                    .field(*i)
                    .metadata()
                    .contains_key(crate::types::DEFAULT_KEY)
        })
        .collect();
    let Some(source) = insert.source.as_mut() else {
        // DEFAULT VALUES: one row of defaults.
        if insert.assignments.is_empty() {
            let row = (0..table.fields().len())
                .map(default_of)
                .collect::<Result<Vec<_>>>()?;
            insert.columns = table
                .fields()
                .iter()
                .map(|f| ast::ObjectName::from(vec![ast::Ident::with_quote('"', f.name())]))
                .collect();
            insert.source = Some(Box::new(values_query(vec![row])?));
        }
        return Ok(());
    };
    if let ast::SetExpr::Values(values) = source.body.as_mut() {
        for row in &mut values.rows {
            for (k, expr) in row.content.iter_mut().enumerate() {
                if is_default(expr)
                    && let Some(&column) = named.get(k)
                {
                    *expr = default_of(column)?;
                }
            }
            for &column in &omitted {
                row.content.push(default_of(column)?);
            }
        }
    } else if !omitted.is_empty() {
        // INSERT ... SELECT: the defaults are added to each row the query produces.
        let mut projection = vec![ast::SelectItem::QualifiedWildcard(
            ast::SelectItemQualifiedWildcardKind::ObjectName(ast::ObjectName::from(vec![
                ast::Ident::new("eddy_inserted"),
            ])),
            ast::WildcardAdditionalOptions::default(),
        )];
        for &column in &omitted {
            projection.push(ast::SelectItem::ExprWithAlias {
                expr: default_of(column)?,
                alias: ast::Ident::new(format!("eddy_default_{column}")),
            });
        }
        // The query's columns renamed, so no default's name can clash with one of them.
        let names: Vec<String> = (0..named.len())
            .map(|k| format!("eddy_value_{k}"))
            .collect();
        let wrapped = format!(
            "SELECT * FROM ({source}) AS eddy_inserted({})",
            names.join(", ")
        );
        let mut query = parse_query(&wrapped)?;
        if let ast::SetExpr::Select(select) = query.body.as_mut() {
            select.projection = projection;
        }
        **source = query;
    }
    if !omitted.is_empty() {
        if insert.columns.is_empty() {
            insert.columns = named.iter().map(|&i| column_name(table, i)).collect();
        }
        insert
            .columns
            .extend(omitted.iter().map(|&i| column_name(table, i)));
    }
    Ok(())
}

/// `UPDATE ... SET c = DEFAULT`: the column's default (or NULL).
pub(crate) fn assign_defaults(
    assignments: &mut [ast::Assignment],
    table: &arrow::datatypes::Schema,
) -> Result<()> {
    for assignment in assignments {
        let ast::AssignmentTarget::ColumnName(name) = &assignment.target else {
            continue;
        };
        if !is_default(&assignment.value) {
            continue;
        }
        let column = name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(crate::names::normalize_ident)
            .and_then(|n| table.index_of(&n).ok());
        assignment.value =
            match column.and_then(|c| table.field(c).metadata().get(crate::types::DEFAULT_KEY)) {
                Some(text) => parse_expr(text)?,
                None => ast::Expr::value(ast::Value::Null),
            };
    }
    Ok(())
}

/// The keyword `DEFAULT` where a value goes (sqlparser reads it as an identifier).
fn is_default(expr: &ast::Expr) -> bool {
    matches!(expr, ast::Expr::Identifier(i) if i.quote_style.is_none() && i.value.eq_ignore_ascii_case("default"))
}

/// `INSERT INTO t VALUES (..)` without a column list whose rows are shorter than the table:
/// as in PostgreSQL, the values go to the first columns (the rest take their defaults). Rows of
/// other lengths, or not as long as a column list, or longer than the table, are 42601 with
/// PostgreSQL's messages.
fn values_target_columns(insert: &mut ast::Insert, table: &arrow::datatypes::Schema) -> Result<()> {
    let Some(source) = insert.source.as_ref() else {
        return Ok(());
    };
    let ast::SetExpr::Values(values) = source.body.as_ref() else {
        return Ok(());
    };
    let Some(width) = values.rows.first().map(|r| r.content.len()) else {
        return Ok(());
    };
    let syntax = |message: &str| Error::new(eddy_common::SqlState::SYNTAX_ERROR, message);
    if values.rows.iter().any(|r| r.content.len() != width) {
        return Err(syntax("VALUES lists must all be the same length"));
    }
    let targets = if insert.columns.is_empty() {
        table.fields().len()
    } else {
        insert.columns.len()
    };
    if width > targets {
        return Err(syntax("INSERT has more expressions than target columns"));
    }
    if !insert.columns.is_empty() && width < targets {
        return Err(syntax("INSERT has more target columns than expressions"));
    }
    if insert.columns.is_empty() && width < targets {
        insert.columns = (0..width).map(|i| column_name(table, i)).collect();
    }
    Ok(())
}

fn column_name(table: &arrow::datatypes::Schema, index: usize) -> ast::ObjectName {
    ast::ObjectName::from(vec![ast::Ident::with_quote('"', table.field(index).name())])
}

fn values_query(rows: Vec<Vec<ast::Expr>>) -> Result<ast::Query> {
    let mut query = parse_query("VALUES (NULL)")?;
    if let ast::SetExpr::Values(values) = query.body.as_mut() {
        values.rows = rows.into_iter().map(ast::Parens::with_empty_span).collect();
    }
    Ok(query)
}

fn parse_query(sql: &str) -> Result<ast::Query> {
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_query())
        .map(|q| *q)
        .map_err(|e| Error::internal(format!("{sql}: {e}")))
}

/// A type name (`int8`, `text[]`) as a type.
pub fn parse_data_type(sql: &str) -> Result<ast::DataType> {
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_data_type())
        .map_err(|e| Error::syntax(format!("{sql}: {e}")))
}

/// A stored expression (a column default) as an expression.
pub fn parse_expr(sql: &str) -> Result<ast::Expr> {
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| Error::syntax(format!("{sql}: {e}")))
}
