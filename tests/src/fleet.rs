//! Two gateway nodes behind an ECMP route (issue 26): each node is a [`TestNet`] (its gateway
//! namespace, where a daemon attaches, and its peer namespace, here a link router), and a router
//! namespace reaches a service address both nodes hold (`VIP`) through a resilient nexthop group
//! over the two links, its flows spread by their 5-tuple. Clients run in a namespace of their own
//! behind the router, so that every packet of theirs, a reset their kernel sends without a
//! socket included, is forwarded and hashed by its 5-tuple as a router hashes other machines'
//! traffic (from the router's own namespace, such resets took the other path half the time, and
//! the node that had the connection never saw them).
//!
//! ```text
//!   clients (CLIENT) --10.90.0.0/24-- router --10.90.1.0/24--  peer A  --10.99.0.0/24--  gw A (VIP on lo)
//!                          nexthop group 1/2 --10.90.2.0/24--  peer B  --10.99.0.0/24--  gw B (VIP on lo)
//! ```

use crate::netns::{GW_V4, PEER_V4, TestNet, in_netns, must, sh, unique};

/// The address both nodes serve (on their loopback).
pub const VIP: &str = "10.97.0.1";
/// The clients' address (in their namespace).
pub const CLIENT: &str = "10.90.0.1";
/// The router's address on the clients' link.
const CLIENT_GATEWAY: &str = "10.90.0.254";
/// Nexthop group id of the route to [`VIP`].
const GROUP: &str = "10";
/// Buckets of the resilient group.
const BUCKETS: &str = "64";
/// Seconds a bucket must be idle before it moves to rebalance the group (Linux 6.18 moved a
/// joining member's share at once all the same).
const IDLE_TIMER: &str = "120";

/// The two nodes and the router.
pub struct Fleet {
    /// The nodes: their gateway namespaces and veths, as single-node tests know them.
    pub nodes: [TestNet; 2],
    /// The router.
    pub router_ns: String,
    /// Where the clients run (behind the router).
    pub clients_ns: String,
}

impl Fleet {
    /// Builds the namespaces, links and routes, with both nodes in the group.
    pub fn new() -> Self {
        let id = unique();
        let fleet = Fleet {
            nodes: [TestNet::new(), TestNet::new()],
            router_ns: format!("gwt{id}r"),
            clients_ns: format!("gwt{id}c"),
        };
        let (r, c) = (fleet.router_ns.as_str(), fleet.clients_ns.as_str());
        for ns in [r, c] {
            must("ip", &["netns", "add", ns]);
            ip(ns, &["link", "set", "lo", "up"]);
        }
        let (r_if, c_if) = (format!("{r}c"), format!("{c}r"));
        must(
            "ip",
            &[
                "link", "add", &r_if, "netns", r, "type", "veth", "peer", "name", &c_if, "netns", c,
            ],
        );
        ip(c, &["addr", "add", &format!("{CLIENT}/24"), "dev", &c_if]);
        ip(c, &["link", "set", &c_if, "up"]);
        ip(
            r,
            &["addr", "add", &format!("{CLIENT_GATEWAY}/24"), "dev", &r_if],
        );
        ip(r, &["link", "set", &r_if, "up"]);
        ip(c, &["route", "add", "default", "via", CLIENT_GATEWAY]);
        in_router(r, "sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
        // Flows spread by their ports too, as a balancer's L4 hash does.
        in_router(
            r,
            "sysctl",
            &["-qw", "net.ipv4.fib_multipath_hash_policy=1"],
        );
        for (i, node) in fleet.nodes.iter().enumerate() {
            let n = i + 1;
            let (r_if, p_if) = (format!("{r}l{n}"), format!("{}l{n}", node.peer_ns));
            let (r_ip, p_ip) = (format!("10.90.{n}.1"), format!("10.90.{n}.2"));
            must(
                "ip",
                &[
                    "link",
                    "add",
                    &r_if,
                    "netns",
                    r,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    &p_if,
                    "netns",
                    &node.peer_ns,
                ],
            );
            let p = node.peer_ns.as_str();
            ip(r, &["addr", "add", &format!("{r_ip}/24"), "dev", &r_if]);
            ip(r, &["link", "set", &r_if, "up"]);
            ip(p, &["addr", "add", &format!("{p_ip}/24"), "dev", &p_if]);
            ip(p, &["link", "set", &p_if, "up"]);
            in_router(p, "sysctl", &["-qw", "net.ipv4.ip_forward=1"]);
            ip(p, &["route", "add", &format!("{CLIENT}/32"), "via", &r_ip]);
            ip(p, &["route", "add", &format!("{VIP}/32"), "via", GW_V4]);
            let g = node.gw_ns.as_str();
            ip(g, &["addr", "add", &format!("{VIP}/32"), "dev", "lo"]);
            ip(
                g,
                &["route", "add", &format!("{CLIENT}/32"), "via", PEER_V4],
            );
            ip(
                r,
                &[
                    "nexthop",
                    "add",
                    "id",
                    &n.to_string(),
                    "via",
                    &p_ip,
                    "dev",
                    &r_if,
                ],
            );
        }
        fleet.group(&[0, 1], "add");
        ip(r, &["route", "add", &format!("{VIP}/32"), "nhid", GROUP]);
        fleet
    }

    /// Makes the group the nodes `members` (indexes into [`Fleet::nodes`]): a node left out
    /// leaves it (its buckets go to the others at once, theirs stay), a node put back joins it
    /// (Linux gives it its share of the buckets at once, whatever flows they carry).
    pub fn set_members(&self, members: &[usize]) {
        self.group(members, "replace");
    }

    fn group(&self, members: &[usize], verb: &str) {
        let ids: Vec<String> = members.iter().map(|i| (i + 1).to_string()).collect();
        ip(
            &self.router_ns,
            &[
                "nexthop",
                verb,
                "id",
                GROUP,
                "group",
                &ids.join("/"),
                "type",
                "resilient",
                "buckets",
                BUCKETS,
                "idle_timer",
                IDLE_TIMER,
            ],
        );
    }

    /// Runs `f` in the clients' namespace.
    pub fn in_clients<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        in_netns(&self.clients_ns, f)
    }
}

impl Default for Fleet {
    fn default() -> Self {
        Self::new()
    }
}

/// `ip -n NS ARGS`, which must succeed.
fn ip(ns: &str, args: &[&str]) {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    must("ip", &all);
}

/// `ip netns exec NS PROGRAM ARGS`, which must succeed.
fn in_router(ns: &str, program: &str, args: &[&str]) {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    must("ip", &all);
}

impl Drop for Fleet {
    fn drop(&mut self) {
        // The nodes' namespaces go with their TestNets (and the links with them).
        let _ = sh("ip", &["netns", "del", &self.router_ns]);
        let _ = sh("ip", &["netns", "del", &self.clients_ns]);
    }
}
