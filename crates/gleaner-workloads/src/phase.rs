//! Phase specifications: how a workload changes its work granularity at run time.
//!
//! Gleaner adapts to what the guest is doing, so its tests need workloads that
//! switch behaviour mid-run, e.g. `--phases "fine:5s,coarse:5s"` runs fine-grained
//! work for five seconds and then coarse-grained work for five seconds.
//!
//! Grammar (whitespace around tokens is ignored):
//!
//! ```text
//! spec   := entry ("," entry)*
//! entry  := label ":" length
//! label  := "fine" (work 500) | "coarse" (work 5000) | "work=" N
//! length := N            a count of the workload's unit (items, ops, barrier episodes)
//!         | X "s" | X "ms"   a wall-clock duration (X may be fractional)
//! ```
//!
//! All entries of one spec must use the same kind of length: either every phase
//! is counted (fully deterministic, checksums reproducible) or every phase is
//! timed (for adaptation experiments).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use thiserror::Error;

/// Hash iterations per unit of fine-grained work (`fine`).
pub const FINE_WORK: u64 = 500;
/// Hash iterations per unit of coarse-grained work (`coarse`).
pub const COARSE_WORK: u64 = 5000;

/// How long a phase (or a whole run) lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    /// A fixed number of the workload's units; makes results reproducible.
    Count(u64),
    /// A wall-clock duration.
    Duration(Duration),
}

impl fmt::Display for Length {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Length::Count(n) => write!(f, "{n}"),
            Length::Duration(d) => write!(f, "{}s", d.as_secs_f64()),
        }
    }
}

/// One phase of a run: a work amount held for a given length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    /// Name shown in reports (`fine`, `coarse`, `work=N`).
    pub label: String,
    /// Hash iterations per unit of work; what each workload does with it is
    /// documented on that workload.
    pub work: u64,
    pub length: Length,
}

/// A validated, non-empty list of phases that all use the same kind of [`Length`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseSpec {
    phases: Vec<Phase>,
}

/// Why a phase spec was rejected; each message names the offending text and the fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PhaseSpecError {
    #[error("empty phase spec; give phases like \"fine:5s,coarse:5s\"")]
    Empty,
    #[error("phase {index} of \"{spec}\" is empty; remove the extra comma")]
    EmptyEntry { spec: String, index: usize },
    #[error("phase \"{entry}\" has no length; write it as LABEL:LENGTH, e.g. \"fine:5s\"")]
    MissingLength { entry: String },
    #[error("unknown phase label \"{label}\"; use fine, coarse or work=N")]
    UnknownLabel { label: String },
    #[error("bad work amount \"{value}\" in phase label \"{label}\"; use a whole number, e.g. work=2000")]
    BadWork { label: String, value: String },
    #[error("bad phase length \"{value}\"; use a count (1000), seconds (5s, 0.5s) or milliseconds (500ms)")]
    BadLength { value: String },
    #[error("phase length \"{value}\" is zero; give a positive count or duration")]
    ZeroLength { value: String },
    #[error("phase spec \"{spec}\" mixes counts and durations; use one kind for every phase")]
    MixedLengths { spec: String },
}

impl PhaseSpec {
    /// Validates a list of phases: non-empty, no zero lengths, one kind of length.
    pub fn new(phases: Vec<Phase>) -> Result<Self, PhaseSpecError> {
        let Some(first) = phases.first() else {
            return Err(PhaseSpecError::Empty);
        };
        for phase in &phases {
            let is_zero = match phase.length {
                Length::Count(n) => n == 0,
                Length::Duration(d) => d.is_zero(),
            };
            if is_zero {
                return Err(PhaseSpecError::ZeroLength {
                    value: phase.length.to_string(),
                });
            }
        }
        let timed = matches!(first.length, Length::Duration(_));
        if phases
            .iter()
            .any(|p| matches!(p.length, Length::Duration(_)) != timed)
        {
            let spec = phases
                .iter()
                .map(|p| format!("{}:{}", p.label, p.length))
                .collect::<Vec<_>>()
                .join(",");
            return Err(PhaseSpecError::MixedLengths { spec });
        }
        Ok(Self { phases })
    }

    /// A one-phase spec, used when the user gives plain `--work`/`--items`/`--duration`.
    pub fn single(work: u64, length: Length) -> Result<Self, PhaseSpecError> {
        Self::new(vec![Phase {
            label: format!("work={work}"),
            work,
            length,
        }])
    }

    pub fn phases(&self) -> &[Phase] {
        &self.phases
    }

    /// True when phases are bounded by wall-clock time rather than counts.
    pub fn is_timed(&self) -> bool {
        matches!(self.phases[0].length, Length::Duration(_))
    }
}

