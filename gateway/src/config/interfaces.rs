//! The interfaces to protect, and the hook each asks for.

use serde::{Deserialize, Serialize};

use crate::datapath::ModeRequest;

/// Checks an interface name as the kernel takes one (`dev_valid_name`): 1 to 15 bytes, no `/`,
/// `:` or white space, not `.` or `..`. The name itself when it is one.
pub fn parse_iface(name: &str) -> Result<String, String> {
    let bad = |why: &str| Err(format!("interface name '{name}' {why}"));
    if name.is_empty() {
        return bad("is empty");
    }
    if name.len() > 15 {
        return bad("is longer than 15 bytes (IFNAMSIZ)");
    }
    if name == "." || name == ".." {
        return bad("is not a name");
    }
    if name.contains(['/', ':']) || name.chars().any(char::is_whitespace) {
        return bad("has '/', ':' or white space in it");
    }
    Ok(name.to_string())
}

fn de_iface<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    parse_iface(&String::deserialize(d)?).map_err(serde::de::Error::custom)
}

/// One protected interface.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Interface {
    /// Interface name.
    #[serde(deserialize_with = "de_iface")]
    pub name: String,
    /// Hook.
    #[serde(default)]
    pub mode: ModeRequest,
}

/// The interface list; names are unique.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Interfaces(pub Vec<Interface>);

#[cfg(test)]
mod tests {
    use super::parse_iface;

    #[test]
    fn interface_names_are_what_the_kernel_takes() {
        for ok in ["eth0", "lo", "enp3s0f1np1", "a-b_c.d", "123456789012345"] {
            assert_eq!(parse_iface(ok).as_deref(), Ok(ok));
        }
        for (bad, why) in [
            ("", "is empty"),
            ("1234567890123456", "longer than 15"),
            (".", "not a name"),
            ("..", "not a name"),
            ("a/b", "'/'"),
            ("eth0:1", "':'"),
            ("eth 0", "white space"),
        ] {
            let e = parse_iface(bad).unwrap_err();
            assert!(e.contains(why) && e.contains(&format!("'{bad}'")), "{e}");
        }
    }
}
