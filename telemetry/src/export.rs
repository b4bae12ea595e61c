//! The span exporter: a batch of spans posted by OTLP/HTTP (protobuf) every
//! `export_interval`, from a thread of the SDK's own, with a client of its own.
//!
//! Only spans of the `voucher_*` crates are exported (at `debug` and above: the spans that
//! exist for traces alone are `debug`, so with tracing off the log filter, at `info`,
//! never makes them), and warnings and errors of those crates as events of their span.
//! Library spans (sqlx, hyper, librdkafka's bindings) stay out: they would multiply the
//! spans of a request and feed the exporter's own HTTP calls back into it.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use tracing::subscriber::Interest;
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::filter::dynamic_filter_fn;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::{Service, TraceSettings};

pub(crate) struct Exporter {
    provider: SdkTracerProvider,
    service: Service,
}

impl Exporter {
    /// Builds the exporter and its batch thread (nothing is sent until spans end).
    pub(crate) fn start(
        service: Service,
        endpoint: &str,
        settings: &TraceSettings,
    ) -> anyhow::Result<Self> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
            .with_timeout(settings.export_timeout)
            .build()?;
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(settings.queue_size)
            .with_scheduled_delay(settings.export_interval)
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batches)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                settings.sample_ratio,
            ))))
            .with_resource(resource(service))
            .build();
        Ok(Self { provider, service })
    }

    /// The `tracing` layer that turns the `voucher_*` crates' spans into OpenTelemetry's.
    pub(crate) fn layer<S>(&self) -> impl Layer<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let tracer = self.provider.tracer(self.service.name);
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // Each enter and exit of a span would read the clock twice: not needed for
            // spans whose start and end are what matters.
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_location(false)
            // Asked for every span and event of its callsites ("sometimes"), never cached
            // as "always": a per-layer filter's answer is kept in a thread-local between
            // `enabled` and the span's creation, and a `log::log_enabled!` check (sqlx
            // makes them) asks `enabled` and creates nothing, leaving this layer's "no" for
            // the thread's next span. With "always" that span's callsite skips `enabled`
            // and inherits the stale "no": one request span in two or three went
            // unexported and its children became roots (`proxy/tests/edge/traces.rs`).
            .with_filter(
                dynamic_filter_fn(|metadata, _| exported(metadata)).with_callsite_filter(
                    |metadata| {
                        if exported(metadata) {
                            Interest::sometimes()
                        } else {
                            Interest::never()
                        }
                    },
                ),
            )
    }

    /// Sends what is queued (within the export timeout) and stops the batch thread.
    pub(crate) fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("span exporter did not shut down cleanly: {e}");
        }
    }
}

/// Spans of the `voucher_*` crates at `debug` and above, their warnings and errors.
fn exported(metadata: &Metadata<'_>) -> bool {
    metadata.target().starts_with("voucher_")
        && if metadata.is_span() {
            *metadata.level() <= Level::DEBUG
        } else {
            *metadata.level() <= Level::WARN
        }
}

/// `service.name` (unless `OTEL_SERVICE_NAME` names it), `service.version`, and
/// `service.instance.id`: the pod's name where Kubernetes sets `HOSTNAME`, with the pid.
fn resource(service: Service) -> Resource {
    let instance = format!(
        "{}-{}",
        std::env::var("HOSTNAME").unwrap_or_else(|_| "host".into()),
        std::process::id()
    );
    let mut builder = Resource::builder().with_attributes([
        KeyValue::new("service.version", service.version),
        KeyValue::new("service.instance.id", instance),
    ]);
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        builder = builder.with_service_name(service.name);
    }
    builder.build()
}
