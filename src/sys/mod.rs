//! Kernel access, one folder or file per kernel surface, each behind a narrow trait with a
//! stateful fake for tests: nf_tables (nftables mode's table, and the iptables-nft rules read
//! back), xtables (the iptables tools), IPVS, ipset, conntrack, nfacct, and the host (links,
//! sysctls and addresses, the tools' processes). `netlink` is the socket they share.

pub mod conntrack;
pub mod host;
pub mod ipset;
pub mod ipvs;
pub mod netlink;
pub mod nf_tables;
pub mod nfacct;
pub mod xtables;
