//! Accepting connections and serving HTTP/1.1 on them: what `axum::serve` does, with the
//! connection settings this service needs, which `axum::serve` does not let a caller set.
//!
//! What a connection holds was measured with heaptrack on a core built with the
//! `system-allocator` feature, 1,000 connections sending new flash reservations in closed
//! loop (`loadtest/heap-core.sh`):
//!
//! - The router is made into a service once, and every connection shares it. Served as a
//!   plain `Router`, axum rebuilt it for each connection it accepted (its `with_state`: a
//!   table of the routes and a copy of every route's boxed handler stack), 15 of the 49 MiB
//!   of heap.
//! - `half_close`: by default hyper reads on while a request is in flight, to notice a
//!   client that hung up. That read needs room in the connection's read buffer, whose
//!   first 8 KiB the request's own head still shares, so every busy connection held a
//!   second 8 KiB buffer (16 KiB of read buffer per busy connection, 15.6 MiB). With
//!   `half_close` hyper reads nothing more until the answer is written, and the next
//!   request reuses the buffer. A client that hangs up once its request is read is then
//!   noticed when its answer is written, so its handler runs to its end: no client's
//!   hang-up leaves a reservation between the gate and the ledger (a dying process still
//!   can; the reconciliation is for that). One that hangs up while its body is still
//!   being read fails before the handler has done anything.
//!
//! HTTP/2 is not served: neither the edge nor any client here speaks it to a core.

use std::pin::pin;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Serves `router` on `listener` until `shutdown` is cancelled; then stops accepting, lets
/// each connection finish the request it is on (answered with `Connection: close`), and
/// returns once every connection is closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    // Every route made into a service now (what `Router::into_make_service` does), not
    // per connection; a clone of the result shares it.
    let router: Router = router.with_state(());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.half_close(true);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        if worth_a_rest(&e) {
                            tokio::select! {
                                () = tokio::time::sleep(ACCEPT_REST) => {}
                                () = shutdown.cancelled() => break,
                            }
                        }
                        continue;
                    }
                };
                let connection = http.serve_connection(
                    TokioIo::new(stream),
                    TowerToHyperService::new(router.clone()),
                );
                let shutdown = shutdown.clone();
                connections.spawn(async move {
                    let mut connection = pin!(connection);
                    let served = tokio::select! {
                        served = connection.as_mut() => served,
                        () = shutdown.cancelled() => {
                            connection.as_mut().graceful_shutdown();
                            connection.await
                        }
                    };
                    if let Err(e) = served {
                        tracing::trace!(error = %e, "connection ended with an error");
                    }
                });
            }
            // Finished connections are collected as they end, not kept until shutdown.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = shutdown.cancelled() => break,
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// How long the listener rests after a failed `accept` that is not one connection's own.
const ACCEPT_REST: Duration = Duration::from_secs(1);

/// A failed `accept`: a connection that died in the backlog is nobody's problem; anything
/// else (out of file descriptors) is logged and the listener rests [`ACCEPT_REST`] (cut
/// short by a shutdown), as hyper's and axum's servers do, instead of spinning on the same
/// error.
fn worth_a_rest(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return false;
    }
    tracing::error!(error = %e, "cannot accept a connection");
    true
}
