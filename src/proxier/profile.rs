//! What the rest of the program asks of a mode, answered in one place: the daemon (its sync
//! periods, whether it watches ServiceCIDRs, upstream's deprecation), the metrics (the kernel
//! counters read at each scrape, the counter a failed sync adds to) and the cleanup of the other
//! modes' leftovers. The daemon asks the profile of the mode that runs, after any fallback.

use std::time::Duration;

use super::cleanup::Leftovers;
use crate::config::{KubeProxyConfiguration, ProxyMode};

/// The kernel counters a mode's metrics read at each scrape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelCounters {
    /// It exports none.
    Absent,
    /// nfacct's, for the localhost NodePort packets iptables mode accepts.
    Nfacct,
    /// nftables' named counters of rejected localhost NodePort packets (with the localhost
    /// NodePorts gate on).
    LocalhostRejects,
}

/// Where a failed sync is counted (upstream's metric for the mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureCounter {
    /// `kubeproxy_sync_proxy_rules_iptables_restore_failures_total`, and, when
    /// `counts_partial`, `..._iptables_partial_restore_failures_total` for a partial sync.
    IptablesRestore { counts_partial: bool },
    /// `kubeproxy_sync_proxy_rules_nftables_sync_failures_total`.
    NftablesSync,
}

/// One mode's answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    pub mode: ProxyMode,
    /// Upstream deprecates it: the daemon logs upstream's error line and posts its Warning
    /// Event when it runs.
    pub deprecated: bool,
    /// It programs the drop rule for unallocated ClusterIPs, so the daemon watches ServiceCIDRs.
    pub service_cidrs: bool,
    pub counters: KernelCounters,
    pub failures: FailureCounter,
    /// What the other modes leave behind that it removes once its first sync is in.
    pub leftovers: &'static [Leftovers],
}

const IPTABLES: Profile = Profile {
    mode: ProxyMode::Iptables,
    deprecated: false,
    service_cidrs: false,
    counters: KernelCounters::Nfacct,
    failures: FailureCounter::IptablesRestore {
        counts_partial: true,
    },
    leftovers: &[Leftovers::IpvsMode, Leftovers::NftablesMode],
};

const IPVS: Profile = Profile {
    mode: ProxyMode::Ipvs,
    deprecated: true,
    service_cidrs: false,
    counters: KernelCounters::Absent,
    failures: FailureCounter::IptablesRestore {
        counts_partial: false,
    },
    leftovers: &[Leftovers::IptablesMode, Leftovers::NftablesMode],
};

const NFTABLES: Profile = Profile {
    mode: ProxyMode::Nftables,
    deprecated: false,
    service_cidrs: true,
    counters: KernelCounters::LocalhostRejects,
    failures: FailureCounter::NftablesSync,
    leftovers: &[Leftovers::XtablesModes],
};

/// The profile of `mode`.
pub fn profile(mode: ProxyMode) -> &'static Profile {
    match mode {
        ProxyMode::Iptables => &IPTABLES,
        ProxyMode::Ipvs => &IPVS,
        ProxyMode::Nftables => &NFTABLES,
    }
}

impl Profile {
    /// The mode's `minSyncPeriod` and `syncPeriod`, from its own section of the configuration.
    pub fn sync_periods(&self, config: &KubeProxyConfiguration) -> (Duration, Duration) {
        let (min, period) = match self.mode {
            ProxyMode::Iptables => (config.iptables.min_sync_period, config.iptables.sync_period),
            ProxyMode::Ipvs => (config.ipvs.min_sync_period, config.ipvs.sync_period),
            ProxyMode::Nftables => (config.nftables.min_sync_period, config.nftables.sync_period),
        };
        (min.0, period.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GoDuration;

    #[test]
    fn each_mode_answers_for_itself() {
        for mode in ProxyMode::ALL {
            let profile = profile(mode);
            assert_eq!(profile.mode, mode);
            for left in profile.leftovers {
                assert_ne!(*left, Leftovers::All, "{mode:?} removes only others' state");
            }
        }
        assert!(profile(ProxyMode::Ipvs).deprecated);
        assert!(profile(ProxyMode::Nftables).service_cidrs);
        assert!(!profile(ProxyMode::Iptables).service_cidrs);
    }

    #[test]
    fn sync_periods_come_from_the_modes_own_section() {
        let mut config = KubeProxyConfiguration::default();
        let seconds = |s| GoDuration(Duration::from_secs(s));
        config.iptables.min_sync_period = seconds(1);
        config.iptables.sync_period = seconds(30);
        config.ipvs.min_sync_period = seconds(7);
        config.ipvs.sync_period = seconds(70);
        config.nftables.min_sync_period = seconds(2);
        config.nftables.sync_period = seconds(20);
        let periods = |mode| profile(mode).sync_periods(&config);
        assert_eq!(periods(ProxyMode::Iptables), (seconds(1).0, seconds(30).0));
        assert_eq!(periods(ProxyMode::Ipvs), (seconds(7).0, seconds(70).0));
        assert_eq!(periods(ProxyMode::Nftables), (seconds(2).0, seconds(20).0));
    }
}
