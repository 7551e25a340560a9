//! Whole numbers within a range, read by a visitor: a value out of range or of the wrong type is
//! refused while the value itself is read, so the error points at its own line and column (a check
//! after deserializing points at the enclosing mapping) and says what was expected.

use serde::{Deserializer, de};

/// A whole number from `min` to `max`, named `what` in errors.
#[derive(Clone, Copy, Debug)]
pub struct Count {
    /// The field's name.
    pub what: &'static str,
    /// The least value.
    pub min: u64,
    /// The greatest value.
    pub max: u64,
}

impl Count {
    /// The number, required.
    pub fn read<'de, D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(Required(self))
    }

    /// The number, or `None` when the value is null.
    pub fn read_optional<'de, D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_option(self)
    }

    fn expect(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: a whole number from {} to {}",
            self.what, self.min, self.max
        )
    }

    fn check<E: de::Error>(&self, v: i128) -> Result<u64, E> {
        if (i128::from(self.min)..=i128::from(self.max)).contains(&v) {
            Ok(v as u64)
        } else {
            Err(E::custom(format!(
                "{} {v} out of range {}..={}",
                self.what, self.min, self.max
            )))
        }
    }
}

impl<'de> de::Visitor<'de> for Count {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.expect(f)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.read(d).map(Some)
    }
}

/// [`Count`] where a value is required.
struct Required(Count);

impl de::Visitor<'_> for Required {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.expect(f)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        self.0.check(i128::from(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        self.0.check(i128::from(v))
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct T {
        #[serde(deserialize_with = "port")]
        #[allow(dead_code)]
        port: u64,
    }

    fn port<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        Count {
            what: "port",
            min: 1,
            max: 65535,
        }
        .read(d)
    }

    #[test]
    fn errors_point_at_the_value_and_say_what_was_expected() {
        let e = serde_norway::from_str::<T>("\n\nport: 0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("port 0 out of range 1..=65535"), "{e}");
        assert!(e.contains("line 3 column 7"), "{e}");
        let e = serde_norway::from_str::<T>("port: http\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("expected port: a whole number from 1 to 65535"),
            "{e}"
        );
    }
}
