//! Simulated time: integer nanoseconds, and the duration syntax scenario files use.
//!
//! Time is an integer so that a run is reproducible bit for bit: no float rounding ever decides
//! which of two events comes first. Scenario files may write a duration as an integer number of
//! nanoseconds or as a string with a unit (`"37us"`, `"1.5ms"`, `"2s"`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Nanoseconds of simulated time.
pub type Ns = u64;

pub const US: Ns = 1_000;
pub const MS: Ns = 1_000_000;
pub const SEC: Ns = 1_000_000_000;

/// A duration read from a scenario file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Dur(pub Ns);

impl Dur {
    pub fn ns(self) -> Ns {
        self.0
    }
}

/// Parse `"250"`, `"250ns"`, `"37us"`, `"1.5ms"`, `"2s"` into nanoseconds.
pub fn parse_duration(text: &str) -> Result<Ns, String> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let number = number.replace('_', "");
    let scale: f64 = match unit.trim() {
        "" | "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        other => {
            return Err(format!(
                "unknown unit {other:?} in duration {text:?} (use ns, us, ms or s)"
            ))
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. \"37us\", \"2ms\")"))?;
    let ns = value * scale;
    if !ns.is_finite() || ns < 0.0 || ns > u64::MAX as f64 / 2.0 {
        return Err(format!("duration {text:?} is out of range"));
    }
    Ok(ns.round() as Ns)
}

/// Human-readable rendering used in tables: picks the largest unit that keeps a number ≥ 1.
pub fn fmt_ns(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.3}s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2}ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1}us", ns / 1e3)
    } else {
        format!("{ns:.0}ns")
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&fmt_ns(self.0 as f64))
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration: nanoseconds as an integer, or a string like \"37us\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Dur, E> {
                Ok(Dur(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Dur, E> {
                u64::try_from(v)
                    .map(Dur)
                    .map_err(|_| E::custom(format!("negative duration {v}")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Dur, E> {
                parse_duration(v).map(Dur).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("250"), Ok(250));
        assert_eq!(parse_duration("37us"), Ok(37_000));
        assert_eq!(parse_duration("1.5ms"), Ok(1_500_000));
        assert_eq!(parse_duration("2s"), Ok(2 * SEC));
        assert_eq!(parse_duration("1_000ns"), Ok(1_000));
        assert!(parse_duration("3 parsecs").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("-1ms").is_err());
    }
}
