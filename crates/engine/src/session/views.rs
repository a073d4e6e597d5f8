//! Materialized views as a session creates and restores them.

use super::*;

impl Session {
    pub(super) async fn create_materialized_view(
        &mut self,
        create: &ast::CreateView,
        emit_on_close: bool,
    ) -> Result<Outcome> {
        let name = self.new_name(&create.name)?;
        if self.engine.name_taken(&name) && create.if_not_exists {
            return Ok(relation_exists(
                &name.name,
                Outcome::Command {
                    tag: "CREATE MATERIALIZED VIEW",
                    rows: None,
                },
            ));
        }
        if create.or_replace {
            return Err(Error::unsupported(
                "CREATE OR REPLACE MATERIALIZED VIEW is not supported: drop the view first",
            ));
        }
        if !create.columns.is_empty() {
            return Err(Error::unsupported(
                "column names after the view name are not supported: alias the columns in the query",
            ));
        }
        let options = eddy_sql::windows::view_options(&create.options, emit_on_close)?;
        let plan = self.planner.plan_view(&create.query, &options).await?;
        let started = std::time::Instant::now();
        let stored = self.stored_form(create, &name)?;
        let sql = if emit_on_close {
            format!("{stored} EMIT ON WINDOW CLOSE")
        } else {
            stored.to_string()
        };
        let (rows, sources) = self
            .engine
            .create_view(name.clone(), sql, plan, None, self.notices.clone())
            .await?;
        let sources = match sources {
            0 => String::new(),
            1 => " and read its source to the end".to_owned(),
            n => format!(" and read its {n} sources to the end"),
        };
        Ok(Outcome::Notice {
            state: SqlState::SUCCESSFUL_COMPLETION,
            message: format!(
                "materialized view \"{}\" backfilled from {rows} rows{sources} in {} ms",
                name.display(),
                started.elapsed().as_millis()
            ),
            detail: None,
            then: Box::new(Outcome::Command {
                tag: "CREATE MATERIALIZED VIEW",
                rows: None,
            }),
        })
    }

    /// Plans a stored view again at start-up, under its original id.
    pub(crate) async fn restore_view(&mut self, def: &crate::catalog::ViewDef) -> Result<()> {
        let plan = self.plan_stored_view(def).await?;
        self.engine
            .create_view(def.qualified(), def.sql.clone(), plan, Some(def.id), None)
            .await
            .map(|_| ())
    }

    /// Plans a view stored in the catalog from its SQL.
    pub(crate) async fn plan_stored_view(
        &mut self,
        def: &crate::catalog::ViewDef,
    ) -> Result<eddy_sql::ViewPlan> {
        let parsed = eddy_sql::parse_statements(&def.sql)?;
        let (create, emit_on_close) = match parsed.first().map(|p| &p.statement) {
            Some(Statement::CreateMaterializedView {
                create,
                emit_on_close,
            }) => (create.clone(), *emit_on_close),
            _ => {
                return Err(Error::internal(
                    "stored view does not parse to one CREATE MATERIALIZED VIEW",
                ));
            }
        };
        let options = eddy_sql::windows::view_options(&create.options, emit_on_close)?;
        self.planner.plan_view(&create.query, &options).await
    }
}
