//! The flowtable's devices: every link of the node but the loopback. The flowtable is declared
//! with the table and no device (so a link that goes away while a sync is written cannot fail
//! the sync); its devices are added after each sync, those it lacks only. A link that goes away
//! leaves the flowtable by itself (the kernel unhooks it), and one that appears wakes a sync
//! (see `setup`), so a new pod's interface is covered at once.

use std::collections::{BTreeMap, BTreeSet};

use tracing::{debug, warn};

use super::render::{FLOWTABLE, FLOWTABLE_SPEC, TABLE};
use crate::model::IpFamily;
use crate::sys::host::link::LinkNames;
use crate::sys::host::link::events::LinkEvents;
use crate::sys::nf_tables::{NftError, Nftables, family_keyword};

/// The table a probe makes and deletes in one transaction.
const PROBE_TABLE: &str = "kube-proxy-flowtable-probe";

/// Whether the kernel has flowtables and `flow add`: one transaction that makes a table with a
/// flowtable and a forward chain offloading to it, and deletes it again (so nothing is left
/// either way; a kernel without NF_FLOW_TABLE refuses it).
pub fn probe<N: Nftables>(nft: &mut N) -> Result<(), NftError> {
    nft.apply(&format!(
        "add table ip {PROBE_TABLE}\n\
         add flowtable ip {PROBE_TABLE} probe {FLOWTABLE_SPEC}\n\
         add chain ip {PROBE_TABLE} forward {{ type filter hook forward priority 0 ; }}\n\
         add rule ip {PROBE_TABLE} forward flow add @probe\n\
         delete table ip {PROBE_TABLE}\n"
    ))
}

/// The kernel takes at most this many devices in one flowtable message (NFT_NETDEVICE_MAX).
const DEVICES_PER_MESSAGE: usize = 256;

/// Keeps each family's flowtable over the node's links.
pub struct FlowtableDevices {
    links: Box<dyn LinkNames>,
    /// What each family's flowtable holds, as last read or written.
    held: BTreeMap<IpFamily, BTreeSet<String>>,
    /// The listener that asks for a sync when a link appears, kept while this lives.
    _events: Option<LinkEvents>,
}

impl FlowtableDevices {
    pub fn new(links: Box<dyn LinkNames>) -> Self {
        FlowtableDevices {
            links,
            held: BTreeMap::new(),
            _events: None,
        }
    }

    /// Keeps `events` listening while the flowtable is kept.
    pub fn woken_by(mut self, events: LinkEvents) -> Self {
        self._events = Some(events);
        self
    }

    /// Adds to `family`'s flowtable the links it lacks, and returns how many. What it holds is
    /// read first after a full sync (`reread`: the table may have been made again) and the
    /// first time. Failures are logged and tried again at the next sync: the rules do not
    /// depend on the devices, only the fast path does.
    pub fn keep<N: Nftables>(&mut self, nft: &mut N, family: IpFamily, reread: bool) -> usize {
        if reread || !self.held.contains_key(&family) {
            match nft.flowtable_devices(family, TABLE, FLOWTABLE) {
                Ok(Some(devices)) => {
                    self.held.insert(family, devices);
                }
                Ok(None) => {
                    self.held.remove(&family);
                    return 0;
                }
                Err(err) => {
                    warn!(error = %err, ?family, "Cannot read the flowtable's devices");
                    return 0;
                }
            }
        }
        let wanted = match self.links.names() {
            Ok(names) => offloadable(names),
            Err(err) => {
                warn!(error = %err, "Cannot list the node's links for the flowtable");
                return 0;
            }
        };
        let held = self.held.entry(family).or_default();
        held.retain(|device| wanted.contains(device));
        let missing: Vec<&String> = wanted.difference(held).collect();
        let mut added = Vec::new();
        for chunk in missing.chunks(DEVICES_PER_MESSAGE) {
            let listed: Vec<String> = chunk.iter().map(|name| format!("\"{name}\"")).collect();
            let command = format!(
                "add flowtable {} {TABLE} {FLOWTABLE} {{ hook ingress priority filter ; devices = {{ {} }} ; }}\n",
                family_keyword(family),
                listed.join(", ")
            );
            if let Err(err) = nft.apply(&command) {
                // A link that went away meanwhile: the next sync lists the links again.
                warn!(error = %err, ?family, "Cannot add links to the flowtable; trying again at the next sync");
                self.held.remove(&family);
                return added.len();
            }
            added.extend(chunk.iter().map(|name| name.to_string()));
        }
        if !added.is_empty() {
            debug!(?family, devices = ?added, "Added links to the flowtable");
            if let Some(held) = self.held.get_mut(&family) {
                held.extend(added.iter().cloned());
            }
        }
        added.len()
    }
}

