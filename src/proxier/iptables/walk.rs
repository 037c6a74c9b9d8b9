//! What KUBE-SERVICES' length costs each new connection, said in the log at the first sync and
//! again whenever the chain grows past the next threshold: every new connection through the
//! node, to a Service or not, is matched against its rules one after another before it is
//! translated or let through. nftables mode looks a Service up in a map instead, whatever
//! their number. The per-rule figures are the data-path benchmark's (docs/iptables.md).

use std::collections::BTreeMap;

use tracing::info;

use crate::model::IpFamily;
use crate::sys::xtables::Backend;

/// Sizes past which the cost is said again.
const THRESHOLDS: [usize; 7] = [1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000];

/// Microseconds a new connection pays per 1,000 rules it walks, measured on each back end by
/// `cargo bench --bench datapath` (the p50 of a connection that walks them all, less the
/// floor's, on 2 cores: nft at 10,000 and 30,000 Services, legacy at 10,000 only, as the kernel
/// refused its table at 30,000; docs/iptables.md).
fn micros_per_thousand(backend: Backend) -> f64 {
    match backend {
        Backend::Nft => 16.0,
        Backend::Legacy => 7.0,
    }
}

/// The notice, per family: the threshold level it was last given at.
#[derive(Debug)]
pub struct WalkNotice {
    backend: Backend,
    said: BTreeMap<IpFamily, usize>,
}

impl WalkNotice {
    pub fn new(backend: Backend) -> Self {
        WalkNotice {
            backend,
            said: BTreeMap::new(),
        }
    }

    /// After a sync left `rules` rules in `family`'s KUBE-SERVICES: the notice, when it is due
    /// (the first time, and past each threshold once).
    pub fn observe(&mut self, family: IpFamily, rules: usize) -> Option<String> {
        let level = THRESHOLDS.iter().take_while(|t| rules >= **t).count();
        if self.said.get(&family).is_some_and(|said| *said >= level) {
            return None;
        }
        self.said.insert(family, level);
        Some(self.text(family, rules))
    }

    /// `observe`, logged.
    pub fn log(&mut self, family: IpFamily, rules: usize) {
        if let Some(text) = self.observe(family, rules) {
            info!(
                ipFamily = family.name(),
                rules,
                backend = self.backend.as_str(),
                "{text}"
            );
        }
    }

    fn text(&self, family: IpFamily, rules: usize) -> String {
        let per_thousand = micros_per_thousand(self.backend);
        let walk = per_thousand * rules as f64 / 1000.0;
        // Tenths where whole microseconds would read as nothing.
        let walk = if walk < 10.0 {
            format!("{walk:.1}")
        } else {
            format!("{walk:.0}")
        };
        format!(
            "KUBE-SERVICES ({}) holds {rules} rules: every new connection through this node, \
             to a Service or not, is matched against them in order, about {per_thousand:.1} µs per \
             1,000 rules (iptables-{}, measured), so about {walk} µs here for a connection that \
             walks them all and half that for a Service in the middle; nftables mode \
             (mode: nftables) finds the Service in one map lookup whatever their number",
            family.name(),
            self.backend.as_str()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn said_at_the_first_sync_and_once_past_each_threshold() {
        let mut notice = WalkNotice::new(Backend::Nft);
        let text = notice
            .observe(IpFamily::V4, 12)
            .expect("said at the first sync");
        assert!(text.contains("holds 12 rules"), "{text}");
        assert_eq!(notice.observe(IpFamily::V4, 900), None);
        let text = notice.observe(IpFamily::V4, 1_000).expect("past 1,000");
        assert!(text.contains("about 16 µs here"), "{text}");
        assert_eq!(notice.observe(IpFamily::V4, 1_500), None);
        assert_eq!(
            notice.observe(IpFamily::V4, 800),
            None,
            "shrinking says nothing"
        );
        assert_eq!(
            notice.observe(IpFamily::V4, 1_999),
            None,
            "nor growing back"
        );
        assert!(notice.observe(IpFamily::V4, 30_010).is_some());
        assert_eq!(notice.observe(IpFamily::V4, 30_010), None);
    }

    #[test]
    fn each_family_is_said_for_itself() {
        let mut notice = WalkNotice::new(Backend::Legacy);
        assert!(notice.observe(IpFamily::V4, 5_000).is_some());
        let text = notice
            .observe(IpFamily::V6, 10)
            .expect("the other family's first");
        assert!(
            text.contains("(IPv6)") && text.contains("iptables-legacy"),
            "{text}"
        );
        assert_eq!(notice.observe(IpFamily::V4, 6_000), None);
    }
}
