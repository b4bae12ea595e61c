//! The baseline of the edge's reject path: a bare HTTP server that answers every request
//! with the same 409 OUT_OF_STOCK body, with a Content-Length and keep-alive. Run as a
//! separate process (`voucher-bench bare-409 ADDR`) so it does not share the generator's
//! runtime.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;

pub const BODY: &str = r#"{"error":"OUT_OF_STOCK","message":"the voucher has no uses left"}"#;

pub async fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(|_req| async {
                let mut resp = Response::new(Full::new(Bytes::from_static(BODY.as_bytes())));
                *resp.status_mut() = StatusCode::CONFLICT;
                resp.headers_mut().insert(
                    "content-type",
                    hyper::header::HeaderValue::from_static("application/json"),
                );
                Ok::<_, Infallible>(resp)
            });
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
