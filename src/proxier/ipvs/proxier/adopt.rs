//! What a sync reads of the kernel before it diffs: all of it (every virtual server with its
//! real servers, kube-ipvs0's addresses), a check of what memory holds (the virtual servers and
//! addresses, every real server), or memory alone with the real servers it touches.

use super::*;

impl<V: Ipvs, L: DummyLinks, S: Ipsets> IpvsMode<V, L, S> {
    pub(super) fn bound(&mut self, link: u32) -> Result<BTreeSet<IpAddr>, SyncError> {
        Ok(self
            .links
            .addresses(link)
            .map_err(SyncError::from)?
            .into_iter()
            .collect())
    }

    pub(super) fn observe(&mut self, link: u32) -> Result<Observed, SyncError> {
        let mut observed = Observed {
            bound: self.bound(link)?,
            ..Observed::default()
        };
        for vs in self.ipvs.services().map_err(SyncError::from)? {
            let reals = self.ipvs.destinations(&vs).map_err(SyncError::from)?;
            observed.services.insert(vs.key(), (vs, reals));
        }
        Ok(observed)
    }

    /// The kernel state to diff against at `depth`, and whether it was read in full. A change
    /// sync gets memory as it is: it re-reads the real servers it touches itself.
    pub(super) fn observe_at(
        &mut self,
        depth: Depth,
        link: u32,
    ) -> Result<(Observed, bool), SyncError> {
        let mut remembered = match (depth, self.applied.as_mut()) {
            (Depth::Full, _) | (_, None) => return Ok((self.observe(link)?, true)),
            (_, Some(applied)) => std::mem::take(&mut applied.kernel),
        };
        if depth == Depth::Check {
            let services = self.ipvs.services().map_err(SyncError::from)?;
            let bound = self.bound(link)?;
            if !remembered.same_outline(&services, &bound) {
                info!("IPVS state changed outside kube-proxy-rs, reading all of it");
                return Ok((self.observe(link)?, true));
            }
            // Every virtual server's real servers: one removed by hand is put back now, not at
            // the hourly full sync (one dump per virtual server; no read of anything not ours).
            let all: Vec<String> = remembered.services.keys().cloned().collect();
            self.reread_real_servers(&mut remembered, &all)?;
        }
        Ok((remembered, false))
    }

    /// Reads again the real servers of the named virtual servers that `observed` holds: their
    /// connection counts decide whether a removed real server drains or goes at once.
    pub(super) fn reread_real_servers<'a>(
        &mut self,
        observed: &mut Observed,
        keys: impl IntoIterator<Item = &'a String>,
    ) -> Result<(), SyncError> {
        for key in keys {
            if let Some((vs, reals)) = observed.services.get_mut(key) {
                *reals = self.ipvs.destinations(vs).map_err(SyncError::from)?;
            }
        }
        Ok(())
    }

    /// Starts a sync at `depth`: kube-ipvs0 made sure of and the kernel read as deep as
    /// asked. Memory of the last sync is taken: only a sync that ends gives it back.
    pub(super) fn start(
        &mut self,
        depth: Depth,
        families: &[IpFamily],
    ) -> Result<KernelView, SyncError> {
        let link = self
            .links
            .ensure_dummy(DUMMY_LINK)
            .map_err(SyncError::from)?;
        let (observed, read_all) = self.observe_at(depth, link)?;
        // By link, as upstream: a node address that a Service also binds on kube-ipvs0 (its
        // load-balancer IP, say) stays a node address, served as one and left unbound.
        let local: Vec<IpAddr> = self
            .addresses
            .addresses_except(DUMMY_LINK)
            .into_iter()
            .filter(|ip| !ip.is_loopback() && !is_link_local(ip))
            .collect();
        let (sets, previous_iptables) = match self.applied.take() {
            Some(applied) if depth == Depth::Changes => (applied.sets, applied.iptables),
            Some(applied) => (SetEntries::new(), applied.iptables),
            None => (SetEntries::new(), Vec::new()),
        };
        Ok(KernelView {
            depth,
            families: families.to_vec(),
            link,
            observed,
            read_all,
            local,
            sets,
            previous_iptables,
            iptables: Vec::new(),
        })
    }
}

/// IPv6 link-local (fe80::/10): never a NodePort address. IPv4's 169.254.0.0/16 is one, as
/// upstream (node-local DNS's 169.254.20.10, say).
pub(super) fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
        IpAddr::V4(_) => false,
    }
}
