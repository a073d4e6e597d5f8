//! pgwire handlers: startup (trust auth, parameter status), simple query, COPY FROM STDIN,
//! and cancel requests; the extended query protocol is in `extended.rs`, SUBSCRIBE's streaming
//! in `subscribe.rs`.

use std::fmt::Debug;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use arrow::array::ArrayRef;
use arrow::datatypes::DataType;
use async_trait::async_trait;
use bytes::BytesMut;
use eddy_common::{Error, SqlState};
use eddy_engine::{
    CopyIn, Engine, Outcome, Parsed, Session, StatementDescription, parse_statements,
};
use futures::{FutureExt, Sink, SinkExt, stream};
use pgwire::api::auth::{
    ServerParameterProvider, StartupHandler, finish_authentication, protocol_negotiation,
    save_startup_parameters_to_metadata,
};
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    CopyResponse, DescribePortalResponse, DescribeStatementResponse, FieldFormat, QueryResponse,
    Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionHandle, ConnectionManager, PgWireConnectionState,
    PgWireServerHandlers, Type,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::extendedquery::{
    Describe, Execute, Parse, ParseComplete, TARGET_TYPE_BYTE_PORTAL,
};
use pgwire::messages::response::NoticeResponse;
use pgwire::messages::response::TransactionStatus;
use pgwire::messages::simplequery::Query;
use pgwire::messages::startup::{ParameterStatus, SecretKey};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use tokio::sync::Mutex;
use tracing::Instrument;

use crate::encode;

#[path = "extended.rs"]
mod extended;
#[path = "subscribe.rs"]
mod subscribe;
pub use extended::EddyQueryParser;
use subscribe::{Streaming, stream_subscription};

/// A connection's engine session, kept in pgwire's per-connection extensions.
struct SessionSlot {
    session: Mutex<Session>,
    /// A COPY FROM STDIN in progress and the data received so far.
    copy: Mutex<Option<(CopyIn, Vec<u8>)>>,
    /// Values of the reported parameters as the client last heard them (ParameterStatus).
    reported: Mutex<Vec<(&'static str, String)>>,
    /// NOTICEs the session raises while a statement runs (backfill progress).
    notices: Mutex<tokio::sync::mpsc::UnboundedReceiver<String>>,
}

/// Session variables PostgreSQL reports to the client whenever they change (GUC_REPORT).
const REPORTED_VARIABLES: [&str; 5] = [
    "application_name",
    "client_encoding",
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
];

fn reported_values(session: &Session) -> Vec<(&'static str, String)> {
    REPORTED_VARIABLES
        .iter()
        .filter_map(|name| session.variables().get(name).ok())
        .collect()
}

pub struct Handlers {
    engine: Arc<Engine>,
    connections: Arc<ConnectionManager>,
    next_pid: AtomicI32,
    parser: Arc<EddyQueryParser>,
    /// Client connections past their startup, not yet closed.
    open: Arc<AtomicUsize>,
}

/// One of the server's `max_connections`, held by a connection until it closes (in its
/// session extensions, dropped with it).
struct ConnectionSlot(Arc<AtomicUsize>);

impl ConnectionSlot {
    /// A slot, unless `max` connections hold one.
    fn take(open: &Arc<AtomicUsize>, max: usize) -> Option<ConnectionSlot> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .ok()
        .map(|_| ConnectionSlot(Arc::clone(open)))
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Handlers {
    pub fn new(engine: Arc<Engine>) -> Self {
        Handlers {
            engine,
            connections: Arc::new(ConnectionManager::new()),
            next_pid: AtomicI32::new(std::process::id() as i32 % 100_000 * 1000 + 1),
            parser: Arc::new(EddyQueryParser),
            open: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        Arc::new(self.clone_ref())
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        Arc::new(self.clone_ref())
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        Arc::new(self.clone_ref())
    }

    fn copy_handler(&self) -> Arc<impl CopyHandler> {
        Arc::new(self.clone_ref())
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        Arc::new(DefaultCancelHandler::new(Arc::clone(&self.connections)))
    }
}

/// The per-connection view of the handlers (pgwire asks for them once per connection).
#[derive(Clone)]
pub struct Conn {
    engine: Arc<Engine>,
    connections: Arc<ConnectionManager>,
    pid: i32,
    parser: Arc<EddyQueryParser>,
    open: Arc<AtomicUsize>,
}

impl Handlers {
    fn clone_ref(&self) -> Conn {
        Conn {
            engine: Arc::clone(&self.engine),
            connections: Arc::clone(&self.connections),
            pid: self.next_pid.fetch_add(1, Ordering::Relaxed),
            parser: Arc::clone(&self.parser),
            open: Arc::clone(&self.open),
        }
    }
}

/// The settings in a startup packet's `options` (`-c a=b -c x=y`, `--a=b`; `\ ` escapes a space).
fn command_line_settings(text: &str) -> Vec<(String, String)> {
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.extend(chars.next()),
            c if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    let mut out = Vec::new();
    let mut words = words.into_iter();
    while let Some(w) = words.next() {
        let setting = match w.as_str() {
            "-c" => words.next(),
            other => other
                .strip_prefix("--")
                .or_else(|| other.strip_prefix("-c"))
                .map(str::to_owned),
        };
        if let Some((name, value)) = setting.as_deref().and_then(|s| s.split_once('=')) {
            out.push((name.replace('-', "_"), value.to_owned()));
        }
    }
    out
}

pub(crate) fn to_pgwire(err: Error) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(err)))
}

