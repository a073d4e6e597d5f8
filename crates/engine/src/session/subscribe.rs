//! SUBSCRIBE: a session's subscriptions to a view's changes, as rows a client fetches.

use super::*;

impl Session {
    /// Resolves a SUBSCRIBE target to a view (a temporary one for queries and tables) and
    /// subscribes to it. Returns the subscription, the output schema and the temporary view.
    pub(super) async fn start_subscription(
        &mut self,
        subscribe: &eddy_sql::Subscribe,
    ) -> Result<(crate::views::Subscription, SchemaRef, Option<ObjectId>)> {
        let (schema, target) = self.subscription_target(subscribe, true).await?;
        let (view_id, temporary) = match target {
            Some(SubscriptionTarget::View(id)) => (id, None),
            Some(SubscriptionTarget::Temporary(id)) => (id, Some(id)),
            None => return Err(Error::internal("subscription target was not created")),
        };
        let subscription = match self.engine.subscribe(view_id, subscribe.snapshot).await {
            Ok(s) => s,
            Err(e) => {
                if let Some(id) = temporary {
                    self.engine.drop_temporary_view(id);
                }
                return Err(e);
            }
        };
        Ok((
            subscription,
            subscription_schema(&schema, subscribe.progress),
            temporary,
        ))
    }

    /// The columns a SUBSCRIBE target has, and (when `create`) the view to subscribe to: the
    /// named view, or a temporary view made for a query or a table.
    pub(super) async fn subscription_target(
        &mut self,
        subscribe: &eddy_sql::Subscribe,
        create: bool,
    ) -> Result<(SchemaRef, Option<SubscriptionTarget>)> {
        let query = match &subscribe.target {
            eddy_sql::SubscribeTarget::Name(name) => {
                let name = self.existing_name(name)?;
                if let Some(view) = self.engine.view(&name) {
                    return Ok((
                        Arc::clone(&view.schema),
                        Some(SubscriptionTarget::View(view.def.id)),
                    ));
                }
                if self.engine.table(&name).is_none()
                    && self.engine.source(&name).is_none()
                    && self.engine.plain_view(&name).is_none()
                {
                    return Err(Error::new(
                        SqlState::UNDEFINED_TABLE,
                        format!("relation \"{}\" does not exist", name.display()),
                    ));
                }
                let parsed = eddy_sql::parse_statements(&format!("SELECT * FROM {name}"))?;
                let Some(Statement::Sql(q)) = parsed.into_iter().next().map(|p| p.statement) else {
                    return Err(Error::internal("subscribe query"));
                };
                let ast::Statement::Query(q) = *q else {
                    return Err(Error::internal("subscribe query"));
                };
                q
            }
            eddy_sql::SubscribeTarget::Query(query) => query.clone(),
        };
        let plan = self
            .planner
            .plan_view(&query, &eddy_sql::ViewOptions::default())
            .await?;
        let schema = Arc::clone(&plan.schema);
        if !create {
            return Ok((schema, None));
        }
        let id = self.engine.create_temporary_view(plan).await?;
        Ok((schema, Some(SubscriptionTarget::Temporary(id))))
    }

    /// A never-ending change stream (streaming SUBSCRIBE and COPY (SUBSCRIBE) TO STDOUT).
    pub async fn open_subscription(
        &mut self,
        subscribe: &eddy_sql::Subscribe,
    ) -> Result<SubscriptionStream> {
        self.engine.wait_recovered(self.notices.as_ref()).await;
        let (subscription, schema, temporary_view) = self.start_subscription(subscribe).await?;
        Ok(SubscriptionStream {
            subscription,
            schema,
            progress: subscribe.progress,
            temporary_view,
            engine: Arc::clone(&self.engine),
        })
    }
}

/// A subscription read to its end by the server; dropping it ends the subscription.
pub struct SubscriptionStream {
    subscription: crate::views::Subscription,
    pub schema: SchemaRef,
    progress: bool,
    temporary_view: Option<ObjectId>,
    engine: Arc<Engine>,
}

impl SubscriptionStream {
    /// The rows of the next epoch; `None` once the view is gone.
    pub async fn next(&mut self) -> Result<Option<Vec<RecordBatch>>> {
        match self.subscription.events.recv().await {
            Some(event) => change_rows(&self.schema, self.progress, &event).map(Some),
            None => self.subscription.end().map(|()| None),
        }
    }
}

impl Drop for SubscriptionStream {
    fn drop(&mut self) {
        if let Some(id) = self.temporary_view {
            self.engine.drop_temporary_view(id);
        }
    }
}

/// One epoch of changes as cursor rows: epoch, diff, [progressed], the view's columns.
pub(super) fn change_rows(
    schema: &SchemaRef,
    progress: bool,
    event: &crate::views::EpochChanges,
) -> Result<Vec<RecordBatch>> {
    use arrow::array::{BooleanArray, Int64Array};
    let mut out = Vec::new();
    let epoch = event.epoch as i64;
    if let Some(changes) = &event.changes {
        let n = changes.len();
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![epoch; n])),
            Arc::new(changes.diffs().clone()),
        ];
        if progress {
            columns.push(Arc::new(BooleanArray::from(vec![false; n])));
        }
        columns.extend(changes.rows().columns().iter().cloned());
        out.push(
            RecordBatch::try_new(Arc::clone(schema), columns)
                .map_err(|e| Error::internal(format!("cursor rows: {e}")))?,
        );
    }
    if progress {
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![epoch])),
            Arc::new(Int64Array::from(vec![None::<i64>])),
            Arc::new(BooleanArray::from(vec![true])),
        ];
        columns.extend(
            schema
                .fields()
                .iter()
                .skip(3)
                .map(|f| arrow::array::new_null_array(f.data_type(), 1)),
        );
        out.push(
            RecordBatch::try_new(Arc::clone(schema), columns)
                .map_err(|e| Error::internal(format!("progress row: {e}")))?,
        );
    }
    Ok(out)
}

pub(super) enum SubscriptionTarget {
    View(ObjectId),
    Temporary(ObjectId),
}

/// `eddy_epoch`, `eddy_diff` (and `eddy_progressed` with PROGRESS), then the view's columns.
pub(super) fn subscription_schema(view: &SchemaRef, progress: bool) -> SchemaRef {
    let mut fields = vec![
        Field::new("eddy_epoch", DataType::Int64, false),
        Field::new("eddy_diff", DataType::Int64, true),
    ];
    if progress {
        fields.push(Field::new("eddy_progressed", DataType::Boolean, true));
    }
    fields.extend(view.fields().iter().map(|f| f.as_ref().clone()));
    Arc::new(Schema::new(fields))
}
