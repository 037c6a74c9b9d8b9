//! The values of our nft text as nf_tables holds them: addresses, prefixes, protocols, ports
//! and concatenated keys, and the intervals of an anonymous set of addresses and prefixes.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::sys::nf_tables::expr::Verdict;
use crate::sys::nf_tables::wire::{NF_DROP, NFT_GOTO, NFT_JUMP};

/// Why a piece of text is not one of the values this compiler knows.
pub type Unsupported = String;

/// The protocol keywords this program writes, and their IP protocol numbers.
const PROTOCOLS: [(&str, u8); 3] = [("tcp", 6), ("udp", 17), ("sctp", 132)];

/// The IP protocol number of a protocol keyword.
pub fn protocol(word: &str) -> Result<u8, Unsupported> {
    PROTOCOLS
        .iter()
        .find(|(name, _)| *name == word)
        .map(|(_, number)| *number)
        .ok_or_else(|| format!("unknown protocol {word:?}"))
}

/// The keyword of an IP protocol number.
pub fn protocol_name(number: u8) -> Option<&'static str> {
    PROTOCOLS
        .iter()
        .find(|(_, n)| *n == number)
        .map(|(name, _)| *name)
}

/// A component of a set's key type, as a declaration names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyType {
    Ipv4,
    Ipv6,
    Protocol,
    Port,
}

impl KeyType {
    /// `ipv4_addr`, `ipv6_addr`, `inet_proto`, `inet_service`.
    pub fn parse(word: &str) -> Option<KeyType> {
        match word {
            "ipv4_addr" => Some(KeyType::Ipv4),
            "ipv6_addr" => Some(KeyType::Ipv6),
            "inet_proto" => Some(KeyType::Protocol),
            "inet_service" => Some(KeyType::Port),
            _ => None,
        }
    }

    /// nf_tables' number of the type (nft's datatype).
    pub const fn number(self) -> u32 {
        match self {
            KeyType::Ipv4 => 7,
            KeyType::Ipv6 => 8,
            KeyType::Protocol => 12,
            KeyType::Port => 13,
        }
    }

    /// The bytes a value takes alone (a concatenation pads each to four).
    pub const fn value_len(self) -> usize {
        match self {
            KeyType::Ipv4 => 4,
            KeyType::Ipv6 => 16,
            KeyType::Protocol => 1,
            KeyType::Port => 2,
        }
    }
}

/// An address's bytes in network order.
pub use crate::model::address::octets as address_bytes;

/// An address or a prefix (`10.0.0.0/8`), as nft reads either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressMatch {
    Address(IpAddr),
    Prefix(IpNet),
}

impl AddressMatch {
    pub fn parse(text: &str) -> Result<Self, Unsupported> {
        if text.contains('/') {
            text.parse::<IpNet>()
                .map(|net| AddressMatch::Prefix(net.trunc()))
                .map_err(|_| format!("not a prefix: {text:?}"))
        } else {
            text.parse::<IpAddr>()
                .map(AddressMatch::Address)
                .map_err(|_| format!("not an address: {text:?}"))
        }
    }

    pub fn is_ipv6(&self) -> bool {
        match self {
            AddressMatch::Address(a) => a.is_ipv6(),
            AddressMatch::Prefix(p) => p.addr().is_ipv6(),
        }
    }

    /// The inclusive range of addresses it covers, as big-endian integers.
    fn range(&self) -> (u128, u128) {
        let (address, length, bits) = match self {
            AddressMatch::Address(a) => (*a, address_bits(*a), address_bits(*a)),
            AddressMatch::Prefix(p) => (p.addr(), p.prefix_len(), address_bits(p.addr())),
        };
        let value = to_integer(address);
        let host_bits = u32::from(bits - length);
        let span = if host_bits >= 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        (value & !span, (value & !span) | span)
    }
}

fn address_bits(address: IpAddr) -> u8 {
    if address.is_ipv4() { 32 } else { 128 }
}

