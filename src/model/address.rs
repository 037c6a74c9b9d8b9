//! Addresses as upstream reads them (`netutils.ParseIPSloppy`, `ParseCIDRSloppy`): IPv4 octets
//! with leading zeros, which older API servers and command lines accepted, are read as decimal.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

/// An IP address as upstream reads one: IPv6 as usual; IPv4 as four decimal octets, each of
/// which may carry leading zeros (`172.30.0.041` is 172.30.0.41).
pub fn parse_ip(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    parse_ipv4_sloppy(text).map(IpAddr::V4)
}

fn parse_ipv4_sloppy(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = text.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    parts.next().is_none().then(|| Ipv4Addr::from(octets))
}

/// A CIDR as upstream reads one (`netutils.ParseCIDRSloppy`): the address as [`parse_ip`], a
/// prefix length that may have leading zeros; host bits are cleared (`10.0.0.1/8` is 10.0.0.0/8).
pub fn parse_cidr(text: &str) -> Option<IpNet> {
    let (address, length) = text.trim().split_once('/')?;
    if length.is_empty() || length.len() > 3 || !length.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let length: u8 = length.parse().ok()?;
    IpNet::new(parse_ip(address)?, length)
        .ok()
        .map(|net| net.trunc())
}

/// An address's bytes in network order: 4 for IPv4, 16 for IPv6.
pub fn octets(address: IpAddr) -> Vec<u8> {
    match address {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}