/// The links a flowtable takes: all but the loopback, and none whose name nft's text could not
/// carry in quotes.
fn offloadable(names: BTreeSet<String>) -> BTreeSet<String> {
    names
        .into_iter()
        .filter(|name| name != "lo" && name.chars().all(|c| c.is_ascii_graphic() && c != '"'))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::host::link::fake::FakeLinkNames;
    use crate::sys::nf_tables::fake::FakeNftables;

    const V4: IpFamily = IpFamily::V4;

    fn devices(nft: &FakeNftables) -> Vec<String> {
        nft.table(V4, TABLE).unwrap().flowtables[FLOWTABLE]
            .iter()
            .cloned()
            .collect()
    }

    #[test]
    fn links_are_added_once_as_they_appear_and_a_missing_flowtable_is_left_alone() {
        let mut nft = FakeNftables::default();
        let links = FakeLinkNames::of(&["lo", "eth0", "veth1"]);
        let mut keeper = FlowtableDevices::new(Box::new(links.clone()));
        nft.apply("add table ip kube-proxy\n").unwrap();
        assert_eq!(
            keeper.keep(&mut nft, V4, true),
            0,
            "no flowtable: offload is off"
        );
        nft.apply(
            "add flowtable ip kube-proxy kube-proxy-flowtable { hook ingress priority filter ; }\n",
        )
        .unwrap();
        assert_eq!(keeper.keep(&mut nft, V4, true), 2);
        assert_eq!(devices(&nft), ["eth0", "veth1"]);
        let writes = nft.transactions.len();
        assert_eq!(keeper.keep(&mut nft, V4, false), 0);
        assert_eq!(
            keeper.keep(&mut nft, V4, true),
            0,
            "read back: nothing lacks"
        );
        assert_eq!(
            nft.transactions.len(),
            writes,
            "nothing written when nothing lacks"
        );
        links.set(&["lo", "eth0", "veth2"]);
        assert_eq!(keeper.keep(&mut nft, V4, false), 1);
        assert!(
            nft.transactions
                .last()
                .unwrap()
                .contains("devices = { \"veth2\" }")
        );
    }

    #[test]
    fn a_refused_addition_is_tried_again_after_reading_what_the_flowtable_holds() {
        let mut nft = FakeNftables::default();
        nft.apply("add table ip kube-proxy\nadd flowtable ip kube-proxy kube-proxy-flowtable { hook ingress priority filter ; }\n")
            .unwrap();
        let mut keeper = FlowtableDevices::new(Box::new(FakeLinkNames::of(&["eth0", "gone"])));
        nft.refuse_containing = vec!["gone".into()];
        assert_eq!(keeper.keep(&mut nft, V4, false), 0);
        nft.refuse_containing.clear();
        assert_eq!(keeper.keep(&mut nft, V4, false), 2);
        assert_eq!(devices(&nft), ["eth0", "gone"]);
    }

    #[test]
    fn the_probe_leaves_nothing_and_fails_where_the_kernel_has_no_flowtables() {
        let mut nft = FakeNftables::default();
        probe(&mut nft).unwrap();
        assert!(nft.tables.is_empty());
        let mut without = FakeNftables::without_flowtables();
        assert!(probe(&mut without).is_err());
        assert!(without.tables.is_empty());
    }

    #[test]
    fn hundreds_of_links_go_in_messages_the_kernel_takes() {
        let names: Vec<String> = (0..600).map(|i| format!("veth{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut nft = FakeNftables::default();
        nft.apply("add table ip kube-proxy\nadd flowtable ip kube-proxy kube-proxy-flowtable { hook ingress priority filter ; }\n")
            .unwrap();
        let mut keeper = FlowtableDevices::new(Box::new(FakeLinkNames::of(&refs)));
        let before = nft.transactions.len();
        assert_eq!(keeper.keep(&mut nft, V4, true), 600);
        assert_eq!(nft.transactions.len() - before, 3);
        assert_eq!(devices(&nft).len(), 600);
    }
}
