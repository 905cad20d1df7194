//! The tracing layer that copies every event about a controller into its ring: the guest's
//! `log` lines, its stdout and stderr, its panics, and the runtime's own lines that carry a
//! `controller` field (in the event or in a span around it, as the `reconcile` span does).
//!
//! It sees what the runtime's log would (the same filter), renders each event on one line
//! with control characters escaped (a field's line break cannot forge a line), and never
//! blocks on a reader: readers copy lines out under the store's lock.

use std::fmt::Write as _;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber, span};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use super::ring::{ControllerKey, LogStore, MAX_LINE_BYTES};

/// Copies events about controllers into a [`LogStore`].
#[derive(Debug, Clone)]
pub struct RingLayer {
    store: Arc<LogStore>,
}

impl RingLayer {
    /// A layer writing into `store`.
    pub fn new(store: Arc<LogStore>) -> RingLayer {
        RingLayer { store }
    }
}

/// What a span about a controller says: the controller and its other fields, rendered.
struct SpanFields {
    controller: String,
    rest: String,
}

/// Collects an event's or a span's fields: the message, the controller, the rest as `k=v`.
#[derive(Default)]
struct Fields {
    message: String,
    controller: Option<String>,
    guest: bool,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => escape_into(&mut self.message, value),
            "controller" => self.controller = Some(value.to_owned()),
            name => {
                if self.rest.len() < MAX_LINE_BYTES {
                    let _ = write!(self.rest, " {name}=");
                    escape_into(&mut self.rest, value);
                }
            }
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if field.name() == "guest" {
            self.guest = value;
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if self.rest.len() >= MAX_LINE_BYTES && field.name() != "message" {
            return;
        }
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        self.record_str(field, &text);
    }
}

/// `value` on one line: control characters as escapes, at most [`MAX_LINE_BYTES`] kept.
fn escape_into(out: &mut String, value: &str) {
    for c in value.chars() {
        if out.len() >= MAX_LINE_BYTES {
            return;
        }
        if c.is_control() {
            let _ = write!(out, "{}", c.escape_default());
        } else {
            out.push(c);
        }
    }
}

impl<S> Layer<S> for RingLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let (Some(controller), Some(span)) = (fields.controller, ctx.span(id)) else {
            return;
        };
        span.extensions_mut().insert(SpanFields {
            controller,
            rest: fields.rest,
        });
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut span_rest = String::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope {
                if let Some(about) = span.extensions().get::<SpanFields>() {
                    if fields.controller.is_none() {
                        fields.controller = Some(about.controller.clone());
                    }
                    if about.controller.as_str() == fields.controller.as_deref().unwrap_or("") {
                        span_rest.push_str(&about.rest);
                    }
                    break;
                }
            }
        }
        let Some(controller) = fields.controller else {
            return;
        };
        let mut text = String::with_capacity(fields.message.len() + fields.rest.len() + 16);
        let _ = write!(text, "{}", event.metadata().level());
        text.push(' ');
        if fields.guest {
            text.push_str("guest: ");
        }
        text.push_str(&fields.message);
        text.push_str(&fields.rest);
        // The span's fields (the object being reconciled) where the event does not say them.
        for field in span_rest.split(' ').filter(|f| !f.is_empty()) {
            let name = field.split('=').next().unwrap_or_default();
            if !fields.rest.contains(&format!(" {name}=")) {
                text.push(' ');
                text.push_str(field);
            }
        }
        let key = ControllerKey::parse(&controller);
        self.store.push(&key, Timestamp::now(), &text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::ring::Selection;
    use tracing_subscriber::layer::SubscriberExt as _;

    fn lines(store: &LogStore, controller: &str) -> Vec<String> {
        store
            .read(&ControllerKey::parse(controller), Selection::default())
            .map(|r| r.lines.iter().map(|l| l.text.to_string()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn events_about_a_controller_reach_its_ring_only() {
        let store = Arc::new(LogStore::default());
        let subscriber = tracing_subscriber::registry().with(RingLayer::new(store.clone()));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                controller = "team-x/a",
                guest = true,
                object = "team-x/o",
                "hello"
            );
            tracing::warn!(
                controller = "team-y/b",
                "module not loaded: bad\nFORGED line"
            );
            let span =
                tracing::info_span!("reconcile", controller = "team-x/a", object = "team-x/p");
            span.in_scope(|| tracing::warn!(reason = "Panic", "reconcile failed"));
            tracing::info!("a line about no controller");
            tracing::info!(controller = "admins", "a cluster controller's line");
        });
        assert_eq!(
            lines(&store, "team-x/a"),
            [
                "INFO guest: hello object=team-x/o",
                "WARN reconcile failed reason=Panic object=team-x/p"
            ]
        );
        assert_eq!(
            lines(&store, "team-y/b"),
            ["WARN module not loaded: bad\\nFORGED line"]
        );
        assert_eq!(
            lines(&store, "admins"),
            ["INFO a cluster controller's line"]
        );
    }
}
