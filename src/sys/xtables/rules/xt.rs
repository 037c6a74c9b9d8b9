//! The info structs of the xtables extensions our rules use, laid out as the kernel keeps them
//! (x86_64 and other 64-bit Linux: `XT_ALIGN` is 8) and filled as iptables 1.8.9's extensions
//! fill them (extensions/libxt_*.c), with what the kernel's own checks change in them.

use std::net::IpAddr;

/// `XT_ALIGN`: info structs are padded to 8 bytes.
fn xt_align(mut bytes: Vec<u8>) -> Vec<u8> {
    bytes.resize(bytes.len().div_ceil(8) * 8, 0);
    bytes
}

/// A NUL-padded string field of `size` bytes (the text must be shorter).
fn padded(text: &str, size: usize) -> Option<Vec<u8>> {
    (text.len() < size).then(|| {
        let mut out = text.as_bytes().to_vec();
        out.resize(size, 0);
        out
    })
}

/// `struct xt_comment_info { char comment[256]; }`.
pub fn comment(text: &str) -> Option<Vec<u8>> {
    padded(text, 256).map(xt_align)
}

/// `struct xt_addrtype_info_v1 { u16 source; u16 dest; u32 flags; }`.
pub fn addrtype_v1(source: u16, dest: u16, flags: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(8);
    out.extend(source.to_ne_bytes());
    out.extend(dest.to_ne_bytes());
    out.extend(flags.to_ne_bytes());
    xt_align(out)
}

/// `struct xt_conntrack_mtinfo3` matching the state only: eight addresses and masks, the
/// expiry range, protocol and ports (all zero), then the flags and masks.
pub fn conntrack_v3(match_flags: u16, invert_flags: u16, state_mask: u16) -> Vec<u8> {
    let mut out = vec![0; 8 * 16 + 2 * 4 + 2 + 4 * 2];
    out.extend(match_flags.to_ne_bytes());
    out.extend(invert_flags.to_ne_bytes());
    out.extend(state_mask.to_ne_bytes());
    out.extend(0u16.to_ne_bytes()); // status_mask
    out.extend([0; 4 * 2]); // the ports' upper bounds
    xt_align(out)
}

/// `struct xt_statistic_info` in random mode: the probability as iptables scales it, which the
/// extension's final check also copies into `u.nth.count` (a union with the probability).
pub fn statistic_random(probability: u32, invert: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.extend(0u16.to_ne_bytes()); // XT_STATISTIC_MODE_RANDOM
    out.extend(u16::from(invert).to_ne_bytes());
    out.extend(probability.to_ne_bytes()); // u.random.probability (= u.nth.every)
    out.extend(0u32.to_ne_bytes()); // u.nth.packet
    out.extend(probability.to_ne_bytes()); // u.nth.count = every - packet
    out.extend([0; 8]); // master, the kernel's (not dumped)
    xt_align(out)
}

/// `struct xt_recent_mtinfo_v1`: seconds, hit count, what to do, the list's name, the side and
/// the mask (all ones unless `--mask`).
pub fn recent_v1(
    seconds: u32,
    hit_count: u32,
    check_set: u8,
    name: &str,
    side: u8,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(232);
    out.extend(seconds.to_ne_bytes());
    out.extend(hit_count.to_ne_bytes());
    out.push(check_set);
    out.push(0); // invert
    out.extend(padded(name, 200)?);
    out.push(side);
    out.push(0); // padding before the mask
    out.extend([0xff; 16]);
    Some(xt_align(out))
}

/// `struct xt_nfacct_match_info_v1 { char name[32]; struct nf_acct *nfacct; }` (the pointer is
/// the kernel's and is not dumped).
pub fn nfacct_v1(name: &str) -> Option<Vec<u8>> {
    let mut out = padded(name, 32)?;
    out.extend([0; 8]);
    Some(xt_align(out))
}

/// `struct xt_tcp` / `struct xt_udp` without ports or flags (`-m tcp` alone): iptables-nft
/// keeps it as a match.
pub fn tcp_udp_any(tcp: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    for port in [0u16, 0xffff, 0, 0xffff] {
        out.extend(port.to_ne_bytes());
    }
    if tcp {
        out.extend([0; 4]); // option, flg_mask, flg_cmp, invflags
    } else {
        out.extend([0; 2]); // invflags, padding
    }
    xt_align(out)
}

/// `struct xt_sctp_info` matching ports only: destination and source ranges (zero where not
/// given), the chunk map and match type (zero), the flag info (chunk types -1, as the
/// extension's init sets them), the flag count, and which ports are set or inverted.
pub fn sctp(dports: [u16; 2], sports: [u16; 2], flags: u32, invflags: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(296);
    for port in dports.into_iter().chain(sports) {
        out.extend(port.to_ne_bytes());
    }
    out.extend([0; 256]); // chunkmap
    out.extend(0u32.to_ne_bytes()); // chunk_match_type
    for _ in 0..4 {
        out.extend([0xff, 0, 0]); // flag_info: chunktype, flag, flag_mask
    }
    out.extend(0i32.to_ne_bytes()); // flag_count
    out.extend(flags.to_ne_bytes());
    out.extend(invflags.to_ne_bytes());
    xt_align(out)
}

/// `struct ipt_reject_info` / `struct ip6t_reject_info { u32 with; }`.
pub fn reject(with: u32) -> Vec<u8> {
    xt_align(with.to_ne_bytes().to_vec())
}

/// `struct xt_mark_tginfo2 { u32 mark, mask; }`.
pub fn mark_v2(mark: u32, mask: u32) -> Vec<u8> {
    let mut out = mark.to_ne_bytes().to_vec();
    out.extend(mask.to_ne_bytes());
    xt_align(out)
}

/// `struct nf_nat_range2` (DNAT revision 2): flags, address range, port range (network order),
/// base port.
pub fn nat_range2(flags: u32, address: Option<IpAddr>, port: Option<u16>) -> Vec<u8> {
    let mut out = flags.to_ne_bytes().to_vec();
    let address = address.map(crate::sys::inet_addr).unwrap_or_default();
    out.extend(address);
    out.extend(address);
    let port = port.unwrap_or(0).to_be_bytes();
    out.extend(port);
    out.extend(port);
    out.extend([0; 2]); // base_proto
    xt_align(out)
}

/// MASQUERADE's info: IPv4 keeps `struct nf_nat_ipv4_multi_range_compat` (one range: flags,
/// addresses, ports), IPv6 `struct nf_nat_range`.
pub fn masquerade(ipv6: bool, flags: u32) -> Vec<u8> {
    let out = if ipv6 {
        let mut out = flags.to_ne_bytes().to_vec();
        out.extend([0; 16 * 2 + 2 * 2]);
        out
    } else {
        let mut out = 1u32.to_ne_bytes().to_vec(); // rangesize
        out.extend(flags.to_ne_bytes());
        out.extend([0; 4 * 2 + 2 * 2]);
        out
    };
    xt_align(out)
}