impl FromStr for PhaseSpec {
    type Err = PhaseSpecError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        if spec.trim().is_empty() {
            return Err(PhaseSpecError::Empty);
        }
        let mut phases = Vec::new();
        for (index, entry) in spec.split(',').enumerate() {
            let entry = entry.trim();
            if entry.is_empty() {
                return Err(PhaseSpecError::EmptyEntry {
                    spec: spec.to_string(),
                    index,
                });
            }
            let Some((label, length)) = entry.split_once(':') else {
                return Err(PhaseSpecError::MissingLength {
                    entry: entry.to_string(),
                });
            };
            let label = label.trim();
            let work = parse_label(label)?;
            let length = parse_length(length.trim())?;
            phases.push(Phase {
                label: label.to_string(),
                work,
                length,
            });
        }
        Self::new(phases)
    }
}

fn parse_label(label: &str) -> Result<u64, PhaseSpecError> {
    match label {
        "fine" => Ok(FINE_WORK),
        "coarse" => Ok(COARSE_WORK),
        _ => match label.strip_prefix("work=") {
            Some(value) => value.trim().parse().map_err(|_| PhaseSpecError::BadWork {
                label: label.to_string(),
                value: value.to_string(),
            }),
            None => Err(PhaseSpecError::UnknownLabel {
                label: label.to_string(),
            }),
        },
    }
}

fn parse_length(text: &str) -> Result<Length, PhaseSpecError> {
    let bad = || PhaseSpecError::BadLength {
        value: text.to_string(),
    };
    // "ms" must be tried before "s", since "500ms" also ends in "s".
    let (number, seconds_per_unit) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        let count = text.parse::<u64>().map_err(|_| bad())?;
        return Ok(Length::Count(count));
    };
    let value = parse_non_negative_f64(number.trim()).ok_or_else(bad)?;
    let duration = Duration::try_from_secs_f64(value * seconds_per_unit).map_err(|_| bad())?;
    Ok(Length::Duration(duration))
}

