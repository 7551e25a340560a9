//! This node's name in a fleet: the `node` label of `gateway_build_info`, by which an operator
//! tells one node's figures from another's and joins them (`* on(instance) group_left(node)
//! gateway_build_info`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

/// Longest name, in bytes (a DNS label's).
const MAX_LEN: usize = 63;

/// A node's name: 1 to 63 letters, digits, `.`, `-` or `_`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct NodeName(String);

impl NodeName {
    /// `name` if it is a valid node name; else what is wrong with it.
    pub fn new(name: &str) -> Result<Self, String> {
        if name.is_empty() || name.len() > MAX_LEN {
            return Err(format!(
                "node: {name:?} is {} bytes long: a node name is 1 to {MAX_LEN}",
                name.len()
            ));
        }
        if let Some(c) = name.chars().find(|c| !allowed(*c)) {
            return Err(format!(
                "node: {name:?} has {c:?}: a node name is letters, digits, '.', '-' and '_'"
            ));
        }
        Ok(NodeName(name.to_owned()))
    }

    /// This host's name (its first label), made a valid node name: other characters become
    /// `-`, and it is cut to 63 bytes; `localhost` when the host has none.
    pub fn this_host() -> Self {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default();
        let first = host.split('.').next().unwrap_or_default();
        let name: String = first
            .chars()
            .map(|c| if allowed(c) { c } else { '-' })
            .take(MAX_LEN)
            .collect();
        NodeName::new(&name).unwrap_or_else(|_| NodeName("localhost".into()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for NodeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        NodeName::new(&name).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_label_safe_and_bounded() {
        assert_eq!(NodeName::new("gw-a.eu_1").unwrap().as_str(), "gw-a.eu_1");
        for bad in ["", "a b", "node/1", "ü", &"x".repeat(64)] {
            let err = NodeName::new(bad).unwrap_err();
            assert!(err.starts_with("node: "), "{err}");
        }
        assert!(NodeName::new(&"x".repeat(63)).is_ok());
    }

    #[test]
    fn this_hosts_name_is_a_valid_node_name() {
        let name = NodeName::this_host();
        assert_eq!(NodeName::new(name.as_str()), Ok(name.clone()));
        let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
        let first = host.split('.').next().unwrap();
        if NodeName::new(first).is_ok() {
            assert_eq!(name.as_str(), first);
        }
    }
}
