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
