//! Log output: text or JSON lines on stderr, with journald priorities under systemd.
//!
//! Exists because the service's log is read by machines as much as by people. Every process
//! Gleaner starts (an instance under the daemon, the guard under an instance) logs in the
//! format its parent was given, so `--log-format json` makes every line JSON:
//!
//! * JSON lines are flat (`{"timestamp":…,"level":…,"message":…,"added":[…]}`); a field whose
//!   Debug form is a JSON array (a `Vec` of strings or numbers) is written as that array, not
//!   as a string, so that `jq '.added[]'` works.
//! * Under journald (stderr is the stream named by `JOURNAL_STREAM`), text lines carry no
//!   timestamp of their own (the journal has one) and every line, text or JSON, starts with
//!   the `<N>` syslog priority that journald's `SyslogLevelPrefix=` (on by default) turns into
//!   the entry's priority, so `journalctl -p err` finds errors. Children, whose stderr is a
//!   pipe to their parent, are told through [`PRIORITY_PREFIX_ENV`].

use std::fmt;
use std::sync::OnceLock;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Set (to "1") for child processes whose output ends up in the journal through their parent.
pub const PRIORITY_PREFIX_ENV: &str = "GLEANER_LOG_PRIORITY_PREFIX";

/// How this process logs, for the processes it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogStyle {
    pub json: bool,
    /// Lines start with `<N>` (journald priority).
    pub priority_prefix: bool,
}

static STYLE: OnceLock<LogStyle> = OnceLock::new();

/// The style [`init`] installed (text without prefix before that).
pub fn style() -> LogStyle {
    STYLE.get().copied().unwrap_or(LogStyle {
        json: false,
        priority_prefix: false,
    })
}

/// Arguments that give a child process this process's log format.
pub fn child_args() -> Vec<&'static str> {
    vec!["--log-format", if style().json { "json" } else { "text" }]
}

/// Environment for a child process: the priority prefix, if this process uses one.
pub fn child_env() -> Option<(&'static str, &'static str)> {
    style()
        .priority_prefix
        .then_some((PRIORITY_PREFIX_ENV, "1"))
}

/// Whether stderr is the journal stream systemd connected us to (`JOURNAL_STREAM=dev:ino`).
pub fn stderr_is_journal() -> bool {
    let Ok(v) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    // SAFETY: fstat writes into the zeroed local struct; fd 2 may be closed (then it fails).
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(2, &mut st) } == 0) && st.st_dev as u64 == dev && st.st_ino as u64 == ino
}

/// syslog priority of a tracing level (journald's `PRIORITY=`).
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// Installs the subscriber: `json` or text, filtered by `filter` (else $GLEANER_LOG, else info).
pub fn init(json: bool, filter: Option<&str>) {
    use tracing_subscriber::EnvFilter;
    let priority_prefix =
        stderr_is_journal() || std::env::var(PRIORITY_PREFIX_ENV).is_ok_and(|v| v == "1");
    let _ = STYLE.set(LogStyle {
        json,
        priority_prefix,
    });
    let filter = filter
        .map(EnvFilter::new)
        .or_else(|| std::env::var("GLEANER_LOG").ok().map(EnvFilter::new))
        .unwrap_or_else(|| EnvFilter::new("info"));
    // Colour only on a terminal: journald and the daemon's log forwarding get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(ansi);
    let _ = match (json, priority_prefix) {
        (true, _) => builder
            .event_format(JsonLines { priority_prefix })
            .try_init(),
        // The journal stamps each line itself.
        (false, true) => builder
            .event_format(Prefixed(
                tracing_subscriber::fmt::format()
                    .with_target(false)
                    .without_time(),
            ))
            .try_init(),
        (false, false) => builder.try_init(),
    };
}

/// Logs an error the way this process logs: a JSON line, or `gleaner: error: …` text.
pub fn report_error(message: &str) {
    let s = style();
    if s.json || s.priority_prefix {
        tracing::error!("{message}");
    } else {
        crate::errln!("gleaner: error: {message}");
    }
}

/// Prints a line that did not go through tracing (a panic message) in this process's style.
pub fn print_unstructured(line: &str) {
    let s = style();
    let prefix = if s.priority_prefix { "<3>" } else { "" };
    if s.json {
        crate::errln!("{prefix}{}", wrap_unstructured(line));
    } else {
        crate::errln!("{prefix}{line}");
    }
}

/// Text lines with the `<N>` priority first.
struct Prefixed<F>(F);

impl<S, N, F> FormatEvent<S, N> for Prefixed<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

