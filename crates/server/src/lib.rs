//! The PostgreSQL wire protocol front of Eddy (pgwire): sessions, type encoding and SQLSTATE
//! errors.
//!
//! Entry point: [`serve`]. Each connection gets an engine [`eddy_engine::Session`]; statements
//! run through it and their outcomes are encoded here. A panic while running a statement is
//! caught at this boundary and reported as XX000; the connection and the server go on.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod copy_in;
mod copy_out;
mod encode;
mod handler;
mod http;

use std::future::Future;
use std::sync::Arc;

use eddy_engine::Engine;
use tokio::net::TcpListener;

pub use handler::Handlers;
pub use http::serve_http;

/// Accepts connections until `shutdown` resolves.
pub async fn serve(
    engine: Arc<Engine>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let handlers = Arc::new(Handlers::new(engine));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            accepted = listener.accept() => {
                let (socket, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                let _ = socket.set_nodelay(true);
                let handlers = Arc::clone(&handlers);
                tokio::spawn(async move {
                    tracing::debug!(%peer, "connection opened");
                    if let Err(e) = pgwire::tokio::process_socket(socket, None, handlers).await {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
        }
    }
}
