//! The framework's own ceiling on the reject path: a Pingora `ProxyHttp` whose
//! `request_filter` reads the request body and answers the same 409 as the edge's sold-out
//! flag, and does nothing else (no routing, no flags, no metrics, no log line). Built with
//! the edge's allocator (mimalloc) and run with its thread count, so that the benchmark's
//! rows edge / minimal Pingora / bare server / nginx say which part of the edge's cost is
//! Pingora and which is ours.
//!
//! Given an UPSTREAM (host:port), it forwards every request there instead, and does nothing
//! else either: the framework's own cost of a forwarded request, beside the edge's.
//!
//!   minimal-pingora ADDR [THREADS] [UPSTREAM]

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::prelude::{HttpPeer, ProxyHttp, Session};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::{Error, ErrorType, Result};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BODY: &[u8] = br#"{"error":"OUT_OF_STOCK","message":"the voucher has no uses left"}"#;

/// Answers every request itself, or forwards every one to `upstream`.
struct Reject {
    upstream: Option<String>,
}

#[async_trait]
impl ProxyHttp for Reject {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        if self.upstream.is_some() {
            return Ok(false);
        }
        while session.read_request_body().await?.is_some() {}
        let mut header = ResponseHeader::build(409, Some(3))?;
        header.insert_header("content-type", "application/json")?;
        header.insert_header("content-length", BODY.len().to_string())?;
        header.insert_header("x-served-by", "edge")?;
        session.set_keepalive(Some(60));
        session
            .write_response_header(Box::new(header), false)
            .await?;
        session
            .write_response_body(Some(Bytes::from_static(BODY)), true)
            .await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        match &self.upstream {
            Some(upstream) => Ok(Box::new(HttpPeer::new(
                upstream.as_str(),
                false,
                String::new(),
            ))),
            None => Err(Error::explain(ErrorType::HTTPStatus(503), "never forwards")),
        }
    }
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: minimal-pingora ADDR [THREADS] [UPSTREAM]"))?;
    let threads = args.next().map_or(Ok(2), |t| t.parse())?;
    let upstream = args.next();
    let conf = ServerConf {
        threads,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut proxy = pingora::proxy::http_proxy_service(&server.configuration, Reject { upstream });
    proxy.add_tcp(&addr);
    server.add_service(proxy);
    server.run_forever()
}
