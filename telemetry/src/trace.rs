//! W3C trace context in and out, and links between spans: what the request path calls.
//!
//! A trace crosses three kinds of boundary here: the edge's request to a core (HTTP
//! headers), a reservation's event on the broker (Kafka record headers) and the recorder's
//! queue, where many requests share one transaction. The first two carry `traceparent`
//! (and `tracestate`, when the caller sent one) and the receiving span continues it; the
//! third links the transaction's span to each request it commits (one span cannot have
//! many parents). Headers are read through a getter, so this crate knows neither HTTP's
//! nor Kafka's types.
//!
//! Every function returns at once when tracing is off ([`crate::tracing_enabled`]): no header is
//! parsed or written, no context is looked up.

use tracing::Span;

/// The header names of W3C trace context, as written by [`outgoing`].
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// Makes `span` continue the trace whose context `header` (a lookup by header name)
/// carries. A missing or malformed `traceparent` leaves `span` the root of a new trace.
pub fn continue_from<'a>(span: &Span, header: impl Fn(&str) -> Option<&'a str>) {
    if !crate::tracing_enabled() {
        return;
    }
    #[cfg(feature = "otlp")]
    otlp::continue_from(span, header);
    #[cfg(not(feature = "otlp"))]
    let _ = (span, header);
}

/// The headers that pass `span`'s context on (`traceparent`, and `tracestate` when it has
/// one); empty when tracing is off or `span` is not exported.
pub fn outgoing(span: &Span) -> Vec<(&'static str, String)> {
    if !crate::tracing_enabled() {
        return Vec::new();
    }
    #[cfg(feature = "otlp")]
    return otlp::outgoing(span);
    #[cfg(not(feature = "otlp"))]
    {
        let _ = span;
        Vec::new()
    }
}

/// Links `span` to `other` (`span` was caused by `other` among others: a grouped
/// transaction and each request in it). Call it before `span` ends.
pub fn link(span: &Span, other: &Span) {
    if !crate::tracing_enabled() {
        return;
    }
    #[cfg(feature = "otlp")]
    otlp::link(span, other);
    #[cfg(not(feature = "otlp"))]
    let _ = (span, other);
}

/// The current span, to be linked to later from another task ([`link`]); a disabled span
/// when tracing is off, which costs nothing to carry.
pub fn current() -> Span {
    if crate::tracing_enabled() {
        Span::current()
    } else {
        Span::none()
    }
}

#[cfg(feature = "otlp")]
mod otlp {
    use std::marker::PhantomData;

    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::{TRACEPARENT, TRACESTATE};

    /// The lifetime marks the headers' borrow, which outlives any `&Lookup`.
    struct Lookup<'a, F>(F, PhantomData<&'a str>);

    impl<'a, F: Fn(&str) -> Option<&'a str>> Extractor for Lookup<'a, F> {
        fn get(&self, key: &str) -> Option<&str> {
            (self.0)(key)
        }

        fn keys(&self) -> Vec<&str> {
            vec![TRACEPARENT, TRACESTATE]
        }
    }

    struct Collect(Vec<(&'static str, String)>);

    impl Injector for Collect {
        fn set(&mut self, key: &str, value: String) {
            // The propagator writes these two names only.
            let name = if key == TRACESTATE {
                TRACESTATE
            } else {
                TRACEPARENT
            };
            if !(name == TRACESTATE && value.is_empty()) {
                self.0.push((name, value));
            }
        }
    }

    pub(super) fn continue_from<'a>(span: &Span, header: impl Fn(&str) -> Option<&'a str>) {
        let parent = TraceContextPropagator::new().extract(&Lookup(header, PhantomData));
        if parent.span().span_context().is_valid() {
            // Fails only for a span already started by the exporter (never here: the
            // span was just made) or one the exporter does not see (a filtered one).
            let _ = span.set_parent(parent);
        }
    }

    pub(super) fn outgoing(span: &Span) -> Vec<(&'static str, String)> {
        let context = span.context();
        if !context.span().span_context().is_valid() {
            return Vec::new();
        }
        let mut headers = Collect(Vec::with_capacity(2));
        TraceContextPropagator::new().inject_context(&context, &mut headers);
        headers.0
    }

    pub(super) fn link(span: &Span, other: &Span) {
        let other = other.context().span().span_context().clone();
        if other.is_valid() {
            span.add_link(other);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Before `init` exports anything, no header is read or written.
    #[test]
    fn with_tracing_off_no_context_goes_out() {
        assert!(!crate::tracing_enabled());
        let span = tracing::info_span!("request");
        continue_from(&span, |_| {
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        });
        assert!(outgoing(&span).is_empty());
        assert!(current().is_disabled());
    }
}