fn to_integer(address: IpAddr) -> u128 {
    match address {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn integer_bytes(value: u128, ipv6: bool) -> Vec<u8> {
    if ipv6 {
        value.to_be_bytes().to_vec()
    } else {
        (value as u32).to_be_bytes().to_vec()
    }
}

/// The elements of an anonymous interval set holding `matches`, as nft writes them: the
/// ranges merged where they overlap or touch, sorted, each as its start and (unless it runs
/// to the last address) the address after it flagged as an interval end, after a leading
/// end at address zero when the first range does not start there. Also the size nft
/// declares for the set (every range counted with its end).
pub fn interval_elements(matches: &[AddressMatch], ipv6: bool) -> (Vec<IntervalElement>, u32) {
    let mut ranges: Vec<(u128, u128)> = matches.iter().map(AddressMatch::range).collect();
    ranges.sort();
    let mut merged: Vec<(u128, u128)> = Vec::new();
    for (start, end) in ranges {
        match merged.last_mut() {
            Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    let max = if ipv6 {
        u128::MAX
    } else {
        u128::from(u32::MAX)
    };
    let mut elements = Vec::new();
    let leading = merged.first().is_some_and(|first| first.0 != 0);
    let element = |value: u128, kind| IntervalElement {
        key: integer_bytes(value, ipv6),
        kind,
    };
    if leading {
        elements.push(element(0, Bound::End));
    }
    for (start, end) in &merged {
        if *end < max {
            elements.push(element(*start, Bound::Start));
            elements.push(element(end + 1, Bound::End));
        } else {
            elements.push(element(*start, Bound::OpenStart));
        }
    }
    let size = u32::from(leading) + 2 * merged.len() as u32;
    (elements, size)
}

/// Which bound of an interval an element is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    Start,
    /// A start whose interval runs to the last address (it has no end element).
    OpenStart,
    End,
}

/// One element of an interval set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntervalElement {
    pub key: Vec<u8>,
    pub kind: Bound,
}

/// One component of a set key or element key, and the bytes it takes in a key (each component
/// padded to four bytes in a concatenation).
pub fn key_component(text: &str) -> Result<Vec<u8>, Unsupported> {
    if let Ok(address) = text.parse::<IpAddr>() {
        return Ok(address_bytes(address));
    }
    if let Ok(number) = protocol(text) {
        return Ok(vec![number]);
    }
    text.parse::<u16>()
        .map(|port| port.to_be_bytes().to_vec())
        .map_err(|_| format!("unknown key component {text:?}"))
}

/// A key of components separated by ` . `: one component stands alone, several are each
/// padded to four bytes.
pub fn key(components: &[&str]) -> Result<Vec<u8>, Unsupported> {
    if let [only] = components {
        return key_component(only);
    }
    let mut bytes = Vec::new();
    for component in components {
        let mut value = key_component(component)?;
        while value.len() % 4 != 0 {
            value.push(0);
        }
        bytes.extend(value);
    }
    Ok(bytes)
}

/// The text of a quoted word.
pub fn unquote(word: &str) -> Result<&str, Unsupported> {
    word.strip_prefix('"')
        .and_then(|w| w.strip_suffix('"'))
        .ok_or_else(|| format!("expected a quoted string, got {word:?}"))
}

/// `drop`, `jump CHAIN` or `goto CHAIN`.
pub fn parse_verdict(words: &[&str]) -> Result<Verdict, Unsupported> {
    match words {
        ["drop"] => Ok(Verdict {
            code: NF_DROP,
            chain: None,
        }),
        ["jump", chain] => Ok(Verdict {
            code: NFT_JUMP,
            chain: Some(chain.to_string()),
        }),
        ["goto", chain] => Ok(Verdict {
            code: NFT_GOTO,
            chain: Some(chain.to_string()),
        }),
        other => Err(format!("unsupported verdict {other:?}")),
    }
}

/// The text of a verdict [`parse_verdict`] reads: `drop`, `jump CHAIN` or `goto CHAIN`.
pub fn verdict_text(code: i32, chain: Option<&str>) -> Option<String> {
    match (code, chain) {
        (NF_DROP, _) => Some("drop".into()),
        (NFT_JUMP, Some(chain)) => Some(format!("jump {chain}")),
        (NFT_GOTO, Some(chain)) => Some(format!("goto {chain}")),
        _ => None,
    }
}

/// Whether an address match is in the family of the table.
pub fn check_family(matched: &AddressMatch, ipv6: bool) -> Result<(), Unsupported> {
    if matched.is_ipv6() == ipv6 {
        Ok(())
    } else {
        Err("an address of the other family".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(texts: &[&str]) -> Vec<AddressMatch> {
        texts
            .iter()
            .map(|t| AddressMatch::parse(t).unwrap())
            .collect()
    }

    #[test]
    fn intervals_are_written_as_nft_writes_them() {
        let (elements, size) = interval_elements(&matches(&["203.0.113.0/25", "5.6.7.8"]), false);
        let hex: Vec<String> = elements
            .iter()
            .map(|e| {
                format!(
                    "{}{}",
                    hex(&e.key),
                    if e.kind == Bound::End { "E" } else { "" }
                )
            })
            .collect();
        assert_eq!(
            hex,
            [
                "00000000E",
                "05060708",
                "05060709E",
                "cb007100",
                "cb007180E"
            ]
        );
        assert_eq!(size, 5);
        // Touching ranges merge; one running to the last address has no end.
        let (elements, size) = interval_elements(&matches(&["0.0.0.0/1", "128.0.0.0/1"]), false);
        assert_eq!(
            elements,
            [IntervalElement {
                key: vec![0, 0, 0, 0],
                kind: Bound::OpenStart
            }]
        );
        assert_eq!(size, 2);
        let (elements, size) =
            interval_elements(&matches(&["198.51.100.0/24", "255.255.255.0/24"]), false);
        assert_eq!(elements.len(), 4);
        assert_eq!(size, 5);
        // Overlapping ranges merge.
        let (elements, size) = interval_elements(&matches(&["fd00::/8", "fd01::/16"]), true);
        assert_eq!(elements.len(), 3);
        assert_eq!(size, 3);
    }

    #[test]
    fn keys_pad_their_components_in_concatenations() {
        assert_eq!(
            key(&["172.30.0.41", "tcp", "80"]).unwrap(),
            [172, 30, 0, 41, 6, 0, 0, 0, 0, 80, 0, 0]
        );
        assert_eq!(
            key(&["udp", "30053"]).unwrap(),
            [17, 0, 0, 0, 0x75, 0x65, 0, 0]
        );
        assert_eq!(key(&["10.0.0.1"]).unwrap(), [10, 0, 0, 1]);
        assert!(key(&["icmp", "1"]).is_err());
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
