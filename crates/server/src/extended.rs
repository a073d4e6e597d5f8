//! The extended query protocol: Parse (statements parsed, analyzed as PostgreSQL does for
//! queries and DML), Bind (parameters decoded into the types planning inferred), Describe and
//! Execute (planned against the catalog then).

use super::*;

/// Parses at Parse time; planning happens at Describe and Execute, against the catalog then.
#[derive(Debug)]
pub struct EddyQueryParser;

#[async_trait]
impl QueryParser for EddyQueryParser {
    type Statement = Arc<Parsed>;

    async fn parse_sql<C>(
        &self,
        _client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<Self::Statement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let mut statements = parse_statements(sql).map_err(|e| {
            log_failure(sql, &e);
            to_pgwire(e)
        })?;
        match statements.len() {
            0 => Ok(None),
            1 => Ok(statements.pop().map(Arc::new)),
            _ => Err(to_pgwire(Error::syntax(
                "cannot insert multiple commands into a prepared statement",
            ))),
        }
    }

    fn get_parameter_types(&self, _stmt: &Self::Statement) -> PgWireResult<Vec<Type>> {
        Ok(Vec::new())
    }

    fn get_result_schema(
        &self,
        _stmt: &Self::Statement,
        _format: Option<&Format>,
    ) -> PgWireResult<Vec<pgwire::api::results::FieldInfo>> {
        Ok(Vec::new())
    }
}

/// A query whose select list holds a bare parameter (`SELECT $1`) that the client typed at
/// Parse, with that parameter cast to its type: the result column has the parameter's type, as
/// in PostgreSQL (planning alone would make it text). `None` when there is none.
fn type_bare_parameters(parsed: &Parsed, types: &[Option<Type>]) -> Option<Parsed> {
    use eddy_sql::ast;
    let eddy_engine::Statement::Sql(sql) = &parsed.statement else {
        return None;
    };
    let ast::Statement::Query(query) = sql.as_ref() else {
        return None;
    };
    let ast::SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let type_of = |expr: &ast::Expr| -> Option<ast::DataType> {
        let ast::Expr::Value(v) = expr else {
            return None;
        };
        let ast::Value::Placeholder(p) = &v.value else {
            return None;
        };
        let index: usize = p.strip_prefix('$')?.parse().ok()?;
        let pg = types.get(index.checked_sub(1)?)?.as_ref()?;
        let name = match encode::element_of(pg) {
            Some(element) => format!("{}[]", element.name()),
            None => pg.name().to_owned(),
        };
        if matches!(name.as_str(), "unknown" | "void") {
            return None;
        }
        eddy_sql::parse_data_type(&name).ok()
    };
    let mut select = select.clone();
    let mut changed = false;
    for item in &mut select.projection {
        let cast = |expr: &ast::Expr| {
            type_of(expr).map(|data_type| ast::Expr::Cast {
                kind: ast::CastKind::DoubleColon,
                expr: Box::new(expr.clone()),
                data_type,
                array: false,
                format: None,
            })
        };
        match item {
            // `SELECT $1` is named `?column?` either way.
            ast::SelectItem::UnnamedExpr(expr) => {
                if let Some(cast) = cast(expr) {
                    *item = ast::SelectItem::ExprWithAlias {
                        expr: cast,
                        alias: ast::Ident::with_quote('"', "?column?"),
                    };
                    changed = true;
                }
            }
            ast::SelectItem::ExprWithAlias { expr, .. } => {
                if let Some(cast) = cast(expr) {
                    *expr = cast;
                    changed = true;
                }
            }
            _ => {}
        }
    }
    if !changed {
        return None;
    }
    let mut query = query.clone();
    query.body = Box::new(ast::SetExpr::Select(select));
    Some(Parsed {
        statement: eddy_engine::Statement::Sql(Box::new(ast::Statement::Query(query))),
        text: parsed.text.clone(),
    })
}

/// Whether PostgreSQL analyzes a statement when it is parsed (queries and DML; utility
/// statements such as DDL are checked only when they run).
fn analyzed_at_parse(statement: &eddy_engine::Statement) -> bool {
    use eddy_sql::ast::Statement as S;
    matches!(
        statement,
        eddy_engine::Statement::Sql(sql)
            if matches!(sql.as_ref(), S::Query(_) | S::Insert(_) | S::Update(_) | S::Delete(_))
    )
}

