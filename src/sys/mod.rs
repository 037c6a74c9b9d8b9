//! Kernel access, each surface behind a narrow trait with a stateful fake for tests.

pub mod conntrack;
pub mod ipset;
pub mod iptables;
pub mod iptables_fake;
pub mod iptables_rules;
pub mod ipvs;
pub mod link;
pub mod net;
pub mod netlink;
pub mod nf_events;
pub mod nf_tables;
pub mod nfacct;
pub mod nft_elements;
pub mod nft_netlink;
pub mod nftables;
pub mod nftables_fake;
pub mod process;
