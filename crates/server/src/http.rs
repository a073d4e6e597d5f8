//! The HTTP front: `POST /ingest/<table>`, the producer side of Eddy's log beside INSERT and
//! COPY. A body holds one record per line — JSON, or CSV with `Content-Type: text/csv` (a
//! table declared with `FORMAT ... ENCODE ...` decodes its own format). The answer comes once
//! the accepted records are durable: `{"accepted": n, "rejected": [{"line": i, "error": "..."}]}`;
//! rejected lines went to `eddy_dead_letters` (or were skipped, per the table's `on_error`).

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use eddy_common::{Error, SqlState};
use eddy_engine::Engine;
use tokio::net::TcpListener;

/// Serves HTTP until `shutdown` resolves.
pub async fn serve_http(
    engine: Arc<Engine>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/ingest/{table}", post(ingest))
        .layer(DefaultBodyLimit::max(
            eddy_common::limits::INGEST_BODY_BYTES_MAX,
        ))
        .with_state(engine);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn ingest(
    State(engine): State<Arc<Engine>>,
    Path(table): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let csv = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().to_ascii_lowercase().starts_with("text/csv"));
    match engine.ingest_body(&table, &body, csv).await {
        Ok(report) => {
            let rejected: Vec<String> = report
                .rejected
                .iter()
                .map(|(i, why)| {
                    format!(
                        "{{\"line\":{},\"error\":{}}}",
                        i + 1,
                        eddy_common::json_string(why)
                    )
                })
                .collect();
            let body = format!(
                "{{\"accepted\":{},\"rejected\":[{}]}}\n",
                report.accepted,
                rejected.join(",")
            );
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response()
        }
        Err(e) => error_response(&e),
    }
}

fn error_response(e: &Error) -> Response {
    let status = if e.state == SqlState::UNDEFINED_TABLE {
        StatusCode::NOT_FOUND
    } else if e.state.is_data_exception() || e.state == SqlState::FEATURE_NOT_SUPPORTED {
        StatusCode::BAD_REQUEST
    } else if e.state == SqlState::ADMIN_SHUTDOWN || e.state == SqlState::INSUFFICIENT_RESOURCES {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    let body = format!(
        "{{\"error\":{},\"sqlstate\":\"{}\"}}\n",
        eddy_common::json_string(&e.message),
        e.state.code()
    );
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}
