//! Node-level settings upstream applies at start: the conntrack table's size and timeouts, and
//! the process's oom_score_adj. Each change is logged; a failure is a warning, never fatal (in a
//! network namespace other than the host's, nf_conntrack_max cannot be written, for one).

use tracing::{info, warn};

use crate::config::KubeProxyConfiguration;
use crate::sys::host::net::{Sysctl, ensure_sysctl};

const CONNTRACK_MAX: &str = "net/netfilter/nf_conntrack_max";

/// Raises the open-files soft limit to the hard limit, as Go's runtime does for upstream's
/// binary: a node's syncs spawn tools and open sockets, and a low soft limit (1,024 is common)
/// would be the first thing a flood of connections exhausts. Returns the soft limit in force
/// (None when it cannot be read).
pub fn raise_open_files_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => {
                info!(from = soft, to = hard, "Raised the open files limit");
                Some(hard)
            }
            Err(err) => {
                warn!(error = %err, "Cannot raise the open files limit");
                Some(soft)
            }
        },
        Ok((soft, _)) => Some(soft),
        Err(err) => {
            warn!(error = %err, "Cannot read the open files limit");
            None
        }
    }
}

/// The most that maxPerCore x cores asks for (upstream 1.36, kubernetes#137002: a large
/// machine's product made tables of millions of entries nobody needed).
const CONNTRACK_MAX_SCALED: u64 = 1_048_576;

/// The table size upstream wants: maxPerCore x cores, at most 1,048,576, at least `min`; None
/// leaves it alone.
pub fn conntrack_max(config: &KubeProxyConfiguration, cores: usize) -> Option<u64> {
    let per_core = u64::try_from(config.conntrack.max_per_core.unwrap_or(0)).ok()?;
    if per_core == 0 {
        return None;
    }
    let min = u64::try_from(config.conntrack.min.unwrap_or(0)).unwrap_or(0);
    let scaled = per_core
        .saturating_mul(cores as u64)
        .min(CONNTRACK_MAX_SCALED);
    Some(scaled.max(min))
}

/// The conntrack timeouts to set (sysctl, seconds); zero durations leave the kernel's.
pub fn conntrack_timeouts(config: &KubeProxyConfiguration) -> Vec<(&'static str, String)> {
    let ct = &config.conntrack;
    let secs = |d: Option<crate::config::GoDuration>| d.map_or(0, |d| d.0.as_secs());
    let mut wanted = vec![
        (
            "net/netfilter/nf_conntrack_tcp_timeout_established",
            secs(ct.tcp_established_timeout),
        ),
        (
            "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
            secs(ct.tcp_close_wait_timeout),
        ),
        (
            "net/netfilter/nf_conntrack_udp_timeout",
            secs(Some(ct.udp_timeout)),
        ),
        (
            "net/netfilter/nf_conntrack_udp_timeout_stream",
            secs(Some(ct.udp_stream_timeout)),
        ),
    ];
    if ct.tcp_be_liberal {
        wanted.push(("net/netfilter/nf_conntrack_tcp_be_liberal", 1));
    }
    wanted
        .into_iter()
        .filter(|(_, value)| *value > 0)
        .map(|(name, value)| (name, value.to_string()))
        .collect()
}

/// Applies the conntrack settings: the table only ever grows, as upstream.
pub fn apply_conntrack(config: &KubeProxyConfiguration, sysctl: &mut dyn Sysctl) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let Some(max) = conntrack_max(config, cores) {
        let current = sysctl
            .get(CONNTRACK_MAX)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok());
        if current.is_none_or(|current| current < max)
            && let Err(err) = ensure_sysctl(sysctl, CONNTRACK_MAX, &max.to_string())
        {
            warn!(name = CONNTRACK_MAX, value = max, error = %err, "Failed to set sysctl");
        }
    }
    for (name, value) in conntrack_timeouts(config) {
        if let Err(err) = ensure_sysctl(sysctl, name, &value) {
            warn!(name, value, error = %err, "Failed to set sysctl");
        }
    }
}

/// Writes the process's oom_score_adj.
pub fn apply_oom_score_adj(value: i32) {
    match std::fs::write("/proc/self/oom_score_adj", value.to_string()) {
        Ok(()) => info!(value, "Set oom_score_adj"),
        Err(err) => warn!(value, error = %err, "Failed to set oom_score_adj"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::host::net::FakeSysctl;

    fn config() -> KubeProxyConfiguration {
        let mut config = KubeProxyConfiguration::default();
        config.apply_defaults();
        config
    }

    #[test]
    fn table_size_and_timeouts_as_upstream() {
        let config = config();
        assert_eq!(
            conntrack_max(&config, 2),
            Some(131072),
            "min wins on 2 cores"
        );
        assert_eq!(conntrack_max(&config, 8), Some(262144), "32768 x 8");
        assert_eq!(
            conntrack_max(&config, 64),
            Some(1_048_576),
            "capped, not 32768 x 64"
        );
        let mut big_min = config.clone();
        big_min.conntrack.min = Some(2_000_000);
        assert_eq!(
            conntrack_max(&big_min, 64),
            Some(2_000_000),
            "min above the cap"
        );
        let mut off = config.clone();
        off.conntrack.max_per_core = Some(0);
        assert_eq!(conntrack_max(&off, 8), None, "0 leaves the table alone");

        let mut sysctl = FakeSysctl::default();
        sysctl.values.insert(CONNTRACK_MAX.into(), "1048576".into());
        apply_conntrack(&config, &mut sysctl);
        assert_eq!(sysctl.values[CONNTRACK_MAX], "1048576", "never shrunk");
        assert_eq!(
            sysctl.values["net/netfilter/nf_conntrack_tcp_timeout_established"],
            "86400"
        );
        assert_eq!(
            sysctl.values["net/netfilter/nf_conntrack_tcp_timeout_close_wait"],
            "3600"
        );
        assert!(
            !sysctl
                .values
                .contains_key("net/netfilter/nf_conntrack_udp_timeout")
        );
        sysctl.values.insert(CONNTRACK_MAX.into(), "65536".into());
        apply_conntrack(&config, &mut sysctl);
        assert!(sysctl.values[CONNTRACK_MAX].parse::<u64>().unwrap() >= 131072);
    }
}
