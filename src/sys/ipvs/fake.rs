//! A stateful fake of the kernel's IPVS for tests: virtual servers and their real servers, with
//! the kernel's refusals (a virtual server added twice, a change to one that is missing, an
//! unknown scheduler, a real server added twice or changed while missing), and every write
//! counted.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::codec::{CMD_DEL_DEST, CMD_NEW_DEST, CMD_SET_DEST};
use super::{Ipvs, IpvsError, RealServer, VirtualServer};
use crate::sys::netlink::NetlinkError;

const ENOENT: i32 = 2;
const ESRCH: i32 = 3;
const EEXIST: i32 = 17;
const EINVAL: i32 = 22;

/// The schedulers a kernel with every IPVS module loaded knows.
const SCHEDULERS: [&str; 11] = [
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh",
];

/// A virtual server and its real servers, by address and port.
pub type HeldService = (VirtualServer, BTreeMap<(IpAddr, u16), RealServer>);

/// The fake's state: virtual servers by key.
#[derive(Clone, Debug, Default)]
pub struct FakeIpvs {
    pub services: BTreeMap<String, HeldService>,
    /// Writes taken (additions, updates, deletions of either kind).
    pub writes: usize,
    /// Virtual servers on these addresses are refused (EINVAL), as a kernel refuses what it
    /// cannot take.
    pub refuse_addresses: Vec<IpAddr>,
    pub timeouts: Option<(u32, u32, u32)>,
}

fn errno(operation: String, errno: i32) -> IpvsError {
    IpvsError::Netlink {
        operation,
        cause: NetlinkError::Errno(errno),
    }
}

impl FakeIpvs {
    fn known_scheduler(vs: &VirtualServer) -> Result<(), IpvsError> {
        // The kernel looks the name up as given: an empty one is no scheduler (wlc is
        // ipvsadm's default, not the kernel's).
        if SCHEDULERS.contains(&vs.scheduler.as_str()) {
            Ok(())
        } else {
            Err(errno(format!("scheduler {}", vs.scheduler), ENOENT))
        }
    }

    /// The real servers of every virtual server, as the kernel would list them.
    pub fn state(&self) -> BTreeMap<String, (VirtualServer, Vec<RealServer>)> {
        self.services
            .iter()
            .map(|(key, (vs, reals))| {
                (key.clone(), (vs.clone(), reals.values().cloned().collect()))
            })
            .collect()
    }
}

impl Ipvs for FakeIpvs {
    fn services(&mut self) -> Result<Vec<VirtualServer>, IpvsError> {
        Ok(self.services.values().map(|(vs, _)| vs.clone()).collect())
    }

    fn service(&mut self, vs: &VirtualServer) -> Result<Option<VirtualServer>, IpvsError> {
        Ok(self.services.get(&vs.key()).map(|(vs, _)| vs.clone()))
    }

    fn add_service(&mut self, vs: &VirtualServer) -> Result<(), IpvsError> {
        let key = vs.key();
        if self.refuse_addresses.contains(&vs.address) {
            return Err(errno(format!("add {key}"), EINVAL));
        }
        if self.services.contains_key(&key) {
            return Err(errno(format!("add {key}"), EEXIST));
        }
        Self::known_scheduler(vs)?;
        self.services.insert(key, (vs.clone(), BTreeMap::new()));
        self.writes += 1;
        Ok(())
    }

    fn update_service(&mut self, vs: &VirtualServer) -> Result<(), IpvsError> {
        let key = vs.key();
        if !self.services.contains_key(&key) {
            return Err(errno(format!("update {key}"), ESRCH));
        }
        Self::known_scheduler(vs)?;
        let (held, _) = self
            .services
            .get_mut(&key)
            .ok_or_else(|| errno(format!("update {key}"), ESRCH))?;
        *held = vs.clone();
        self.writes += 1;
        Ok(())
    }

    fn delete_service(&mut self, vs: &VirtualServer) -> Result<(), IpvsError> {
        let key = vs.key();
        self.services
            .remove(&key)
            .ok_or_else(|| errno(format!("delete {key}"), ESRCH))?;
        self.writes += 1;
        Ok(())
    }

    fn destinations(&mut self, vs: &VirtualServer) -> Result<Vec<RealServer>, IpvsError> {
        let key = vs.key();
        let (_, reals) = self
            .services
            .get(&key)
            .ok_or_else(|| errno(format!("list real servers of {key}"), ESRCH))?;
        Ok(reals.values().cloned().collect())
    }

    fn change_destination(
        &mut self,
        cmd: u8,
        vs: &VirtualServer,
        rs: &RealServer,
    ) -> Result<(), IpvsError> {
        let key = vs.key();
        let operation = format!("change real server {}:{} of {key}", rs.address, rs.port);
        let (_, reals) = self
            .services
            .get_mut(&key)
            .ok_or_else(|| errno(operation.clone(), ESRCH))?;
        let id = (rs.address, rs.port);
        match cmd {
            CMD_NEW_DEST if reals.contains_key(&id) => return Err(errno(operation, EEXIST)),
            CMD_NEW_DEST => {
                reals.insert(id, RealServer::new(rs.address, rs.port, rs.weight));
            }
            CMD_SET_DEST => {
                let held = reals.get_mut(&id).ok_or_else(|| errno(operation, ENOENT))?;
                held.weight = rs.weight;
            }
            CMD_DEL_DEST => {
                reals.remove(&id).ok_or_else(|| errno(operation, ENOENT))?;
            }
            other => return Err(errno(format!("command {other}"), EINVAL)),
        }
        self.writes += 1;
        Ok(())
    }

    fn set_timeouts(&mut self, tcp: u32, tcp_fin: u32, udp: u32) -> Result<(), IpvsError> {
        self.timeouts = Some((tcp, tcp_fin, udp));
        Ok(())
    }
}
