//! nftables mode's own objects, by name, for `--cleanup` and for a switch to another mode: its
//! `kube-proxy` tables.

use tracing::{info, warn};

use super::render::TABLE;
use crate::model::IpFamily;
use crate::sys::nf_tables::{Nftables, family_keyword, remove_table_commands};

/// Removes nftables mode's `kube-proxy` tables, in both families, where they exist. Returns
/// the families whose removal failed.
pub fn remove_tables(nft: &mut dyn Nftables) -> Vec<IpFamily> {
    let mut failures = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        // Looked up by name over netlink: no transaction (nor a change event) where there is
        // nothing, and no listing, which walks every chain of the family (iptables mode's too).
        match nft.table_exists(family, TABLE) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(err) => {
                warn!(error = %err, "Cannot look for nftables mode's tables");
                failures.push(family);
                continue;
            }
        }
        match nft.apply(&remove_table_commands(family, TABLE)) {
            Ok(()) => info!(
                family = family_keyword(family),
                "Removed nftables mode's kube-proxy table"
            ),
            Err(err) => {
                warn!(error = %err, "Failed to remove nftables mode's kube-proxy table");
                failures.push(family);
            }
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: IpFamily = IpFamily::V4;

    #[test]
    fn nftables_tables_go_only_where_they_are_and_no_listing_finds_them() {
        use crate::sys::nf_tables::Nftables;
        use crate::sys::nf_tables::fake::FakeNftables;
        let mut nft = FakeNftables::default();
        assert!(remove_tables(&mut nft).is_empty());
        assert!(nft.transactions.is_empty(), "{:?}", nft.transactions);

        nft.apply("add table ip kube-proxy\nadd chain ip kube-proxy services\n")
            .unwrap();
        nft.apply("add table ip filter\n").unwrap();
        nft.transactions.clear();
        assert!(remove_tables(&mut nft).is_empty());
        assert_eq!(nft.transactions.len(), 1, "{:?}", nft.transactions);
        assert!(nft.table(V4, "kube-proxy").is_none());
        assert!(nft.table(V4, "filter").is_some(), "not ours: kept");
        assert_eq!(nft.name_reads, 0);
    }
}
