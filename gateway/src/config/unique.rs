//! Unique entries: a second pass over a document that already parsed, refusing a duplicate with
//! its own line.

use std::fmt;

use serde::{Deserialize, Deserializer, de::Error as _};

use super::{Interface, Service};

/// The duplicate check, a second pass over a document that already parsed: every element of
/// `interfaces` and `services` is read through a map visitor that refuses a key seen before. An
/// error raised inside a visitor is the only kind serde_norway gives a position, so this pass
/// names the duplicate's own line.
#[derive(Deserialize)]
pub(super) struct DuplicateCheck {
    #[serde(default, deserialize_with = "unique_interfaces")]
    #[allow(dead_code)]
    interfaces: (),
    #[serde(default, deserialize_with = "unique_services")]
    #[allow(dead_code)]
    services: (),
}

fn unique_interfaces<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    unique_seq(
        d,
        |i: &Interface| i.name.clone(),
        |i, j, k| format!("duplicate interface '{}' (entries {j} and {k})", i.name),
    )
}

fn unique_services<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    unique_seq(d, Service::key, |s, j, k| {
        format!(
            "duplicate service {}/{} (services[{j}] and services[{k}])",
            s.proto().name(),
            s.port.0
        )
    })
}

type Describe<T> = fn(&T, usize, usize) -> String;

fn unique_seq<'de, D, T, K>(d: D, key: fn(&T) -> K, describe: Describe<T>) -> Result<(), D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
    K: PartialEq,
{
    struct Element<'a, T, K> {
        seen: &'a [T],
        key: fn(&T) -> K,
        describe: Describe<T>,
    }
    impl<'de, T: Deserialize<'de>, K: PartialEq> serde::de::DeserializeSeed<'de> for Element<'_, T, K> {
        type Value = T;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de, T: Deserialize<'de>, K: PartialEq> serde::de::Visitor<'de> for Element<'_, T, K> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a mapping")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            let item = T::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
            let k = (self.key)(&item);
            match self.seen.iter().position(|o| (self.key)(o) == k) {
                Some(j) => Err(A::Error::custom((self.describe)(&item, j, self.seen.len()))),
                None => Ok(item),
            }
        }
    }
    struct Seq<T, K> {
        key: fn(&T) -> K,
        describe: Describe<T>,
    }
    impl<'de, T: Deserialize<'de>, K: PartialEq> serde::de::Visitor<'de> for Seq<T, K> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a sequence")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut seen: Vec<T> = Vec::new();
            while let Some(item) = seq.next_element_seed(Element {
                seen: &seen,
                key: self.key,
                describe: self.describe,
            })? {
                seen.push(item);
            }
            Ok(())
        }
    }
    d.deserialize_seq(Seq { key, describe })
}