/// Parses a plain decimal like "2" or "0.25"; rejects signs, "inf" and "nan",
/// which `f64::from_str` would otherwise accept.
fn parse_non_negative_f64(text: &str) -> Option<f64> {
    let plain = !text.is_empty() && text.chars().all(|c| c.is_ascii_digit() || c == '.');
    if !plain {
        return None;
    }
    text.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Parses a `--duration` value: bare seconds ("2", "0.5") or with a unit ("2s", "500ms").
/// Returns a one-line message for clap on error.
pub fn parse_duration_arg(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let parsed = match parse_non_negative_f64(text) {
        Some(seconds) => Duration::try_from_secs_f64(seconds)
            .ok()
            .map(Length::Duration),
        None => parse_length(text)
            .ok()
            .filter(|l| matches!(l, Length::Duration(_))),
    };
    match parsed {
        Some(Length::Duration(d)) if !d.is_zero() => Ok(d),
        _ => Err(format!(
            "invalid duration \"{text}\"; use positive seconds like 2 or 0.5, or 500ms"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secs(s: f64) -> Length {
        Length::Duration(Duration::from_secs_f64(s))
    }

    #[test]
    fn parses_fine_coarse_durations() {
        let spec: PhaseSpec = "fine:5s,coarse:5s".parse().unwrap();
        let phases = spec.phases();
        assert_eq!(phases.len(), 2);
        assert_eq!(
            (phases[0].label.as_str(), phases[0].work),
            ("fine", FINE_WORK)
        );
        assert_eq!(
            (phases[1].label.as_str(), phases[1].work),
            ("coarse", COARSE_WORK)
        );
        assert_eq!(phases[0].length, secs(5.0));
        assert!(spec.is_timed());
    }

    #[test]
    fn parses_work_amounts_units_and_whitespace() {
        let spec: PhaseSpec = " work=200 : 3s , work=20000:250ms,fine:0.5s "
            .parse()
            .unwrap();
        let phases = spec.phases();
        assert_eq!(phases[0].work, 200);
        assert_eq!(phases[0].length, secs(3.0));
        assert_eq!(phases[1].work, 20000);
        assert_eq!(
            phases[1].length,
            Length::Duration(Duration::from_millis(250))
        );
        assert_eq!(
            phases[2].length,
            Length::Duration(Duration::from_millis(500))
        );
    }

    #[test]
    fn parses_counted_phases() {
        let spec: PhaseSpec = "fine:100,coarse:20".parse().unwrap();
        assert!(!spec.is_timed());
        assert_eq!(spec.phases()[0].length, Length::Count(100));
        assert_eq!(spec.phases()[1].length, Length::Count(20));
    }

    #[test]
    fn rejects_bad_specs_with_specific_errors() {
        let err = |s: &str| s.parse::<PhaseSpec>().unwrap_err();
        assert_eq!(err(""), PhaseSpecError::Empty);
        assert_eq!(err("  "), PhaseSpecError::Empty);
        assert!(matches!(
            err("fine:1s,,coarse:1s"),
            PhaseSpecError::EmptyEntry { index: 1, .. }
        ));
        assert!(matches!(err("fine"), PhaseSpecError::MissingLength { .. }));
        assert!(matches!(
            err("bogus:5s"),
            PhaseSpecError::UnknownLabel { .. }
        ));
        assert!(matches!(err(":5s"), PhaseSpecError::UnknownLabel { .. }));
        assert!(matches!(err("work=abc:1s"), PhaseSpecError::BadWork { .. }));
        assert!(matches!(err("work=-3:1s"), PhaseSpecError::BadWork { .. }));
        assert!(matches!(err("fine:"), PhaseSpecError::BadLength { .. }));
        assert!(matches!(err("fine:5x"), PhaseSpecError::BadLength { .. }));
        assert!(matches!(err("fine:-1s"), PhaseSpecError::BadLength { .. }));
        assert!(matches!(err("fine:infs"), PhaseSpecError::BadLength { .. }));
        assert!(matches!(
            err("fine:1e300s"),
            PhaseSpecError::BadLength { .. }
        ));
        assert!(matches!(
            err("fine:99999999999999999999999s"),
            PhaseSpecError::BadLength { .. }
        ));
        assert!(matches!(err("fine:0s"), PhaseSpecError::ZeroLength { .. }));
        assert!(matches!(err("fine:0"), PhaseSpecError::ZeroLength { .. }));
        assert!(matches!(
            err("fine:10,coarse:1s"),
            PhaseSpecError::MixedLengths { .. }
        ));
    }

    #[test]
    fn error_messages_are_one_line_and_name_the_input() {
        let message = "bogus:5s".parse::<PhaseSpec>().unwrap_err().to_string();
        assert!(message.contains("bogus"));
        assert!(!message.contains('\n'));
    }

    #[test]
    fn duration_arg_accepts_seconds_and_units() {
        assert_eq!(parse_duration_arg("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration_arg("0.5"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration_arg("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration_arg("20ms"), Ok(Duration::from_millis(20)));
        for bad in ["0", "-1", "abc", "", "inf", "nan", "5x", "0ms"] {
            assert!(
                parse_duration_arg(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    fn label_strategy() -> impl Strategy<Value = (String, u64)> {
        prop_oneof![
            Just(("fine".to_string(), FINE_WORK)),
            Just(("coarse".to_string(), COARSE_WORK)),
            any::<u64>().prop_map(|n| (format!("work={n}"), n)),
        ]
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,40}") {
            let _ = text.parse::<PhaseSpec>();
            let _ = parse_duration_arg(&text);
        }

        #[test]
        fn near_valid_text_never_panics(text in "[a-z=0-9.:,ms -]{0,30}") {
            let _ = text.parse::<PhaseSpec>();
        }

        #[test]
        fn generated_counted_specs_round_trip(
            entries in prop::collection::vec((label_strategy(), 1u64..1_000_000), 1..6)
        ) {
            let text = entries
                .iter()
                .map(|((label, _), count)| format!("{label}:{count}"))
                .collect::<Vec<_>>()
                .join(",");
            let spec: PhaseSpec = text.parse().unwrap();
            prop_assert_eq!(spec.phases().len(), entries.len());
            for (phase, ((label, work), count)) in spec.phases().iter().zip(&entries) {
                prop_assert_eq!(&phase.label, label);
                prop_assert_eq!(phase.work, *work);
                prop_assert_eq!(phase.length, Length::Count(*count));
            }
        }

        #[test]
        fn generated_timed_specs_round_trip(
            entries in prop::collection::vec((label_strategy(), 1u64..100_000), 1..6)
        ) {
            let text = entries
                .iter()
                .map(|((label, _), ms)| format!("{label}:{ms}ms"))
                .collect::<Vec<_>>()
                .join(",");
            let spec: PhaseSpec = text.parse().unwrap();
            prop_assert!(spec.is_timed());
            for (phase, (_, ms)) in spec.phases().iter().zip(&entries) {
                let Length::Duration(d) = phase.length else { panic!("expected a duration") };
                // f64 millisecond -> seconds conversion may be off by a few ns.
                prop_assert!((d.as_secs_f64() * 1e3 - *ms as f64).abs() < 1e-6);
            }
        }
    }
}
