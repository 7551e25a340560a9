//! Places per client address: a bound on what one client holds at once (connections to the
//! metrics endpoint, a proxy's backend places), so that one address cannot take all of a
//! resource every other client needs, as nginx's `limit_conn` bounds connections per address.
//!
//! A client is an IPv4 address, or an IPv6 /64 (one host is commonly given a whole /64, and
//! picks addresses inside it at will). The table holds an entry only while that client holds a
//! place, so it is never larger than the places held.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

/// The places clients hold, at most `per_client` each.
#[derive(Debug)]
pub struct ClientPlaces {
    per_client: AtomicUsize,
    held: Mutex<HashMap<Client, usize>>,
}

/// One client's place, given back when dropped.
#[derive(Debug)]
pub struct ClientPlace {
    places: Arc<ClientPlaces>,
    client: Client,
}

/// Who holds places: an IPv4 address or an IPv6 /64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Client {
    V4(u32),
    V6(u64),
}

impl Client {
    fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Client::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Client::V4(u32::from(v4)),
                None => Client::V6((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

impl ClientPlaces {
    /// Places of at most `per_client` per client (0: unbounded).
    pub fn new(per_client: usize) -> Arc<Self> {
        Arc::new(ClientPlaces {
            per_client: AtomicUsize::new(per_client),
            held: Mutex::new(HashMap::new()),
        })
    }

    /// A place for the client at `ip`, unless it holds its bound already.
    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Option<ClientPlace> {
        let client = Client::of(ip);
        let bound = self.per_client();
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(client).or_insert(0);
        if bound != 0 && *n >= bound {
            return None;
        }
        *n += 1;
        Some(ClientPlace {
            places: self.clone(),
            client,
        })
    }

    /// Places held by the client at `ip`.
    pub fn held_by(&self, ip: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(&Client::of(ip)).copied().unwrap_or(0)
    }

    /// Clients holding a place.
    pub fn clients(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The bound per client (0: none).
    pub fn per_client(&self) -> usize {
        self.per_client.load(Ordering::Relaxed)
    }

    /// Sets the bound per client (a reload): places held past a lower one are kept until they
    /// end, and no new one is given meanwhile.
    pub fn set_per_client(&self, per_client: usize) {
        self.per_client.store(per_client, Ordering::Relaxed);
    }
}

impl Drop for ClientPlace {
    fn drop(&mut self) {
        let mut held = self.places.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_holds_at_most_its_bound_and_gets_places_back_when_they_end() {
        let places = ClientPlaces::new(2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let first = places.take(a).unwrap();
        let _second = places.take(a).unwrap();
        assert!(places.take(a).is_none(), "a third place for one address");
        let _other = places.take(b).expect("another address is not bound by it");
        drop(first);
        assert!(places.take(a).is_some(), "a place given back is free again");
    }

    #[test]
    fn an_ipv6_64_is_one_client_and_a_mapped_ipv4_address_is_the_address() {
        let places = ClientPlaces::new(1);
        let _one = places.take("2001:db8::1".parse().unwrap()).unwrap();
        assert!(places.take("2001:db8::ffff:1".parse().unwrap()).is_none());
        assert!(places.take("2001:db8:0:1::1".parse().unwrap()).is_some());
        let _v4 = places.take("192.0.2.7".parse().unwrap()).unwrap();
        assert!(places.take("::ffff:192.0.2.7".parse().unwrap()).is_none());
    }

    #[test]
    fn the_table_holds_only_clients_that_hold_places() {
        let places = ClientPlaces::new(3);
        let held: Vec<_> = (0..100u32)
            .map(|i| places.take(IpAddr::from(i.to_be_bytes())).unwrap())
            .collect();
        assert_eq!(places.clients(), 100);
        drop(held);
        assert_eq!(places.clients(), 0);
        let unbounded = ClientPlaces::new(0);
        let many: Vec<_> = (0..50)
            .map(|_| unbounded.take("192.0.2.9".parse().unwrap()).unwrap())
            .collect();
        assert_eq!(unbounded.held_by("192.0.2.9".parse().unwrap()), 50);
        drop(many);
    }
}