fn error_info(err: Error) -> ErrorInfo {
    let mut info = ErrorInfo::new("ERROR".to_owned(), err.state.code().to_owned(), err.message);
    info.position = err.position.map(|p| p.to_string());
    info.detail = err.detail;
    info.hint = err.hint;
    info
}

fn notice(severity: &str, state: SqlState, message: String) -> PgWireBackendMessage {
    PgWireBackendMessage::NoticeResponse(NoticeResponse::from(ErrorInfo::new(
        severity.to_owned(),
        state.code().to_owned(),
        message,
    )))
}

fn slot<C: ClientInfo>(client: &C) -> PgWireResult<Arc<SessionSlot>> {
    client
        .session_extensions()
        .get::<SessionSlot>()
        .ok_or_else(|| to_pgwire(Error::internal("connection has no session")))
}

/// The ParameterStatus values sent at start-up: fixed ones plus the session's reported variables.
struct EddyParameters {
    session: Vec<(&'static str, String)>,
}

impl ServerParameterProvider for EddyParameters {
    fn server_parameters<C: ClientInfo>(
        &self,
        client: &C,
    ) -> Option<std::collections::HashMap<String, String>> {
        let mut p = std::collections::HashMap::new();
        p.insert(
            "server_version".into(),
            format!(
                "{} (Eddy {})",
                eddy_engine::PG_VERSION,
                eddy_engine::EDDY_VERSION
            ),
        );
        p.insert("server_encoding".into(), "UTF8".into());
        p.insert("client_encoding".into(), "UTF8".into());
        p.insert("DateStyle".into(), "ISO, MDY".into());
        p.insert("IntervalStyle".into(), "postgres".into());
        p.insert("TimeZone".into(), "UTC".into());
        p.insert("integer_datetimes".into(), "on".into());
        p.insert("standard_conforming_strings".into(), "on".into());
        p.insert("is_superuser".into(), "on".into());
        p.insert("default_transaction_read_only".into(), "off".into());
        p.insert("in_hot_standby".into(), "off".into());
        p.insert("search_path".into(), "\"$user\", public".into());
        p.insert(
            "application_name".into(),
            client
                .metadata()
                .get("application_name")
                .cloned()
                .unwrap_or_default(),
        );
        if let Some(user) = client.metadata().get("user") {
            p.insert("session_authorization".into(), user.clone());
        }
        for (name, value) in &self.session {
            p.insert((*name).to_owned(), value.clone());
        }
        Some(p)
    }
}

#[async_trait]
impl StartupHandler for Conn {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let PgWireFrontendMessage::Startup(ref startup) = message else {
            return Ok(());
        };
        // As PostgreSQL: FATAL 53300 once `max_connections` clients are connected.
        let Some(slot) = ConnectionSlot::take(&self.open, self.engine.max_connections()) else {
            return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "FATAL".to_owned(),
                SqlState::TOO_MANY_CONNECTIONS.code().to_owned(),
                "sorry, too many clients already".to_owned(),
            ))));
        };
        client.session_extensions().insert(slot);
        protocol_negotiation(client, startup).await?;
        save_startup_parameters_to_metadata(client, startup);
        let secret = SecretKey::I32(rand_secret(self.pid));
        client.set_pid_and_secret_key(self.pid, secret.clone());
        let (handle, guard) = self.connections.register(self.pid, secret);
        client
            .session_extensions()
            .insert::<Arc<ConnectionHandle>>(handle);
        client.session_extensions().insert(guard);
        let user = client
            .metadata()
            .get("user")
            .cloned()
            .unwrap_or_else(|| "eddy".into());
        let database = client
            .metadata()
            .get("database")
            .cloned()
            .unwrap_or_else(|| user.clone());
        let info = eddy_engine::SessionInfo {
            database,
            user,
            version: eddy_engine::version_string(),
            backend_pid: self.pid,
        };
        let mut session = Session::new(Arc::clone(&self.engine), &info).map_err(to_pgwire)?;
        // Drivers pass settings in the startup packet (JDBC: TimeZone, extra_float_digits).
        let mut options: Vec<(String, String)> = client
            .metadata()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // libpq's `options` (PGOPTIONS): `-c name=value` and `--name=value` settings.
        if let Some((_, text)) = options.iter().find(|(k, _)| k == "options") {
            let settings = command_line_settings(text);
            options.extend(settings);
        }
        for (name, value) in options {
            if !matches!(
                name.as_str(),
                "user" | "database" | "options" | "replication"
            ) && let Err(e) = session.set_variable(&name, &value)
            {
                tracing::debug!(parameter = %name, error = %e, "ignoring a startup parameter");
            }
        }
        let reported = reported_values(&session);
        let parameters = EddyParameters {
            session: reported.clone(),
        };
        let (notice_sink, notices) = tokio::sync::mpsc::unbounded_channel();
        session.set_notice_sink(notice_sink);
        client.session_extensions().insert(SessionSlot {
            session: Mutex::new(session),
            copy: Mutex::new(None),
            reported: Mutex::new(reported),
            notices: Mutex::new(notices),
        });
        finish_authentication(client, &parameters).await?;
        Ok(())
    }
}