/// Parameter types: the client's where it gave them, else what planning inferred, else text.
fn parameter_types(
    client_types: &[Option<Type>],
    described: &StatementDescription,
    count: usize,
) -> Vec<Type> {
    (0..count
        .max(client_types.len())
        .max(described.parameters.len()))
        .map(|i| {
            client_types
                .get(i)
                .cloned()
                .flatten()
                .filter(|t| *t != Type::UNKNOWN)
                .or_else(|| {
                    described
                        .parameters
                        .get(i)
                        .cloned()
                        .flatten()
                        .map(|dt| encode::pg_type(&arrow::datatypes::Field::new("p", dt, true)))
                })
                .unwrap_or(Type::TEXT)
        })
        .collect()
}

/// Decodes the bound parameter values into one-row arrays of the inferred types.
fn decode_parameters(
    portal: &Portal<Arc<Parsed>>,
    types: &[Type],
    described: &StatementDescription,
) -> Result<Vec<ArrayRef>, Error> {
    let mut out = Vec::with_capacity(portal.parameters.len());
    for (i, value) in portal.parameters.iter().enumerate() {
        let pg = types.get(i).cloned().unwrap_or(Type::TEXT);
        let wire_type = encode::arrow_type(&pg);
        let array = match value {
            None => arrow::array::new_null_array(&wire_type, 1),
            Some(bytes) if portal.parameter_format.is_binary(i) => {
                encode::decode_binary_param(&pg, bytes)?
            }
            Some(bytes) => {
                let text = std::str::from_utf8(bytes).map_err(|_| {
                    Error::new(
                        SqlState::CHARACTER_NOT_IN_REPERTOIRE,
                        "parameter is not valid UTF-8",
                    )
                })?;
                eddy_engine::text_to_array(std::iter::once(Some(text)), &wire_type, 1)?
            }
        };
        let target: Option<DataType> = described.parameters.get(i).cloned().flatten();
        let array = match target {
            Some(t) if &t != array.data_type() => {
                arrow::compute::cast(&array, &t).map_err(|e| {
                    Error::new(
                        SqlState::DATATYPE_MISMATCH,
                        format!("parameter ${} cannot be used as {t}: {e}", i + 1),
                    )
                })?
            }
            _ => array,
        };
        out.push(array);
    }
    Ok(out)
}