/// One flat JSON object per event.
struct JsonLines {
    priority_prefix: bool,
}

impl<S, N> FormatEvent<S, N> for JsonLines
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
        let level = event.metadata().level();
        let mut fields = JsonFields(serde_json::Map::new());
        event.record(&mut fields);
        let line = json_line(&now_rfc3339(), level, fields.0);
        if self.priority_prefix {
            write!(writer, "<{}>", priority(level))?;
        }
        writeln!(writer, "{line}")
    }
}

/// The JSON object of one event: timestamp, level, then the event's fields, flat.
pub fn json_line(
    timestamp: &str,
    level: &Level,
    fields: serde_json::Map<String, serde_json::Value>,
) -> String {
    let mut m = serde_json::Map::new();
    m.insert("timestamp".into(), timestamp.into());
    m.insert("level".into(), level.as_str().into());
    for (k, v) in fields {
        m.insert(k, v);
    }
    serde_json::Value::Object(m).to_string()
}

fn now_rfc3339() -> String {
    use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
    let mut s = String::new();
    let _ = SystemTime.format_time(&mut Writer::new(&mut s));
    s
}

/// Collects an event's fields as JSON values.
struct JsonFields(serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for JsonFields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(
            field.name().into(),
            serde_json::Number::from_f64(value)
                .map(serde_json::Value::Number)
                .unwrap_or_else(|| value.to_string().into()),
        );
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        self.0.insert(field.name().into(), debug_value(text));
    }
}

/// A Debug rendering as JSON: a list stays a list, anything else is a string.
pub fn debug_value(text: String) -> serde_json::Value {
    if text.starts_with('[') {
        if let Ok(v @ serde_json::Value::Array(_)) =
            serde_json::from_str::<serde_json::Value>(&text)
        {
            return v;
        }
    }
    text.into()
}

/// A line a child wrote that is not JSON (a message printed before its logging was set up,
/// say), made into a JSON line so that the service's output stays all JSON.
pub fn wrap_unstructured(line: &str) -> String {
    let level = if line.to_lowercase().contains("error") {
        Level::ERROR
    } else {
        Level::INFO
    };
    let mut fields = serde_json::Map::new();
    fields.insert("message".into(), line.trim().into());
    json_line(&now_rfc3339(), &level, fields)
}

/// Splits a `<N>` priority prefix off a line.
pub fn split_priority(line: &str) -> (&str, &str) {
    let b = line.as_bytes();
    if b.len() >= 3 && b[0] == b'<' && b[1].is_ascii_digit() && b[2] == b'>' {
        (&line[..3], &line[3..])
    } else {
        ("", line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_arrays_and_everything_else_a_string() {
        assert_eq!(
            debug_value(format!("{:?}", vec!["a", "b\"c"])),
            serde_json::json!(["a", "b\"c"])
        );
        assert_eq!(
            debug_value(format!("{:?}", Vec::<String>::new())),
            serde_json::json!([])
        );
        assert_eq!(
            debug_value(format!("{:?}", vec![1, 2])),
            serde_json::json!([1, 2])
        );
        assert_eq!(
            debug_value("MajorChange".into()),
            serde_json::json!("MajorChange")
        );
        assert_eq!(
            debug_value("[not json".into()),
            serde_json::json!("[not json")
        );
    }

    #[test]
    fn lines_are_flat_json_with_level_and_timestamp() {
        let mut f = serde_json::Map::new();
        f.insert("message".into(), "configuration reloaded".into());
        f.insert("added".into(), serde_json::json!(["db"]));
        let v: serde_json::Value =
            serde_json::from_str(&json_line("2026-11-23T21:00:00Z", &Level::WARN, f)).unwrap();
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["message"], "configuration reloaded");
        assert_eq!(v["added"][0], "db");
        assert!(v.get("fields").is_none());
        let w: serde_json::Value =
            serde_json::from_str(&wrap_unstructured("gleaner: error: boom")).unwrap();
        assert_eq!(
            (w["level"].as_str(), w["message"].as_str()),
            (Some("ERROR"), Some("gleaner: error: boom"))
        );
    }

    #[test]
    fn priorities_follow_syslog() {
        assert_eq!(
            [Level::ERROR, Level::WARN, Level::INFO, Level::DEBUG].map(|l| priority(&l)),
            [3, 4, 6, 7]
        );
        assert_eq!(split_priority("<3>{\"a\":1}"), ("<3>", "{\"a\":1}"));
        assert_eq!(split_priority("plain"), ("", "plain"));
    }
}