fn rand_secret(pid: i32) -> i32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos as i32) ^ pid.rotate_left(13)
}

/// Runs one statement, turning a panic into XX000 so the connection and server survive.
async fn run_guarded(
    session: &mut Session,
    parsed: &Parsed,
    params: &[ArrayRef],
) -> Result<Outcome, Error> {
    let span = tracing::info_span!("statement", sql = %truncate(&parsed.text, 200));
    let result = match AssertUnwindSafe(session.execute(&parsed.statement, params))
        .catch_unwind()
        .instrument(span)
        .await
    {
        Ok(result) => result,
        Err(panic) => {
            let error = eddy_common::panic::panic_error("statement", panic.as_ref());
            tracing::error!(error = %error, "statement panicked");
            session.fail_transaction();
            Err(error)
        }
    };
    if let Err(e) = &result {
        log_failure(&parsed.text, e);
    }
    result
}

/// The server's log says why a client's statement failed (at WARN, with its SQLSTATE).
fn log_failure(sql: &str, error: &Error) {
    tracing::warn!(sqlstate = %error.state, sql = %truncate(sql, 200), error = %error.message, "statement failed");
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// Turns an outcome into a pgwire response (notices are sent right away).
async fn respond<C>(
    client: &mut C,
    slot: &SessionSlot,
    outcome: Outcome,
    formats: &(dyn Fn(usize) -> FieldFormat + Sync),
) -> PgWireResult<Response>
where
    C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    Ok(match outcome {
        Outcome::Rows { schema, batches } => {
            let fields = Arc::new(encode::field_infos(&schema, formats));
            let field_formats: Vec<FieldFormat> = fields.iter().map(|f| f.format()).collect();
            let tz = slot.session.lock().await.variables().time_zone();
            let mut rows = Vec::new();
            for batch in &batches {
                rows.extend(
                    encode::encode_batch(batch, &field_formats, tz)
                        .map_err(to_pgwire)?
                        .into_iter()
                        .map(Ok),
                );
            }
            Response::Query(QueryResponse::new(fields, stream::iter(rows)))
        }
        Outcome::TaggedRows {
            tag,
            schema,
            batches,
            ..
        } => {
            let fields = Arc::new(encode::field_infos(&schema, formats));
            let field_formats: Vec<FieldFormat> = fields.iter().map(|f| f.format()).collect();
            let tz = slot.session.lock().await.variables().time_zone();
            let mut rows = Vec::new();
            for batch in &batches {
                rows.extend(
                    encode::encode_batch(batch, &field_formats, tz)
                        .map_err(to_pgwire)?
                        .into_iter()
                        .map(Ok),
                );
            }
            let mut response = QueryResponse::new(fields, stream::iter(rows));
            response.set_command_tag(tag);
            Response::Query(response)
        }
        Outcome::Command { tag, rows } => {
            if tag == "SET" {
                report_changed_parameters(client, slot).await?;
            }
            let t = Tag::new(tag);
            let t = if tag == "INSERT" { t.with_oid(0) } else { t };
            Response::Execution(match rows {
                Some(n) => t.with_rows(n),
                None => t,
            })
        }
        Outcome::CopyOut {
            schema,
            batches,
            format,
        } => {
            let tz = slot.session.lock().await.variables().time_zone();
            let rows = crate::copy_out::send(client, &schema, &batches, &format, tz).await?;
            Response::Execution(Tag::new("COPY").with_rows(rows))
        }
        Outcome::TransactionStart => Response::TransactionStart(Tag::new("BEGIN")),
        Outcome::TransactionEnd { tag } => Response::TransactionEnd(Tag::new(tag)),
        Outcome::CopyIn(copy) => {
            let columns = copy.columns.len();
            let format = i8::from(copy.format == eddy_engine::CopyFormat::Binary);
            *slot.copy.lock().await = Some((copy, Vec::new()));
            Response::CopyIn(CopyResponse::new(format, columns, stream::empty()))
        }
        Outcome::Warning {
            state,
            message,
            then,
        } => {
            client.send(notice("WARNING", state, message)).await?;
            Box::pin(respond(client, slot, *then, formats)).await?
        }
        Outcome::Notice {
            state,
            message,
            detail,
            then,
        } => {
            let mut info = ErrorInfo::new("NOTICE".to_owned(), state.code().to_owned(), message);
            info.detail = detail;
            client
                .send(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(
                    info,
                )))
                .await?;
            Box::pin(respond(client, slot, *then, formats)).await?
        }
    })
}

