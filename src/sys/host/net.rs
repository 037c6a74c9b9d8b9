//! The node's own addresses and its sysctls, as the proxiers need them.

use std::net::IpAddr;
use std::path::PathBuf;

/// Why a sysctl could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("sysctl {name}: {reason}")]
pub struct SysctlError {
    pub name: String,
    pub reason: String,
}

/// The addresses on this network namespace's interfaces.
pub trait LocalAddresses: Send {
    fn addresses(&self) -> Vec<IpAddr>;

    /// The addresses of every link but `link`: an address that `link` shares with another link
    /// is kept (kubernetes#114815). A fake without links has no such link.
    fn addresses_except(&self, link: &str) -> Vec<IpAddr> {
        let _ = link;
        self.addresses()
    }
}

/// Reads them with getifaddrs.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemAddresses;

impl LocalAddresses for SystemAddresses {
    fn addresses(&self) -> Vec<IpAddr> {
        system_addresses(None)
    }

    fn addresses_except(&self, link: &str) -> Vec<IpAddr> {
        system_addresses(Some(link))
    }
}

/// Every link's addresses (one netlink dump each of links and addresses), but `except`'s.
fn system_addresses(except: Option<&str>) -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut found: Vec<IpAddr> = addrs
        .filter(|ifaddr| Some(ifaddr.interface_name.as_str()) != except)
        .filter_map(|ifaddr| ifaddr.address)
        .filter_map(|addr| {
            if let Some(v4) = addr.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Kernel settings under /proc/sys, named with slashes (`net/ipv4/conf/all/route_localnet`).
pub trait Sysctl: Send {
    fn get(&self, name: &str) -> Result<String, SysctlError>;
    fn set(&mut self, name: &str, value: &str) -> Result<(), SysctlError>;
}

/// The real /proc/sys of this network namespace.
#[derive(Clone, Debug)]
pub struct ProcSysctl {
    pub root: PathBuf,
}

impl Default for ProcSysctl {
    fn default() -> Self {
        ProcSysctl {
            root: PathBuf::from("/proc/sys"),
        }
    }
}

impl Sysctl for ProcSysctl {
    fn get(&self, name: &str) -> Result<String, SysctlError> {
        std::fs::read_to_string(self.root.join(name))
            .map(|v| v.trim().to_string())
            .map_err(|err| SysctlError {
                name: name.into(),
                reason: err.to_string(),
            })
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), SysctlError> {
        std::fs::write(self.root.join(name), value).map_err(|err| SysctlError {
            name: name.into(),
            reason: err.to_string(),
        })
    }
}

/// Sets a sysctl if it differs, logging the change as upstream does. Returns whether it changed.
pub fn ensure_sysctl(
    sysctl: &mut dyn Sysctl,
    name: &str,
    value: &str,
) -> Result<bool, SysctlError> {
    if sysctl.get(name).is_ok_and(|current| current == value) {
        return Ok(false);
    }
    sysctl.set(name, value)?;
    tracing::info!(name, value, "Set sysctl");
    Ok(true)
}

/// An in-memory sysctl tree for tests.
#[derive(Clone, Debug, Default)]
pub struct FakeSysctl {
    pub values: std::collections::BTreeMap<String, String>,
}

impl Sysctl for FakeSysctl {
    fn get(&self, name: &str) -> Result<String, SysctlError> {
        self.values.get(name).cloned().ok_or_else(|| SysctlError {
            name: name.into(),
            reason: "not set".into(),
        })
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), SysctlError> {
        self.values.insert(name.into(), value.into());
        Ok(())
    }
}

/// A fixed list of addresses for tests.
#[derive(Clone, Debug, Default)]
pub struct FixedAddresses(pub Vec<IpAddr>);

impl LocalAddresses for FixedAddresses {
    fn addresses(&self) -> Vec<IpAddr> {
        self.0.clone()
    }
}