#[async_trait]
impl ExtendedQueryHandler for Conn {
    type Statement = Arc<Parsed>;
    type QueryParser = EddyQueryParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        Arc::clone(&self.parser)
    }

    /// Parses and, for a query or DML statement, plans it, so that an error in it (an unknown
    /// table, column or function) arrives at Parse, as PostgreSQL reports it there.
    async fn on_parse<C>(&self, client: &mut C, message: Parse) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let Some(stored) = StoredStatement::parse(client, &message, self.query_parser()).await?
        else {
            let name = message.name.as_deref().unwrap_or(pgwire::api::DEFAULT_NAME);
            client.portal_store().put_empty_statement(name);
            return client
                .send(PgWireBackendMessage::ParseComplete(ParseComplete::new()))
                .await
                .map_err(Into::into);
        };
        let mut stored = stored;
        if let Some(typed) = type_bare_parameters(&stored.statement, &stored.parameter_types) {
            stored.statement = Arc::new(typed);
        }
        if analyzed_at_parse(&stored.statement.statement) {
            let slot = slot(client)?;
            let described = slot
                .session
                .lock()
                .await
                .describe(&stored.statement.statement)
                .await;
            if let Err(e) = described {
                log_failure(&stored.statement.text, &e);
                return Err(to_pgwire(e));
            }
        }
        client.portal_store().put_statement(Arc::new(stored));
        client
            .send(PgWireBackendMessage::ParseComplete(ParseComplete::new()))
            .await
            .map_err(Into::into)
    }

    async fn on_describe<C>(&self, client: &mut C, message: Describe) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // A cursor DECLAREd in SQL is a portal too, as in PostgreSQL.
        if message.target_type == TARGET_TYPE_BYTE_PORTAL
            && let Some(name) = message.name.as_deref()
            && client.portal_store().get_portal(name).is_none()
        {
            let slot = slot(client)?;
            let schema = slot.session.lock().await.open_cursor(name);
            if let Some(schema) = schema {
                let fields = encode::field_infos(&schema, |_| FieldFormat::Text);
                return pgwire::api::query::send_describe_response(
                    client,
                    &DescribePortalResponse::new(fields),
                )
                .await;
            }
        }
        self._on_describe(client, message).await
    }

    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let result = self._on_execute(client, message).await;
        // The session knows the transaction's state (ROLLBACK TO a savepoint ends the failed
        // state, which pgwire cannot tell from the response).
        if let Ok(slot) = slot(client) {
            let status = transaction_status(&*slot.session.lock().await);
            client.set_transaction_status(status);
        }
        result
    }

    async fn do_describe_statement<C>(
        &self,
        client: &mut C,
        target: &StoredStatement<Self::Statement>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let slot = slot(client)?;
        let described = slot
            .session
            .lock()
            .await
            .describe(&target.statement.statement)
            .await
            .map_err(to_pgwire)?;
        let types = parameter_types(&target.parameter_types, &described, 0);
        let fields = described
            .columns
            .as_ref()
            .map(|s| encode::field_infos(s, |_| FieldFormat::Text))
            .unwrap_or_default();
        Ok(DescribeStatementResponse::new(types, fields))
    }

    async fn do_describe_portal<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let slot = slot(client)?;
        let described = slot
            .session
            .lock()
            .await
            .describe(&portal.statement.statement.statement)
            .await
            .map_err(to_pgwire)?;
        let format = portal.result_column_format.clone();
        let fields = described
            .columns
            .as_ref()
            .map(|s| encode::field_infos(s, |i| format.format_for(i)))
            .unwrap_or_default();
        Ok(DescribePortalResponse::new(fields))
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let slot = slot(client)?;
        let parsed = Arc::clone(&portal.statement.statement);
        match &parsed.statement {
            eddy_engine::Statement::CopySubscribe(subscribe) => {
                // COPY (SUBSCRIBE ...) TO STDOUT streams here; pgwire sends the final CommandComplete.
                let rows = stream_subscription(client, &slot, subscribe, Streaming::Copy, false)
                    .await
                    .map_err(to_pgwire)?;
                return Ok(Response::Execution(Tag::new("COPY").with_rows(rows)));
            }
            eddy_engine::Statement::Subscribe(subscribe) => {
                // Describe sent the row description; rows stream until the view is dropped.
                let columns = slot
                    .session
                    .lock()
                    .await
                    .describe(&parsed.statement)
                    .await
                    .map_err(to_pgwire)?
                    .columns;
                let count = columns.map_or(0, |c| c.fields().len());
                let formats = (0..count)
                    .map(|i| portal.result_column_format.format_for(i))
                    .collect();
                let mode = Streaming::Rows {
                    describe: false,
                    formats,
                };
                let rows = stream_subscription(client, &slot, subscribe, mode, false)
                    .await
                    .map_err(to_pgwire)?;
                return Ok(Response::Execution(Tag::new("SUBSCRIBE").with_rows(rows)));
            }
            _ => {}
        }
        let outcome = with_notices(client, &slot, async {
            let mut session = slot.session.lock().await;
            let prepared = if portal.parameters.is_empty() {
                Ok(Vec::new())
            } else {
                match session.describe(&parsed.statement).await {
                    Ok(described) => {
                        let types = parameter_types(
                            &portal.statement.parameter_types,
                            &described,
                            portal.parameters.len(),
                        );
                        decode_parameters(portal, &types, &described)
                    }
                    Err(e) => Err(e),
                }
            };
            match prepared {
                Ok(params) => run_guarded(&mut session, &parsed, &params).await,
                Err(e) => {
                    session.fail_transaction();
                    Err(e)
                }
            }
        })
        .await?;
        match outcome {
            Ok(outcome) => {
                let format = portal.result_column_format.clone();
                respond(client, &slot, outcome, &|i| format.format_for(i)).await
            }
            Err(e) => Err(to_pgwire(e)),
        }
    }
}