/// Sends ParameterStatus for every reported variable a SET changed, as PostgreSQL does.
async fn report_changed_parameters<C>(client: &mut C, slot: &SessionSlot) -> PgWireResult<()>
where
    C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let now = reported_values(&*slot.session.lock().await);
    let changed: Vec<(&'static str, String)> = {
        let mut last = slot.reported.lock().await;
        let changed = now.iter().filter(|v| !last.contains(v)).cloned().collect();
        *last = now;
        changed
    };
    for (name, value) in changed {
        client
            .send(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(
                name.to_owned(),
                value,
            )))
            .await?;
    }
    Ok(())
}

/// The transaction state ReadyForQuery reports.
fn transaction_status(session: &Session) -> TransactionStatus {
    match (session.in_transaction(), session.transaction_failed()) {
        (false, _) => TransactionStatus::Idle,
        (true, false) => TransactionStatus::Transaction,
        (true, true) => TransactionStatus::Error,
    }
}

#[async_trait]
impl SimpleQueryHandler for Conn {
    async fn on_query<C>(&self, client: &mut C, query: Query) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // pgwire derives the status from the responses, starting from the last one: start it
        // from the session's (a failed transaction refuses every statement but COMMIT, ROLLBACK
        // and ROLLBACK TO, so it stays failed unless one of those succeeds).
        if let Ok(slot) = slot(client) {
            let status = match transaction_status(&*slot.session.lock().await) {
                TransactionStatus::Error if !query.query.trim().is_empty() => {
                    TransactionStatus::Transaction
                }
                status => status,
            };
            client.set_transaction_status(status);
        }
        self._on_query(client, query).await
    }

    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let slot = slot(client)?;
        let statements = match parse_statements(query) {
            Ok(s) => s,
            Err(e) => {
                log_failure(query, &e);
                slot.session.lock().await.fail_transaction();
                return Err(to_pgwire(e));
            }
        };
        let mut responses = Vec::with_capacity(statements.len());
        for parsed in &statements {
            let streaming = match &parsed.statement {
                eddy_engine::Statement::Subscribe(s) => Some((s, false)),
                eddy_engine::Statement::CopySubscribe(s) => Some((s, true)),
                _ => None,
            };
            if let Some((subscribe, as_copy)) = streaming {
                // Earlier statements' results must reach the client before the stream starts.
                for response in responses.drain(..) {
                    send_response(client, response).await?;
                }
                let mode = if as_copy {
                    Streaming::Copy
                } else {
                    Streaming::Rows {
                        describe: true,
                        formats: Vec::new(),
                    }
                };
                if let Err(e) = stream_subscription(client, &slot, subscribe, mode, true).await {
                    responses.push(Response::Error(Box::new(error_info(e))));
                }
                break;
            }
            let outcome = with_notices(client, &slot, async {
                let mut session = slot.session.lock().await;
                run_guarded(&mut session, parsed, &[]).await
            })
            .await?;
            match outcome {
                Ok(outcome) => {
                    let is_copy = matches!(outcome, Outcome::CopyIn(_));
                    if matches!(outcome, Outcome::CopyOut { .. }) {
                        // The COPY data goes out now: earlier statements' results first.
                        for response in responses.drain(..) {
                            send_response(client, response).await?;
                        }
                    }
                    // A BINARY cursor's rows are binary in the simple protocol (Bind decides otherwise).
                    let format = if matches!(outcome, Outcome::TaggedRows { binary: true, .. }) {
                        FieldFormat::Binary
                    } else {
                        FieldFormat::Text
                    };
                    responses.push(respond(client, &slot, outcome, &|_| format).await?);
                    if is_copy {
                        break;
                    }
                }
                Err(e) => {
                    responses.push(Response::Error(Box::new(error_info(e))));
                    break;
                }
            }
        }
        Ok(responses)
    }
}

