//! Can this node run the IPVS proxier? The kernel must speak the IPVS generic netlink family,
//! dummy links must be creatable (kube-ipvs0), ipset must be 6.0 or newer, and the configured
//! scheduler must be usable (checked as upstream does, with a throwaway virtual server on
//! 198.51.100.0:20000/TCP, an address from TEST-NET-2).

use std::process::Command;

use crate::model::Protocol;
use crate::sys::host::link::{LinkError, Links};
use crate::sys::ipvs::{IpvsClient, IpvsError, VirtualServer};

/// Why the IPVS proxier cannot run here.
#[derive(Debug, thiserror::Error)]
pub enum IpvsUnsupported {
    /// The kernel has no IPVS, or it cannot be reached.
    #[error(transparent)]
    Ipvs(#[from] IpvsError),
    /// kube-ipvs0 could not be created.
    #[error("dummy links cannot be created: {0}")]
    Dummy(LinkError),
    /// ipset is missing or too old.
    #[error("ipset: {0}")]
    Ipset(String),
    /// The kernel refused a virtual server with the configured scheduler.
    #[error("scheduler {scheduler:?} cannot be used: {cause}")]
    Scheduler { scheduler: String, cause: IpvsError },
    /// The checks passed but the proxier could not open the kernel interfaces.
    #[error("the IPVS proxier could not start: {0}")]
    Start(String),
}

const PROBE_LINK: &str = "kprs-probe0";

/// Checks what IPVS mode needs, in this thread's network namespace.
pub fn check_support(scheduler: &str) -> Result<(), IpvsUnsupported> {
    let mut ipvs = IpvsClient::connect()?;
    let mut links = Links::open().map_err(IpvsUnsupported::Dummy)?;
    links
        .ensure_dummy(PROBE_LINK)
        .map_err(IpvsUnsupported::Dummy)?;
    links.delete(PROBE_LINK).map_err(IpvsUnsupported::Dummy)?;
    check_ipset()?;
    let scheduler = if scheduler.is_empty() {
        "rr"
    } else {
        scheduler
    };
    if ipvs.services()?.iter().any(|vs| vs.scheduler == scheduler) {
        return Ok(());
    }
    let probe = VirtualServer {
        address: std::net::Ipv4Addr::new(198, 51, 100, 0).into(),
        protocol: Protocol::Tcp,
        port: 20000,
        scheduler: scheduler.to_string(),
        flags: 0,
        timeout: 0,
    };
    ipvs.add_service(&probe)
        .map_err(|cause| IpvsUnsupported::Scheduler {
            scheduler: scheduler.into(),
            cause,
        })?;
    ipvs.delete_service(&probe)?;
    Ok(())
}

fn check_ipset() -> Result<(), IpvsUnsupported> {
    let output = Command::new("ipset")
        .arg("version")
        .output()
        .map_err(|err| IpvsUnsupported::Ipset(format!("cannot run ipset: {err}")))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let version = parse_ipset_version(&text)
        .ok_or_else(|| IpvsUnsupported::Ipset(format!("unreadable version {:?}", text.trim())))?;
    if version < (6, 0) {
        return Err(IpvsUnsupported::Ipset(format!(
            "version {}.{} is older than 6.0",
            version.0, version.1
        )));
    }
    Ok(())
}

/// Reads `ipset v7.17, protocol version: 7`.
fn parse_ipset_version(text: &str) -> Option<(u32, u32)> {
    let start = text.find(" v")? + 2;
    let rest = &text[start..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(rest.len());
    let (major, minor) = rest[..end].split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipset_versions() {
        assert_eq!(
            parse_ipset_version("ipset v7.17, protocol version: 7\n"),
            Some((7, 17))
        );
        assert_eq!(
            parse_ipset_version("ipset v6.38, protocol version: 6"),
            Some((6, 38))
        );
        assert_eq!(parse_ipset_version("garbage"), None);
    }
}
