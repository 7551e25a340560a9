//! Durations as operators write them (`500ms`, `10s`, `2m`, `1h`), bounded: every timeout,
//! period and lifetime of the config.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error as _};

/// A duration written the human way (`500ms`, `10s`, `2m`, `1h`), greater than zero and at
/// most [`MAX_SPAN`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span(pub Duration);

/// The longest duration any setting takes: 30 days. Past it a value is a typo (`99999999999h`
/// read as 11 million years, and overflowed deadlines), never a timeout anyone means.
pub const MAX_SPAN: Duration = Duration::from_secs(30 * 86_400);

impl std::str::FromStr for Span {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match humantime::parse_duration(text) {
            Ok(v) if v > MAX_SPAN => Err(format!(
                "duration '{text}' is over the longest any setting takes, 30 days"
            )),
            Ok(v) if !v.is_zero() => Ok(Span(v)),
            Ok(_) => Err(format!("duration '{text}' must be above zero")),
            Err(e) => Err(format!(
                "invalid duration '{text}' ({e}; examples: 500ms, 10s, 2m, 1h)"
            )),
        }
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(D::Error::custom)
    }
}

impl Serialize for Span {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}