/// Runs a statement while forwarding the NOTICEs it raises to the client as they come.
async fn with_notices<C, T>(
    client: &mut C,
    slot: &SessionSlot,
    run: impl std::future::Future<Output = T>,
) -> PgWireResult<T>
where
    C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let mut notices = slot.notices.lock().await;
    tokio::pin!(run);
    let outcome = loop {
        tokio::select! {
            outcome = &mut run => break outcome,
            Some(message) = notices.recv() => {
                client.send(notice("NOTICE", SqlState::SUCCESSFUL_COMPLETION, message)).await?;
            }
        }
    };
    while let Ok(message) = notices.try_recv() {
        client
            .send(notice("NOTICE", SqlState::SUCCESSFUL_COMPLETION, message))
            .await?;
    }
    Ok(outcome)
}

/// Sends one response now (used before a streaming SUBSCRIBE takes over the connection).
async fn send_response<C>(client: &mut C, response: Response) -> PgWireResult<()>
where
    C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    match response {
        Response::Query(results) => {
            pgwire::api::query::send_query_response(client, results, true).await
        }
        Response::Execution(tag)
        | Response::TransactionStart(tag)
        | Response::TransactionEnd(tag) => {
            pgwire::api::query::send_execution_response(client, tag).await
        }
        Response::Error(e) => client
            .send(PgWireBackendMessage::ErrorResponse((*e).into()))
            .await
            .map_err(Into::into),
        _ => Ok(()),
    }
}

#[async_trait]
impl CopyHandler for Conn {
    async fn on_copy_data<C>(&self, client: &mut C, copy_data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let slot = slot(client)?;
        let mut copy = slot.copy.lock().await;
        match copy.as_mut() {
            Some((_, buffer)) => {
                if buffer.len() + copy_data.data.len()
                    > eddy_common::limits::STATEMENT_BYTES_MAX * 64
                {
                    *copy = None;
                    return Err(to_pgwire(Error::new(
                        SqlState::PROGRAM_LIMIT_EXCEEDED,
                        "COPY data exceeds 1 GiB; split it into several COPY statements",
                    )));
                }
                buffer.extend_from_slice(&copy_data.data);
                Ok(())
            }
            None => Err(to_pgwire(Error::new(
                SqlState::PROTOCOL_VIOLATION,
                "unexpected COPY data",
            ))),
        }
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let slot = slot(client)?;
        let Some((copy, data)) = slot.copy.lock().await.take() else {
            return Err(to_pgwire(Error::new(
                SqlState::PROTOCOL_VIOLATION,
                "COPY done without COPY in progress",
            )));
        };
        let result = {
            let mut session = slot.session.lock().await;
            let written = async {
                if copy.format == eddy_engine::CopyFormat::Binary {
                    match crate::copy_in::binary_rows(&copy, &data) {
                        Ok(rows) => session.copy_in_rows(&copy, rows).await,
                        Err(e) => {
                            session.fail_transaction();
                            Err(e)
                        }
                    }
                } else {
                    session.copy_in(&copy, &data).await
                }
            };
            match AssertUnwindSafe(written).catch_unwind().await {
                Ok(r) => r,
                Err(panic) => Err(eddy_common::panic::panic_error("COPY", panic.as_ref())),
            }
        };
        match result {
            Ok(Outcome::Command { rows, .. }) => {
                let tag = Tag::new("COPY").with_rows(rows.unwrap_or(0));
                client
                    .send(PgWireBackendMessage::CommandComplete(tag.into()))
                    .await?;
                Ok(())
            }
            Ok(_) => Err(to_pgwire(Error::internal(
                "COPY produced an unexpected outcome",
            ))),
            Err(e) => Err(to_pgwire(e)),
        }
    }

    async fn on_copy_fail<C>(&self, client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let Ok(slot) = slot(client) {
            slot.copy.lock().await.take();
            slot.session.lock().await.fail_transaction();
        }
        to_pgwire(Error::new(
            SqlState::QUERY_CANCELED,
            format!("COPY from stdin failed: {}", fail.message),
        ))
    }
}

#[allow(dead_code)]
fn _assert_state(_: PgWireConnectionState, _: BytesMut) {}
