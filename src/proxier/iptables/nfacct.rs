//! The kernel's accounting objects our rules count packets with (upstream's nfacct counters):
//! created when the proxier starts; a rule names one only if it exists, since the kernel refuses
//! a rule that names a missing object.

use tracing::error;

use crate::sys::nfacct::Nfacct;

/// Packets dropped as conntrack-INVALID in KUBE-FORWARD.
pub const CT_STATE_INVALID_DROPPED: &str = "ct_state_invalid_dropped_pkts";
/// Packets to a NodePort on a loopback address.
pub const LOCALHOST_NODEPORTS_ACCEPTED: &str = "localhost_nps_accepted_pkts";

/// Which counters exist, so that the rules may name them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfacctCounters {
    pub invalid_dropped: bool,
    pub localhost_node_ports: bool,
}

impl NfacctCounters {
    /// Both counters (upstream's test proxier has them).
    pub const ALL: NfacctCounters = NfacctCounters {
        invalid_dropped: true,
        localhost_node_ports: true,
    };

    /// Creates both counters where missing; one that cannot be created is left out of the rules
    /// (and of the metrics), as upstream does.
    pub fn ensure(nfacct: &mut dyn Nfacct) -> Self {
        let mut ensure = |name: &str| match nfacct.ensure(name) {
            Ok(()) => true,
            Err(err) => {
                error!(error = %err, counter = name, "Failed to create nfacct counter; the corresponding metric will not be available");
                false
            }
        };
        NfacctCounters {
            invalid_dropped: ensure(CT_STATE_INVALID_DROPPED),
            localhost_node_ports: ensure(LOCALHOST_NODEPORTS_ACCEPTED),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::nfacct::FakeNfacct;

    #[test]
    fn counters_are_used_only_where_the_kernel_has_them() {
        let mut kernel = FakeNfacct::default();
        assert_eq!(NfacctCounters::ensure(&mut kernel), NfacctCounters::ALL);
        assert_eq!(kernel.counters.len(), 2);
        // A restart keeps the counts.
        kernel.counters.insert(CT_STATE_INVALID_DROPPED.into(), 7);
        NfacctCounters::ensure(&mut kernel);
        assert_eq!(kernel.counters[CT_STATE_INVALID_DROPPED], 7);
        let mut without = FakeNfacct {
            unsupported: true,
            ..FakeNfacct::default()
        };
        assert_eq!(
            NfacctCounters::ensure(&mut without),
            NfacctCounters::default()
        );
    }
}
