//! W3C trace context from OpenTelemetry (feature `otel`): the `traceparent` and `tracestate`
//! headers of a context's span, written as the W3C Trace Context format defines them, which is
//! what `TraceContextPropagator` writes. Only the `opentelemetry` API crate is needed; no SDK.

use opentelemetry::trace::TraceContextExt;

/// The trace headers of a span context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceHeaders {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

/// The headers of the current context's span, if it has a valid one.
pub(crate) fn current() -> Option<TraceHeaders> {
    headers_of(&opentelemetry::Context::current())
}

/// The headers of `cx`'s span, if it has a valid one.
pub(crate) fn headers_of(cx: &opentelemetry::Context) -> Option<TraceHeaders> {
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return None;
    }
    // Version 00; of the flags, only `sampled` is defined (as the propagator sends them).
    let traceparent = format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8() & 0x01
    );
    let state = sc.trace_state().header();
    Some(TraceHeaders {
        traceparent,
        tracestate: (!state.is_empty()).then_some(state),
    })
}
