//! Go's `time.Duration` text form (`30s`, `1h0m0s`, `1.5m`, `0`), as `metav1.Duration` carries it in
//! a KubeProxyConfiguration. Parsing follows Go's `time.ParseDuration`; printing follows `String()`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// A non-negative duration read from and written as Go's duration syntax.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(pub Duration);

/// Why a duration string was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DurationError {
    /// The text is not a Go duration.
    #[error("invalid duration {0:?}")]
    Syntax(String),
    /// The text is a Go duration but below zero, which no field of ours accepts.
    #[error("duration {0:?} is negative")]
    Negative(String),
    /// The value does not fit in 64-bit nanoseconds, as in Go.
    #[error("duration {0:?} is out of range")]
    Overflow(String),
}

const UNITS: [(&str, u128); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("μs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

impl GoDuration {
    /// Builds one from whole seconds.
    pub const fn from_secs(secs: u64) -> Self {
        GoDuration(Duration::from_secs(secs))
    }

    /// True for a zero duration, which upstream's defaulting treats as "unset".
    pub fn is_zero(&self) -> bool {
        self.0.is_zero()
    }

    /// Parses Go's syntax: an optional sign, then one or more decimal numbers each with a unit.
    pub fn parse(text: &str) -> Result<Self, DurationError> {
        let syntax = || DurationError::Syntax(text.to_string());
        let (negative, mut rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        if rest == "0" {
            return Ok(GoDuration::default());
        }
        if rest.is_empty() {
            return Err(syntax());
        }
        let mut total_nanos: u128 = 0;
        while !rest.is_empty() {
            let number_len = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(syntax)?;
            let (number, after) = rest.split_at(number_len);
            let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
            if int_part.is_empty() && frac_part.is_empty() {
                return Err(syntax());
            }
            let (unit, scale) = UNITS
                .iter()
                .filter(|(unit, _)| after.starts_with(unit))
                .max_by_key(|(unit, _)| unit.len())
                .ok_or_else(syntax)?;
            let whole: u128 = if int_part.is_empty() {
                0
            } else {
                int_part
                    .parse()
                    .map_err(|_| DurationError::Overflow(text.into()))?
            };
            let mut nanos = whole
                .checked_mul(*scale)
                .ok_or_else(|| DurationError::Overflow(text.into()))?;
            let mut place = *scale;
            for digit in frac_part.bytes() {
                if !digit.is_ascii_digit() {
                    return Err(syntax());
                }
                place /= 10;
                nanos += u128::from(digit - b'0') * place;
            }
            total_nanos = total_nanos
                .checked_add(nanos)
                .filter(|n| *n <= i64::MAX as u128)
                .ok_or_else(|| DurationError::Overflow(text.into()))?;
            rest = &after[unit.len()..];
        }
        if negative && total_nanos > 0 {
            return Err(DurationError::Negative(text.to_string()));
        }
        let secs = (total_nanos / 1_000_000_000) as u64;
        let sub = (total_nanos % 1_000_000_000) as u32;
        Ok(GoDuration(Duration::new(secs, sub)))
    }
}

impl fmt::Display for GoDuration {
    /// Prints as Go's `Duration.String()` does for the values configs hold: `0s`, `1.5s`, `15m0s`, `24h0m0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0s");
        }
        if nanos < 1_000_000_000 {
            let (value, unit) = if nanos < 1_000 {
                (nanos as f64, "ns")
            } else if nanos < 1_000_000 {
                (nanos as f64 / 1e3, "µs")
            } else {
                (nanos as f64 / 1e6, "ms")
            };
            return write!(f, "{value}{unit}");
        }
        let total_secs = self.0.as_secs();
        let hours = total_secs / 3600;
        let minutes = (total_secs % 3600) / 60;
        let secs = total_secs % 60;
        let sub = self.0.subsec_nanos();
        let seconds = if sub == 0 {
            format!("{secs}")
        } else {
            let frac = format!("{sub:09}");
            format!("{secs}.{}", frac.trim_end_matches('0'))
        };
        if hours > 0 {
            write!(f, "{hours}h{minutes}m{seconds}s")
        } else if minutes > 0 {
            write!(f, "{minutes}m{seconds}s")
        } else {
            write!(f, "{seconds}s")
        }
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        GoDuration::parse(&text).map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_forms() {
        let cases = [
            ("0", 0),
            ("0s", 0),
            ("30s", 30_000),
            ("1s", 1_000),
            ("15m0s", 900_000),
            ("24h0m0s", 86_400_000),
            ("1h", 3_600_000),
            ("1.5s", 1_500),
            ("1m30s", 90_000),
            ("250ms", 250),
            (".5s", 500),
            ("+2s", 2_000),
            ("-0s", 0),
        ];
        for (text, millis) in cases {
            assert_eq!(
                GoDuration::parse(text).unwrap().0.as_millis(),
                millis,
                "{text}"
            );
        }
        assert_eq!(GoDuration::parse("10us").unwrap().0.as_nanos(), 10_000);
        assert_eq!(GoDuration::parse("10µs").unwrap().0.as_nanos(), 10_000);
    }

    #[test]
    fn refuses_bad_forms() {
        for text in ["", "s", "10", "1x", "1.2.3s", "h1", "1 s", "ten seconds"] {
            assert_eq!(
                GoDuration::parse(text),
                Err(DurationError::Syntax(text.into())),
                "{text}"
            );
        }
        assert_eq!(
            GoDuration::parse("-1s"),
            Err(DurationError::Negative("-1s".into()))
        );
        assert!(matches!(
            GoDuration::parse("99999999999h"),
            Err(DurationError::Overflow(_))
        ));
    }

    #[test]
    fn prints_like_go() {
        let cases = [
            (0, "0s"),
            (30, "30s"),
            (900, "15m0s"),
            (86_400, "24h0m0s"),
            (3_600, "1h0m0s"),
            (90, "1m30s"),
        ];
        for (secs, text) in cases {
            assert_eq!(GoDuration::from_secs(secs).to_string(), text);
        }
        assert_eq!(GoDuration(Duration::from_millis(1_500)).to_string(), "1.5s");
        assert_eq!(GoDuration(Duration::from_millis(250)).to_string(), "250ms");
    }
}
