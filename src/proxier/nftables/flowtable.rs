//! The flowtable's devices: every link of the node but the loopback. The flowtable is declared
//! with the table and no device (so a link that goes away while a sync is written cannot fail
//! the sync); after each sync, what it holds is read (one small dump of our table's flowtables)
//! and the links it lacks are added. A link that goes away leaves the flowtable by itself (the
//! kernel unhooks it), one that appears wakes a sync (see `setup`), so a new pod's interface is
//! covered at once; and reading what the flowtable holds each time covers a link deleted and made
//! again under its name, and a flowtable another program emptied or made again.

use std::collections::BTreeSet;

use tracing::{debug, warn};

use super::render::{FLOWTABLE, TABLE, flowtable_spec};
use crate::model::IpFamily;
use crate::sys::host::link::LinkNames;
use crate::sys::host::link::events::LinkEvents;
use crate::sys::nf_tables::{NftError, Nftables, family_keyword};

/// The table a probe makes and deletes in one transaction.
const PROBE_TABLE: &str = "kube-proxy-flowtable-probe";

/// Whether the kernel has flowtables and `flow add` in both families: one transaction that
/// makes, in each, a table with a flowtable and a forward chain offloading to it, and deletes
/// them again (so nothing is left either way; a kernel without NF_FLOW_TABLE refuses it).
pub fn probe<N: Nftables>(nft: &mut N) -> Result<(), NftError> {
    let mut commands = String::new();
    for family in ["ip", "ip6"] {
        commands.push_str(&format!(
            "add table {family} {PROBE_TABLE}\n\
             add flowtable {family} {PROBE_TABLE} probe {}\n\
             add chain {family} {PROBE_TABLE} forward {{ type filter hook forward priority 0 ; }}\n\
             add rule {family} {PROBE_TABLE} forward flow add @probe\n\
             delete table {family} {PROBE_TABLE}\n",
            flowtable_spec(&[])
        ));
    }
    nft.apply(&commands)
}

/// The kernel takes at most this many devices in one flowtable message (NFT_NETDEVICE_MAX).
const DEVICES_PER_MESSAGE: usize = 256;

/// Keeps each family's flowtable over the node's links.
pub struct FlowtableDevices {
    links: Box<dyn LinkNames>,
    /// The listener that asks for a sync when a link appears, kept while this lives.
    _events: Option<LinkEvents>,
}

impl FlowtableDevices {
    pub fn new(links: Box<dyn LinkNames>) -> Self {
        FlowtableDevices {
            links,
            _events: None,
        }
    }

    /// Keeps `events` listening while the flowtable is kept.
    pub fn woken_by(mut self, events: LinkEvents) -> Self {
        self._events = Some(events);
        self
    }

    /// Adds to `family`'s flowtable the links it lacks, and returns how many. Failures are
    /// logged and tried again at the next sync: the rules do not depend on the devices, only
    /// the fast path does. A link the kernel refuses (gone meanwhile) is left out; the others
    /// are added.
    pub fn keep<N: Nftables>(&mut self, nft: &mut N, family: IpFamily) -> usize {
        let held = match nft.flowtable_devices(family, TABLE, FLOWTABLE) {
            Ok(Some(devices)) => devices,
            // No flowtable: offload is off in this table.
            Ok(None) => return 0,
            Err(err) => {
                warn!(error = %err, ?family, "Cannot read the flowtable's devices");
                return 0;
            }
        };
        let wanted = match self.links.names() {
            Ok(names) => offloadable(names),
            Err(err) => {
                warn!(error = %err, "Cannot list the node's links for the flowtable");
                return 0;
            }
        };
        let missing: Vec<String> = wanted.difference(&held).cloned().collect();
        let mut added = Vec::new();
        let mut refused = Vec::new();
        for chunk in missing.chunks(DEVICES_PER_MESSAGE) {
            if add_devices(nft, family, chunk).is_ok() {
                added.extend_from_slice(chunk);
                continue;
            }
            // One refused link fails its whole message: the rest go one by one.
            for device in chunk {
                match add_devices(nft, family, std::slice::from_ref(device)) {
                    Ok(()) => added.push(device.clone()),
                    Err(err) => refused.push(format!("{device}: {err}")),
                }
            }
        }
        if !refused.is_empty() {
            warn!(?family, refused = ?refused, "The kernel refused links for the flowtable; trying again at the next sync");
        }
        if !added.is_empty() {
            debug!(?family, devices = ?added, "Added links to the flowtable");
        }
        added.len()
    }
}

/// One transaction adding `devices` to `family`'s flowtable.
fn add_devices<N: Nftables>(
    nft: &mut N,
    family: IpFamily,
    devices: &[String],
) -> Result<(), NftError> {
    nft.apply(&format!(
        "add flowtable {} {TABLE} {FLOWTABLE} {}\n",
        family_keyword(family),
        flowtable_spec(devices)
    ))
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
    fn links_are_added_as_they_appear_or_go_missing_and_a_missing_flowtable_is_left_alone() {
        let mut nft = FakeNftables::default();
        let links = FakeLinkNames::of(&["lo", "eth0", "veth1"]);
        let mut keeper = FlowtableDevices::new(Box::new(links.clone()));
        nft.apply("add table ip kube-proxy\n").unwrap();
        assert_eq!(keeper.keep(&mut nft, V4), 0, "no flowtable: offload is off");
        nft.apply(
            "add flowtable ip kube-proxy kube-proxy-flowtable { hook ingress priority filter ; }\n",
        )
        .unwrap();
        assert_eq!(keeper.keep(&mut nft, V4), 2);
        assert_eq!(devices(&nft), ["eth0", "veth1"]);
        let writes = nft.transactions.len();
        assert_eq!(keeper.keep(&mut nft, V4), 0, "read back: nothing lacks");
        assert_eq!(
            nft.transactions.len(),
            writes,
            "nothing written when nothing lacks"
        );
        links.set(&["lo", "eth0", "veth2"]);
        assert_eq!(keeper.keep(&mut nft, V4), 1);
        assert!(
            nft.transactions
                .last()
                .unwrap()
                .contains("devices = { \"veth2\" }")
        );
        // A flowtable another program made again holds nothing: every link is added again.
        nft.apply(
            "flush table ip kube-proxy\ndelete flowtable ip kube-proxy kube-proxy-flowtable\n\
             add flowtable ip kube-proxy kube-proxy-flowtable { hook ingress priority filter ; }\n",
        )
        .unwrap();
        assert_eq!(keeper.keep(&mut nft, V4), 2);
        assert_eq!(devices(&nft), ["eth0", "veth2"]);
    }

    #[test]
    fn a_refused_link_is_left_out_and_tried_again_and_the_others_are_added() {
        let mut nft = FakeNftables::default();
        nft.apply("add table ip kube-proxy\nadd flowtable ip kube-proxy kube-proxy-flowtable { hook ingress priority filter ; }\n")
            .unwrap();
        let mut keeper = FlowtableDevices::new(Box::new(FakeLinkNames::of(&["eth0", "gone"])));
        nft.refuse_containing = vec!["gone".into()];
        assert_eq!(keeper.keep(&mut nft, V4), 1);
        assert_eq!(devices(&nft), ["eth0"]);
        nft.refuse_containing.clear();
        assert_eq!(keeper.keep(&mut nft, V4), 1);
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
        assert_eq!(keeper.keep(&mut nft, V4), 600);
        assert_eq!(nft.transactions.len() - before, 3);
        assert_eq!(devices(&nft).len(), 600);
    }
}
