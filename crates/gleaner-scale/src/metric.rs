//! Throughput mode: reads the figure of merit from the program's own output.
//!
//! Timing wall clock only works for programs that do a fixed amount of work.
//! Many benchmarks do the opposite: they run for a fixed time and print how
//! much they got done (`sysbench … --time=10`, `gleaner workload … --duration`),
//! so their wall time is the same at every CPU count and a wall-time speedup
//! reads as "no scaling at all". With `--metric` the speedup is the ratio of
//! the figure the program prints instead: `metric(N) / metric(1)`, or the
//! inverse when lower is better (a latency).
//!
//! A metric is either a built-in recognizer for a tool whose output is known
//! or a regular expression whose first capture group is the number. Parsing
//! the spec is separate from reading outputs so a bad regex fails before
//! anything runs.

use regex::Regex;
use serde::Serialize;

use crate::error::ScaleError;

/// An example regex, quoted in help and error messages.
pub const EXAMPLE_REGEX: &str = r"events per second:\s*([0-9.]+)";

/// Names of the built-in recognizers, as `--metric` accepts them.
pub const PRESET_NAMES: [&str; 2] = [SYSBENCH, GLEANER_WORKLOAD];
const SYSBENCH: &str = "sysbench";
const GLEANER_WORKLOAD: &str = "gleaner-workload";

/// What `--metric` was given, ready to read outputs.
#[derive(Debug, Clone)]
pub struct Metric {
    source: Source,
    /// The spec as the user typed it, for messages.
    spec: String,
    pub higher_is_better: bool,
}

#[derive(Debug, Clone)]
enum Source {
    /// sysbench's "General statistics": total number of events / total time.
    /// Every sysbench test prints both, unlike "events per second" (cpu only).
    Sysbench { events: Regex, time: Regex },
    /// A regex whose first capture group is the number (also Gleaner's own workloads).
    Regex(Regex),
}

/// How the report describes the metric in its JSON and table.
#[derive(Debug, Clone, Serialize)]
pub struct MetricSetup {
    /// The `--metric` value: a preset name or the regex.
    pub spec: String,
    pub description: String,
    pub higher_is_better: bool,
}

/// Why a metric could not be read from one run's output. The caller adds
/// where (CPU count, run) to make it a [`ScaleError`].
#[derive(Debug, Clone, PartialEq)]
pub enum ReadError {
    NoMatch,
    NotANumber(String),
    NotPositive(f64),
}

impl Metric {
    /// Parses a `--metric` value: a preset name, or else a regular expression
    /// with at least one capture group.
    pub fn parse(spec: &str, lower_is_better: bool) -> Result<Self, ScaleError> {
        let source = match spec {
            SYSBENCH => Source::Sysbench {
                events: compile(r"total number of events:\s*([0-9]+)")?,
                time: compile(r"total time:\s*([0-9.]+)s")?,
            },
            // Text form `… throughput=123.4 items/s`, or the JSON form's
            // top-level `throughput_per_s` (the first after `"workload":`,
            // before the per-phase ones).
            GLEANER_WORKLOAD => Source::Regex(compile(
                r#"(?:\bthroughput=|"workload":.*?"throughput_per_s":)([0-9][0-9.eE+-]*)"#,
            )?),
            pattern => {
                let regex = compile(pattern)?;
                // Group 0 is the whole match; the number must be group 1.
                if regex.captures_len() < 2 {
                    return Err(ScaleError::MetricNoGroup {
                        pattern: pattern.to_string(),
                    });
                }
                Source::Regex(regex)
            }
        };
        Ok(Self {
            source,
            spec: spec.to_string(),
            higher_is_better: !lower_is_better,
        })
    }

    /// Reads the metric from one run's output: the last match, since a final
    /// summary follows any interim reports.
    pub fn read(&self, output: &str) -> Result<f64, ReadError> {
        let value = match &self.source {
            Source::Regex(regex) => last_capture(regex, output)?,
            Source::Sysbench { events, time } => {
                let events = last_capture(events, output)?;
                let time = last_capture(time, output)?;
                if time <= 0.0 {
                    return Err(ReadError::NotPositive(time));
                }
                events / time
            }
        };
        if value > 0.0 && value.is_finite() {
            Ok(value)
        } else {
            Err(ReadError::NotPositive(value))
        }
    }

    /// The `--metric` value as given, quoted for messages.
    pub fn spec(&self) -> &str {
        &self.spec
    }

    pub fn setup(&self) -> MetricSetup {
        let description = match (&self.source, self.spec.as_str()) {
            (Source::Sysbench { .. }, _) => {
                "sysbench events/s (total number of events / total time)".to_string()
            }
            (_, GLEANER_WORKLOAD) => "gleaner workload throughput (throughput= field)".to_string(),
            (_, pattern) => format!("first capture group of /{pattern}/"),
        };
        MetricSetup {
            spec: self.spec.clone(),
            description,
            higher_is_better: self.higher_is_better,
        }
    }

    /// Speedup of `value` over the 1-CPU `baseline`.
    pub fn speedup(&self, baseline: f64, value: f64) -> f64 {
        speedup(baseline, value, self.higher_is_better)
    }
}

/// Speedup from a metric: `value / baseline` when higher is better (a
/// throughput), `baseline / value` when lower is better (a latency or a time).
pub fn speedup(baseline: f64, value: f64, higher_is_better: bool) -> f64 {
    if higher_is_better {
        value / baseline
    } else {
        baseline / value
    }
}

/// The preset whose recognizer reads a usable number from `output`, if any:
/// used to name the exact `--metric` in the fixed-time warning.
pub fn detect_preset(output: &str) -> Option<&'static str> {
    PRESET_NAMES.into_iter().find(|name| {
        Metric::parse(name, false)
            .map(|metric| metric.read(output).is_ok())
            .unwrap_or(false)
    })
}

