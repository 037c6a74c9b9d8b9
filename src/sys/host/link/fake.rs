//! A stateful fake of the node's links for tests: dummy links by name and index, and the
//! addresses bound to each, with the kernel's refusals (no such link; a dummy link where the
//! kernel has no dummy driver) and every change counted.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::{DummyLinks, LinkError};
use crate::sys::netlink::NetlinkError;

const ENODEV: i32 = 19;
const EOPNOTSUPP: i32 = 95;

#[derive(Clone, Debug, Default)]
pub struct FakeLinks {
    /// Links by name: their index and bound addresses.
    pub links: BTreeMap<String, (u32, BTreeSet<IpAddr>)>,
    /// Addresses bound or unbound, and links created.
    pub writes: usize,
    /// The kernel has no dummy driver (this machine's): creating one is refused.
    pub no_dummy_driver: bool,
}

fn failed(operation: String, errno: i32) -> LinkError {
    LinkError {
        operation,
        cause: NetlinkError::Errno(errno),
    }
}

impl FakeLinks {
    /// The addresses bound to link `name`.
    pub fn bound(&self, name: &str) -> BTreeSet<IpAddr> {
        self.links
            .get(name)
            .map(|(_, bound)| bound.clone())
            .unwrap_or_default()
    }

    fn by_index(
        &mut self,
        index: u32,
        operation: String,
    ) -> Result<&mut BTreeSet<IpAddr>, LinkError> {
        self.links
            .values_mut()
            .find(|(i, _)| *i == index)
            .map(|(_, bound)| bound)
            .ok_or_else(|| failed(operation, ENODEV))
    }
}

impl DummyLinks for FakeLinks {
    fn ensure_dummy(&mut self, name: &str) -> Result<u32, LinkError> {
        if let Some((index, _)) = self.links.get(name) {
            return Ok(*index);
        }
        if self.no_dummy_driver {
            return Err(failed(format!("create dummy link {name}"), EOPNOTSUPP));
        }
        // Index 1 is the loopback's.
        let index = self.links.values().map(|(i, _)| *i).max().unwrap_or(1) + 1;
        self.links
            .insert(name.to_string(), (index, BTreeSet::new()));
        self.writes += 1;
        Ok(index)
    }

    fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, LinkError> {
        Ok(self
            .by_index(index, "list addresses".into())?
            .iter()
            .copied()
            .collect())
    }

    fn add_address(&mut self, index: u32, ip: IpAddr) -> Result<(), LinkError> {
        if self.by_index(index, format!("bind {ip}"))?.insert(ip) {
            self.writes += 1;
        }
        Ok(())
    }

    fn delete_address(&mut self, index: u32, ip: IpAddr) -> Result<(), LinkError> {
        if self.by_index(index, format!("unbind {ip}"))?.remove(&ip) {
            self.writes += 1;
        }
        Ok(())
    }
}

/// The names of the node's links, shared with the test that adds and removes them.
#[derive(Clone, Debug, Default)]
pub struct FakeLinkNames(pub std::sync::Arc<std::sync::Mutex<BTreeSet<String>>>);

impl FakeLinkNames {
    pub fn of(names: &[&str]) -> Self {
        let names = names.iter().map(|name| name.to_string()).collect();
        FakeLinkNames(std::sync::Arc::new(std::sync::Mutex::new(names)))
    }

    pub fn set(&self, names: &[&str]) {
        let mut held = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *held = names.iter().map(|name| name.to_string()).collect();
    }
}

impl super::LinkNames for FakeLinkNames {
    fn names(&mut self) -> Result<BTreeSet<String>, LinkError> {
        Ok(self.0.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }
}
