//! SHOW and SET: what a session shows of the catalog and its variables, and what it sets.

use super::*;

impl Session {
    pub(super) fn show_tables(&self) -> Outcome {
        let names: Vec<String> = self
            .engine
            .table_names()
            .iter()
            .map(QualifiedName::display)
            .collect();
        let schema = text_schema(&["name"]);
        let column: ArrayRef = Arc::new(StringArray::from(names));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![column])
            .map_or_else(|_| Vec::new(), |b| vec![b]);
        Outcome::Rows {
            schema,
            batches: batch,
        }
    }

    pub(super) fn show_create_table(&self, name: &ast::ObjectName) -> Result<Outcome> {
        let name = self.existing_name(name)?;
        let table = self.writable_table(&name)?;
        rows_of_text(
            &["name", "create_sql"],
            vec![vec![name.display(), table.def.create_sql()]],
        )
    }

    pub(super) fn show_variable(&self, variable: &[ast::Ident]) -> Result<Outcome> {
        let name = variable_name(variable);
        if name.eq_ignore_ascii_case("all") {
            let rows = self
                .variables
                .all()
                .map(|(k, v)| vec![k.to_owned(), v.to_owned()])
                .collect();
            return rows_of_text(&["name", "setting"], rows);
        }
        let (canonical, value) = self.variables.get(&name)?;
        rows_of_text(&[canonical], vec![vec![value]])
    }

    pub(super) fn set(&mut self, set: &ast::Set) -> Result<Outcome> {
        use ast::Set;
        let done = Outcome::Command {
            tag: "SET",
            rows: None,
        };
        match set {
            Set::SingleAssignment {
                variable, values, ..
            } => {
                let name = variable.to_string();
                let value = set_value(values)?;
                self.variables.set(&name, value)?;
                self.variable_changed(&name)?;
                Ok(done)
            }
            Set::SetTimeZone { value, .. } => {
                let value = set_value(std::slice::from_ref(value))?;
                self.variables.set("TimeZone", value)?;
                self.sync_time_zone()?;
                Ok(done)
            }
            Set::SetNames { charset_name, .. } => {
                self.variables
                    .set("client_encoding", Some(charset_name.value.clone()))?;
                Ok(done)
            }
            Set::SetTransaction { .. } | Set::SetSessionParam(_) => Ok(done),
            other => Err(Error::unsupported(format!("{other} is not supported"))),
        }
    }

    pub(super) fn sync_time_zone(&self) -> Result<()> {
        let tz = match self.variables.time_zone() {
            crate::TimeZone::Named(tz) => tz.name().to_owned(),
            crate::TimeZone::Fixed(offset) => offset.to_string(),
        };
        self.planner.set_time_zone(&tz)
    }
}

pub(super) fn variable_name(variable: &[ast::Ident]) -> String {
    variable
        .iter()
        .map(|i| i.value.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The value of `SET x = v`: literals and identifiers as text, `DEFAULT` as `None`.
pub(super) fn set_value(values: &[ast::Expr]) -> Result<Option<String>> {
    use ast::{Expr, Value};
    let mut parts = Vec::new();
    for v in values {
        let text = match v {
            Expr::Value(v) => match &v.value {
                Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
                Value::Number(n, _) => n.to_string(),
                Value::Boolean(b) => b.to_string(),
                other => other.to_string(),
            },
            Expr::Identifier(i)
                if i.value.eq_ignore_ascii_case("default") && i.quote_style.is_none() =>
            {
                return Ok(None);
            }
            Expr::Identifier(i) => i.value.clone(),
            Expr::UnaryOp {
                op: ast::UnaryOperator::Minus,
                expr,
            } => format!("-{expr}"),
            Expr::UnaryOp {
                op: ast::UnaryOperator::Plus,
                expr,
            } => format!("+{expr}"),
            Expr::Interval(_) => {
                return Err(Error::unsupported("SET ... TO INTERVAL is not supported"));
            }
            other => other.to_string(),
        };
        parts.push(text);
    }
    Ok(Some(parts.join(", ")))
}
