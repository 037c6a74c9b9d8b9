//! Kernel access, one folder or file per kernel surface: nf_tables (nftables mode's table, and
//! the iptables-nft rules read back), xtables (the iptables tools), IPVS, ipset, conntrack,
//! nfacct, and the host (links, sysctls and addresses, the tools' processes). `netlink` is the
//! socket they share. What the modes program and read (nf_tables, xtables, IPVS, ipset, links,
//! conntrack, nfacct, sysctls, addresses) sits behind narrow traits with stateful fakes for
//! tests, which refuse what the kernel refuses; the tools' processes and the socket lookup do
//! not. `nf_tables::trace` is the test oracle of nftables mode, a packet tracer over any
//! nf_tables ruleset.

use std::net::IpAddr;

pub mod conntrack;
pub mod host;
pub mod ipset;
pub mod ipvs;
pub mod netlink;
pub mod nf_tables;
pub mod nfacct;
pub mod xtables;

/// An address as the kernel's structs hold either family (`union nf_inet_addr`, the addresses
/// of `inet_diag_sockid`): 16 bytes, an IPv4 address in the first four.
pub fn inet_addr(address: IpAddr) -> [u8; 16] {
    let mut out = [0; 16];
    match address {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out = v6.octets(),
    }
    out
}
