//! An OTLP/HTTP receiver of spans, as a collector's `otlp` receiver is on port 4318: it
//! takes `POST /v1/traces` (protobuf `ExportTraceServiceRequest`, decoded with the
//! OpenTelemetry project's own message definitions) and keeps every span it is sent, for a
//! test to read. No collector binary can be installed on these machines; this is the
//! protocol's receiving side, not a stand-in for our own code.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use prost::Message;

/// One span as received, its ids in lowercase hex (as in a `traceparent`).
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// The `service.name` of the process that sent it.
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for the root of a trace.
    pub parent_span_id: String,
    /// Its string and integer attributes, as text.
    pub attributes: HashMap<String, String>,
    /// The (trace id, span id) of every span it links to.
    pub links: Vec<(String, String)>,
}

pub struct OtlpReceiver {
    /// What to configure as `tracing.otlp_endpoint`.
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    stop: tokio_util::sync::CancellationToken,
}

impl OtlpReceiver {
    /// Listens on a free port of 127.0.0.1.
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0").await
    }

    /// Listens on `address` (`127.0.0.1:4318`, the port collectors take OTLP/HTTP on).
    pub async fn start_on(address: &str) -> Self {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .unwrap_or_else(|e| panic!("cannot listen on {address}: {e}"));
        let endpoint = format!("http://{}", listener.local_addr().expect("bound"));
        let spans = Arc::new(Mutex::new(Vec::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans.clone());
        let stopped = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(stopped.cancelled_owned())
                .await;
        });
        Self {
            endpoint,
            spans,
            stop,
        }
    }

    /// Every span of trace `trace_id` received so far.
    pub fn trace(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        self.spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect()
    }

    /// How many spans were received so far.
    pub fn count(&self) -> usize {
        self.spans.lock().map(|s| s.len()).unwrap_or_default()
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits (at most `timeout`) until the spans received satisfy `done`; returns them.
    /// On timeout, panics with what was received (service, name, trace id), to read.
    pub async fn until(
        &self,
        timeout: Duration,
        what: &str,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            if tokio::time::Instant::now() >= deadline {
                let seen: Vec<String> = spans
                    .iter()
                    .map(|s| format!("{} {} {}", s.service, s.name, s.trace_id))
                    .collect();
                panic!("timed out after {timeout:?} waiting for {what}; received: {seen:#?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn receive(
    State(spans): State<Arc<Mutex<Vec<ReceivedSpan>>>>,
    body: Bytes,
) -> impl IntoResponse {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, Vec::new()).into_response();
    };
    let mut received = Vec::new();
    for resource_spans in request.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|r| attributes(&r.attributes).remove("service.name"))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: attributes(&span.attributes),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                });
            }
        }
    }
    if let Ok(mut spans) = spans.lock() {
        spans.extend(received);
    }
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    ([(header::CONTENT_TYPE, "application/x-protobuf")], answer).into_response()
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .filter_map(|kv| {
            let value = match kv.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(s) => s.clone(),
                any_value::Value::IntValue(i) => i.to_string(),
                any_value::Value::BoolValue(b) => b.to_string(),
                any_value::Value::DoubleValue(d) => d.to_string(),
                _ => return None,
            };
            Some((kv.key.clone(), value))
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
