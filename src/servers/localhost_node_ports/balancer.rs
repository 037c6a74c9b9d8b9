//! Which endpoint a localhost NodePort connection goes to: the next in turn, or under ClientIP
//! affinity the one this client address last went to while it is still an endpoint and the
//! timeout has not passed since (a sliding window, as the kernel paths' affinity). Upstream
//! picks at random and keeps one pin per listener; we take turns, which spreads connections as
//! evenly, and pin each client address (127.0.0.2 is not 127.0.0.1).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::targets::Target;

/// Client addresses pinned at once, at most; past it, expired pins go, then all of them.
const MOST_PINS: usize = 4096;

#[derive(Clone, Copy, Debug)]
struct Pin {
    endpoint: SocketAddr,
    last_used: Instant,
}

/// One listener's endpoints and the state of its choices.
#[derive(Debug)]
pub struct Balancer {
    target: Target,
    next: usize,
    pins: HashMap<IpAddr, Pin>,
}

impl Balancer {
    pub fn new(target: Target) -> Balancer {
        Balancer {
            target,
            next: 0,
            pins: HashMap::new(),
        }
    }

    /// The port and the endpoints it relays to.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Takes the port's new endpoints; a changed affinity timeout drops every pin.
    pub fn update(&mut self, target: Target) {
        if target.affinity != self.target.affinity {
            self.pins.clear();
        }
        self.target = target;
    }

    /// The endpoint for a connection from `client` at `now`; `None` without endpoints.
    pub fn pick(&mut self, client: IpAddr, now: Instant) -> Option<SocketAddr> {
        let endpoints = &self.target.endpoints;
        if endpoints.is_empty() {
            return None;
        }
        let Some(timeout) = self.target.affinity else {
            return Some(self.take_turn());
        };
        if let Some(pin) = self.pins.get_mut(&client)
            && now.saturating_duration_since(pin.last_used) <= timeout
            && endpoints.contains(&pin.endpoint)
        {
            pin.last_used = now;
            return Some(pin.endpoint);
        }
        let endpoint = self.take_turn();
        if self.pins.len() >= MOST_PINS {
            self.pins
                .retain(|_, pin| now.saturating_duration_since(pin.last_used) <= timeout);
            if self.pins.len() >= MOST_PINS {
                self.pins.clear();
            }
        }
        self.pins.insert(
            client,
            Pin {
                endpoint,
                last_used: now,
            },
        );
        Some(endpoint)
    }

    fn take_turn(&mut self) -> SocketAddr {
        let endpoints = &self.target.endpoints;
        let endpoint = endpoints[self.next % endpoints.len()];
        self.next = self.next.wrapping_add(1);
        endpoint
    }
}

/// The balancer, even if a thread panicked holding it (its state stays usable).
pub fn locked(balancer: &Mutex<Balancer>) -> MutexGuard<'_, Balancer> {
    balancer.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::{Protocol, ServicePortName};

    fn target(endpoints: &[&str], affinity: Option<u64>) -> Target {
        Target {
            port: ServicePortName::new("ns", "web", "http", Protocol::Tcp),
            endpoints: endpoints.iter().map(|e| e.parse().unwrap()).collect(),
            affinity: affinity.map(Duration::from_secs),
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn connections_take_turns() {
        let mut balancer = Balancer::new(target(&["10.0.0.1:80", "10.0.0.2:80"], None));
        let now = Instant::now();
        let picks: Vec<String> = (0..4)
            .map(|_| balancer.pick(ip("127.0.0.1"), now).unwrap().to_string())
            .collect();
        assert_eq!(
            picks,
            ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.1:80", "10.0.0.2:80"]
        );
        balancer.update(target(&[], None));
        assert_eq!(balancer.pick(ip("127.0.0.1"), now), None);
    }

    #[test]
    fn affinity_pins_each_client_within_a_sliding_window() {
        let mut balancer = Balancer::new(target(&["10.0.0.1:80", "10.0.0.2:80"], Some(10)));
        let start = Instant::now();
        let first = balancer.pick(ip("127.0.0.1"), start).unwrap();
        let other = balancer.pick(ip("127.0.0.2"), start).unwrap();
        assert_ne!(first, other, "a second client takes the next turn");
        // Each use slides the window: 8 s, 16 s, 24 s after the start stay pinned.
        for secs in [8, 16, 24] {
            let at = start + Duration::from_secs(secs);
            assert_eq!(balancer.pick(ip("127.0.0.1"), at), Some(first));
        }
        // Idle for longer than the timeout: a new turn (the next endpoint is `first` again only
        // by turn order, so check that the pin was renewed at the new time instead).
        let late = start + Duration::from_secs(40);
        let again = balancer.pick(ip("127.0.0.1"), late).unwrap();
        assert_eq!(balancer.pins[&ip("127.0.0.1")].last_used, late);
        assert_eq!(balancer.pick(ip("127.0.0.1"), late), Some(again));
    }

    #[test]
    fn a_pin_to_a_gone_endpoint_or_a_changed_timeout_is_dropped() {
        let mut balancer = Balancer::new(target(&["10.0.0.1:80", "10.0.0.2:80"], Some(10)));
        let now = Instant::now();
        let first = balancer.pick(ip("127.0.0.1"), now).unwrap();
        let remaining: Vec<&str> = ["10.0.0.1:80", "10.0.0.2:80"]
            .into_iter()
            .filter(|e| *e != first.to_string())
            .collect();
        balancer.update(target(&remaining, Some(10)));
        let moved = balancer.pick(ip("127.0.0.1"), now).unwrap();
        assert_eq!(moved.to_string(), remaining[0]);
        balancer.update(target(&["10.0.0.1:80", "10.0.0.2:80"], Some(20)));
        assert!(balancer.pins.is_empty());
    }

    #[test]
    fn pins_are_bounded() {
        let mut balancer = Balancer::new(target(&["10.0.0.1:80"], Some(10)));
        let now = Instant::now();
        for n in 0..(MOST_PINS as u32 + 10) {
            let client = IpAddr::from(std::net::Ipv4Addr::from(0x7f00_0000 + n));
            balancer.pick(client, now);
        }
        assert!(balancer.pins.len() <= MOST_PINS);
    }
}
