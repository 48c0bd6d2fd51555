//! OTLP export of the spans of [`crate::trace`] (`--otlp-endpoint`, off by default).
//!
//! A `tracing` layer takes the spans of target [`trace::TARGET`] only, reads the ids
//! each span carries ([`trace::fields`]) and, when the span closes, hands it to the
//! OpenTelemetry SDK with exactly those ids, its parent as a remote span context (so
//! the caller's sampling decision holds: a trace it did not sample is not exported),
//! and its start and end (the span's own fields where it has them, else when it was
//! created and closed). The SDK's batch processor exports them over OTLP/HTTP with
//! JSON bodies, on a thread of its own, to `{endpoint}/v1/traces`.
//!
//! The ids are the engine's, not the SDK's, because the `traceparent` an `http:v1`
//! request carries must name the step's span, and a claim's span is known only once
//! the claim has answered.

use crate::trace::{self, fields};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use std::time::SystemTime;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::Subscriber;
use tracing_subscriber::layer::Context as LayerContext;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The exporter: the layer to install, and the provider to flush at exit.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// An exporter to the OTLP/HTTP collector at `endpoint` (its base URL, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` takes it: `http://127.0.0.1:4318`).
    pub fn new(endpoint: &str) -> Result<Exporter, String> {
        let url = traces_url(endpoint)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .with_endpoint(url)
            .build()
            .map_err(|e| format!("--otlp-endpoint {endpoint}: {e}"))?;
        let resource = Resource::builder()
            .with_service_name("leasehold")
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).build())
            .with_resource(resource)
            .build();
        Ok(Exporter { provider })
    }

    /// The layer that hands the spans of [`trace::TARGET`] to this exporter.
    pub fn layer(&self) -> SpanLayer {
        SpanLayer {
            tracer: self.provider.tracer("leasehold"),
        }
    }

    /// Exports what is buffered and stops the exporter's thread.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "the OTLP exporter did not flush every span");
        }
    }
}

/// `{endpoint}/v1/traces`, for an `http` or `https` base URL.
fn traces_url(endpoint: &str) -> Result<String, String> {
    let base = endpoint.trim().trim_end_matches('/');
    let scheme_ok = base.starts_with("http://") || base.starts_with("https://");
    if !scheme_ok || base.len() <= "https://".len() {
        return Err(format!(
            "--otlp-endpoint {endpoint:?}: expected the collector's http(s) base URL, such as http://127.0.0.1:4318"
        ));
    }
    Ok(format!("{base}/v1/traces"))
}

/// The `tracing` layer of an [`Exporter`].
pub struct SpanLayer {
    tracer: SdkTracer,
}

/// What a span recorded until it closes.
#[derive(Default)]
struct Pending {
    trace_id: Option<TraceId>,
    span_id: Option<SpanId>,
    parent_id: Option<SpanId>,
    flags: TraceFlags,
    start: Option<SystemTime>,
    end: Option<SystemTime>,
    attributes: Vec<KeyValue>,
}

impl Visit for Pending {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            fields::TRACE_ID => self.trace_id = TraceId::from_hex(value).ok(),
            fields::SPAN_ID => self.span_id = SpanId::from_hex(value).ok(),
            fields::PARENT_ID => self.parent_id = SpanId::from_hex(value).ok(),
            name => self.attributes.push(KeyValue::new(name, value.to_owned())),
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        let at = || SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(value);
        match field.name() {
            fields::START => self.start = Some(at()),
            fields::END => self.end = Some(at()),
            fields::FLAGS => self.flags = TraceFlags::new(u8::try_from(value).unwrap_or(0)),
            name => self
                .attributes
                .push(KeyValue::new(name, i64::try_from(value).unwrap_or(i64::MAX))),
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.attributes.push(KeyValue::new(field.name(), value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.attributes.push(KeyValue::new(field.name(), value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SpanLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: LayerContext<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut pending = Pending {
            start: Some(SystemTime::now()),
            flags: TraceFlags::SAMPLED,
            ..Pending::default()
        };
        attrs.record(&mut pending);
        span.extensions_mut().insert(pending);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: LayerContext<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(pending) = span.extensions_mut().get_mut::<Pending>() {
                values.record(pending);
            }
        }
    }

    fn on_close(&self, id: Id, ctx: LayerContext<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(pending) = span.extensions_mut().remove::<Pending>() else {
            return;
        };
        self.export(span.name(), pending);
    }
}

impl SpanLayer {
    /// Hands a closed span to the SDK, under its ids and its parent.
    fn export(&self, name: &'static str, p: Pending) {
        let (Some(trace_id), Some(span_id)) = (p.trace_id, p.span_id) else {
            return;
        };
        let parent = match p.parent_id {
            Some(parent) => {
                let remote = SpanContext::new(trace_id, parent, p.flags, true, TraceState::default());
                Context::new().with_remote_span_context(remote)
            }
            None => Context::new(),
        };
        let kind = if name == "leasehold.step" {
            SpanKind::Client
        } else {
            SpanKind::Internal
        };
        let builder = self
            .tracer
            .span_builder(name)
            .with_trace_id(trace_id)
            .with_span_id(span_id)
            .with_kind(kind)
            .with_start_time(p.start.unwrap_or_else(SystemTime::now))
            .with_attributes(p.attributes);
        let span = self.tracer.build_with_context(builder, &parent);
        opentelemetry::trace::Span::end_with_timestamp(&mut { span }, p.end.unwrap_or_else(SystemTime::now));
    }
}

/// Whether a span or event is one of [`crate::trace`]'s.
pub fn is_trace(metadata: &tracing::Metadata<'_>) -> bool {
    metadata.target() == trace::TARGET
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_a_base_url() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url(" https://otel.example/ ").unwrap(),
            "https://otel.example/v1/traces"
        );
        for bad in ["", "127.0.0.1:4318", "ftp://x", "http://"] {
            let e = traces_url(bad).unwrap_err();
            assert!(e.contains("--otlp-endpoint"), "{e}");
        }
    }
}
