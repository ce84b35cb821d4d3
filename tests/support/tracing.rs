//! A `tracing` subscriber for tests: records every event and every span's name and
//! fields, so a test can assert what the layers log and at which level.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// A name and fields as `(name, value)` pairs.
pub type Fields = Vec<(String, String)>;

#[derive(Clone, Debug)]
pub struct Logged {
    pub level: Level,
    pub target: String,
    pub fields: Fields,
}

impl Logged {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Records every event and every span's name and fields.
#[derive(Clone, Default)]
pub struct Recorder {
    pub events: Arc<Mutex<Vec<Logged>>>,
    pub spans: Arc<Mutex<Vec<(String, Fields)>>>,
}

impl Recorder {
    /// stormguard's events at INFO or above, taken out.
    pub fn take_info(&self) -> Vec<Logged> {
        self.take()
            .into_iter()
            .filter(|e| e.level <= Level::INFO)
            .collect()
    }

    /// Every stormguard event recorded so far, taken out.
    pub fn take(&self) -> Vec<Logged> {
        std::mem::take(&mut *self.events.lock().unwrap())
            .into_iter()
            .filter(|e| e.target.starts_with("stormguard"))
            .collect()
    }

    /// The events among `events` at `level` whose message is `message`.
    pub fn with_message<'a>(events: &'a [Logged], level: Level, message: &str) -> Vec<&'a Logged> {
        events
            .iter()
            .filter(|e| e.level == level && e.get("message") == Some(message))
            .collect()
    }
}

struct Visitor(Fields);

impl Visit for Visitor {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = Visitor(Vec::new());
        span.record(&mut fields);
        let mut spans = self.spans.lock().unwrap();
        spans.push((span.metadata().name().to_owned(), fields.0));
        Id::from_u64(spans.len() as u64)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Visitor(Vec::new());
        event.record(&mut fields);
        self.events.lock().unwrap().push(Logged {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            fields: fields.0,
        });
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}
