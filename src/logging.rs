//! Logging like klog, so operators' greps and log pipelines keep working: plain text lines
//! `I1121 08:05:00.123456    4242 daemon.rs:80] "Using iptables Proxier" key="value"`, or JSON lines
//! `{"ts":1763712300.123,"caller":"daemon.rs:80","msg":"...","v":0,"key":"value"}` with
//! `logging.format: json`. Verbosity follows klog's -v: 0-1 info, 2-3 adds debug (a line per sync),
//! 4 and up adds trace; 6 and up also shows the libraries' own debug lines. RUST_LOG overrides.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Why logging could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The format is neither text nor json.
    #[error("logging format {0:?} is not \"text\" or \"json\"")]
    Format(String),
    /// A global subscriber was already installed.
    #[error("logging was already set up: {0}")]
    AlreadySet(String),
}

/// The line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

impl Format {
    /// Reads `logging.format`.
    pub fn parse(text: &str) -> Result<Self, LoggingError> {
        match text {
            "" | "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            other => Err(LoggingError::Format(other.to_string())),
        }
    }
}

/// The filter for a klog verbosity.
pub fn filter_for(verbosity: u32) -> EnvFilter {
    if let Ok(filter) = EnvFilter::try_from_default_env() {
        return filter;
    }
    let ours = match verbosity {
        0 | 1 => "info",
        2 | 3 => "debug",
        _ => "trace",
    };
    // Below -v 6 the client's per-request trace (one error line per failed retry, next to our
    // own line for the same failure) stays quiet, and so does the watcher's line for each 403
    // (ours logs a refusal once, then every few minutes).
    let libraries = if verbosity >= 6 {
        "debug"
    } else {
        "warn,kube_client::client::builder=off,kube_runtime::watcher=error"
    };
    EnvFilter::new(format!(
        "{libraries},kube_proxy_rs={ours},test_apiserver={ours}"
    ))
}

/// Installs the global subscriber, writing to stderr as klog does.
pub fn init(format: Format, verbosity: u32) -> Result<(), LoggingError> {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter_for(verbosity));
    let result = match format {
        Format::Text => builder.event_format(KlogFormat { json: false }).try_init(),
        Format::Json => builder.event_format(KlogFormat { json: true }).try_init(),
    };
    result.map_err(|err| LoggingError::AlreadySet(err.to_string()))
}

/// The klog-like event format.
#[derive(Clone, Copy, Debug)]
pub struct KlogFormat {
    pub json: bool,
}

impl<S, N> FormatEvent<S, N> for KlogFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let now = chrono::Utc::now();
        let file = meta
            .file()
            .map(|f| f.rsplit('/').next().unwrap_or(f))
            .unwrap_or("?");
        let caller = format!("{file}:{}", meta.line().unwrap_or(0));
        let mut fields = Fields::default();
        event.record(&mut fields);
        if self.json {
            let mut object = serde_json::Map::new();
            object.insert(
                "ts".into(),
                serde_json::json!(now.timestamp_millis() as f64 / 1000.0),
            );
            object.insert("caller".into(), caller.into());
            object.insert("msg".into(), fields.message.clone().into());
            object.insert("v".into(), verbosity_of(*meta.level()).into());
            if *meta.level() <= Level::WARN {
                let level = if *meta.level() == Level::ERROR {
                    "error"
                } else {
                    "warning"
                };
                object.insert("level".into(), level.into());
            }
            for (key, value) in fields.values {
                object.insert(key, value);
            }
            writeln!(writer, "{}", serde_json::Value::Object(object))
        } else {
            let severity = match *meta.level() {
                Level::ERROR => 'E',
                Level::WARN => 'W',
                _ => 'I',
            };
            write!(
                writer,
                "{severity}{} {:>7} {caller}] {:?}",
                now.format("%m%d %H:%M:%S%.6f"),
                std::process::id(),
                fields.message
            )?;
            for (key, value) in &fields.values {
                write!(writer, " {key}={}", text_value(value))?;
            }
            writeln!(writer)
        }
    }
}

/// klog's V level for a tracing level.
fn verbosity_of(level: Level) -> u32 {
    match level {
        Level::TRACE => 4,
        Level::DEBUG => 2,
        _ => 0,
    }
}

/// Strings are quoted (klog's structured form); numbers and booleans are not.
fn text_value(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    values: Vec<(String, serde_json::Value)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.values.push((field.name().into(), value.into()));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.values.push((field.name().into(), value.into()));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.values.push((field.name().into(), value.into()));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.values.push((field.name().into(), value.into()));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.values.push((field.name().into(), value.into()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.values.push((field.name().into(), text.into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Buffer {
            self.clone()
        }
    }

    fn capture(json: bool) -> String {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buffer.clone())
            .with_max_level(Level::TRACE)
            .event_format(KlogFormat { json })
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(count = 3, service = "ns/svc", "Using iptables Proxier");
            tracing::warn!(reason = %"bad port", "Skipping malformed Service");
            tracing::debug!(ok = true, "Synced");
        });
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn text_lines_look_like_klog() {
        let text = capture(false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with('I'), "{}", lines[0]);
        assert!(lines[0].contains("logging.rs:"), "{}", lines[0]);
        assert!(
            lines[0].ends_with("] \"Using iptables Proxier\" count=3 service=\"ns/svc\""),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].starts_with('W')
                && lines[1].ends_with("\"Skipping malformed Service\" reason=\"bad port\"")
        );
        assert!(lines[2].ends_with("\"Synced\" ok=true"), "{}", lines[2]);
    }

    #[test]
    fn json_lines_parse() {
        let text = capture(true);
        let values: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(values[0]["msg"], "Using iptables Proxier");
        assert_eq!(values[0]["count"], 3);
        assert_eq!(values[0]["v"], 0);
        assert_eq!(values[1]["level"], "warning");
        assert_eq!(values[2]["v"], 2);
        assert!(values[0]["ts"].as_f64().unwrap() > 1.0e9);
    }

    #[test]
    fn verbosity_maps_to_levels() {
        assert_eq!(Format::parse("json").unwrap(), Format::Json);
        assert!(Format::parse("xml").is_err());
        for (v, want) in [
            (0, "kube_proxy_rs=info"),
            (2, "kube_proxy_rs=debug"),
            (4, "kube_proxy_rs=trace"),
        ] {
            if std::env::var_os("RUST_LOG").is_none() {
                assert!(filter_for(v).to_string().contains(want), "{v}");
            }
        }
    }
}