fn last_capture(regex: &Regex, output: &str) -> Result<f64, ReadError> {
    let captures = regex
        .captures_iter(output)
        .last()
        .ok_or(ReadError::NoMatch)?;
    // `captures_len() >= 2` was checked, but an optional group may not take part.
    let text = captures.get(1).ok_or(ReadError::NoMatch)?.as_str().trim();
    text.parse::<f64>()
        .map_err(|_| ReadError::NotANumber(text.to_string()))
}

/// Compiles a user's or a built-in pattern (the built-in ones are covered by tests).
fn compile(pattern: &str) -> Result<Regex, ScaleError> {
    Regex::new(pattern).map_err(|err| ScaleError::MetricRegex {
        pattern: pattern.to_string(),
        detail: one_line_regex_error(&err),
    })
}

/// `regex` reports syntax errors over several lines (the pattern, a caret,
/// then `error: …`); keep the last, which says what is wrong.
fn one_line_regex_error(err: &regex::Error) -> String {
    let text = err.to_string();
    let last = text
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .unwrap_or("invalid");
    last.trim().trim_start_matches("error: ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYSBENCH_THREADS: &str = "\
General statistics:
    total time:                          2.0070s
    total number of events:              36200

Latency (ms):
         min:                                    0.59
";

    #[test]
    fn user_regex_reads_the_first_group_of_the_last_match() {
        let metric = Metric::parse(EXAMPLE_REGEX, false).unwrap();
        let output = "warmup\nevents per second: 10.5\n...\nevents per second:  1306.63\nbye\n";
        assert_eq!(metric.read(output), Ok(1306.63));
        assert!(metric.higher_is_better);
    }

    #[test]
    fn sysbench_preset_divides_events_by_time() {
        let metric = Metric::parse("sysbench", false).unwrap();
        assert_eq!(metric.read(SYSBENCH_THREADS), Ok(36200.0 / 2.007));
        assert_eq!(
            metric.read("total number of events: 5\n"),
            Err(ReadError::NoMatch)
        );
        assert_eq!(
            metric.read("total time: 0.0s\ntotal number of events: 5\n"),
            Err(ReadError::NotPositive(0.0))
        );
    }

    #[test]
    fn gleaner_workload_preset_reads_text_and_json() {
        let metric = Metric::parse("gleaner-workload", false).unwrap();
        let text = "pingpong: threads=2 round_trips=2000 elapsed=0.063s throughput=31575.2 round_trips/s rtt_us p50=6.7";
        assert_eq!(metric.read(text), Ok(31575.2));
        let json = r#"{"workload":"mutex","threads":2,"unit":"ops","ops":2000,"elapsed_s":0.03,"throughput_per_s":61900.75,"phases":[{"label":"a","ops":1,"elapsed_s":1.0,"throughput_per_s":1.0}]}"#;
        assert_eq!(metric.read(json), Ok(61900.75));
    }

    #[test]
    fn bad_regexes_are_one_line_errors_with_a_fix() {
        let err = Metric::parse("events: ([0-9.]+", false).unwrap_err();
        assert!(matches!(err, ScaleError::MetricRegex { .. }), "{err}");
        let message = err.to_string();
        assert!(!message.contains('\n'), "{message}");
        assert!(message.contains("unclosed group"), "{message}");
        assert!(message.contains(EXAMPLE_REGEX), "{message}");

        let err = Metric::parse("events per second", false).unwrap_err();
        assert!(matches!(err, ScaleError::MetricNoGroup { .. }), "{err}");
        assert!(err.to_string().contains("capture group"), "{err}");
        assert!(!err.to_string().contains('\n'));
    }

    #[test]
    fn unreadable_outputs_say_why() {
        let metric = Metric::parse(r"rate: (\S+)", false).unwrap();
        assert_eq!(metric.read("nothing here"), Err(ReadError::NoMatch));
        assert_eq!(
            metric.read("rate: fast"),
            Err(ReadError::NotANumber("fast".to_string()))
        );
        assert_eq!(metric.read("rate: 0"), Err(ReadError::NotPositive(0.0)));
        assert_eq!(metric.read("rate: -3"), Err(ReadError::NotPositive(-3.0)));
        // An optional first group that does not take part is no match, not a panic.
        let optional = Metric::parse(r"rate(?: is ([0-9]+))?", false).unwrap();
        assert_eq!(optional.read("rate"), Err(ReadError::NoMatch));
    }

    #[test]
    fn speedup_follows_the_direction() {
        assert_eq!(speedup(100.0, 180.0, true), 1.8);
        assert_eq!(speedup(2.0, 1.0, false), 2.0);
        let latency = Metric::parse(r"p50=([0-9.]+)", true).unwrap();
        assert!(!latency.higher_is_better);
        assert_eq!(latency.speedup(8.0, 4.0), 2.0);
    }

    #[test]
    fn presets_are_detected_from_output() {
        assert_eq!(detect_preset(SYSBENCH_THREADS), Some("sysbench"));
        assert_eq!(
            detect_preset("mutex: threads=2 ops=5 elapsed=1.000s throughput=5.0 ops/s"),
            Some("gleaner-workload")
        );
        assert_eq!(detect_preset("hello\n"), None);
    }

    #[test]
    fn setup_describes_the_metric() {
        let setup = Metric::parse("sysbench", false).unwrap().setup();
        assert!(setup.description.contains("events"), "{setup:?}");
        let setup = Metric::parse(EXAMPLE_REGEX, true).unwrap().setup();
        assert_eq!(setup.spec, EXAMPLE_REGEX);
        assert!(!setup.higher_is_better);
    }
}
