//! The elements of our own sets and maps read back over netlink, as the text this program writes
//! them in (`172.30.0.41 . tcp . 80`, with ` comment "ns/svc:p" : goto chain` after the key), so
//! that a restart writes only the elements that differ instead of refilling every set.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::read::{RawMessage, attributes, dump, nul_terminated, udata_comment};
use super::write::{KeyType, protocol_name, verdict_text};
use crate::model::IpFamily;
use crate::sys::netlink::{Connection, NetlinkError};

use super::wire::{
    Attributes, NFT_MSG_GETSETELEM, NFT_MSG_NEWSETELEM, NFTA_DATA_VALUE as DATA_VALUE,
    NFTA_DATA_VERDICT as DATA_VERDICT, NFTA_SET_ELEM_DATA as ELEM_DATA,
    NFTA_SET_ELEM_FLAGS as ELEM_FLAGS, NFTA_SET_ELEM_KEY as ELEM_KEY,
    NFTA_SET_ELEM_LIST_ELEMENTS as LIST_ELEMENTS, NFTA_SET_ELEM_LIST_SET as LIST_SET,
    NFTA_SET_ELEM_LIST_TABLE as LIST_TABLE, NFTA_SET_ELEM_USERDATA as ELEM_USERDATA,
    NFTA_VERDICT_CHAIN as VERDICT_CHAIN, NFTA_VERDICT_CODE as VERDICT_CODE,
};

/// Bytes a key component takes in a key: alone, or padded to four in a concatenation.
fn len_in_key(kind: KeyType, concatenated: bool) -> usize {
    if concatenated {
        kind.value_len().div_ceil(4) * 4
    } else {
        kind.value_len()
    }
}

/// Appends a key component's text to `out`.
fn write_component(kind: KeyType, bytes: &[u8], out: &mut String) -> Option<()> {
    match kind {
        KeyType::Ipv4 => {
            let address = Ipv4Addr::from(<[u8; 4]>::try_from(bytes.get(..4)?).ok()?);
            write!(out, "{address}").ok()
        }
        KeyType::Ipv6 => {
            let address = Ipv6Addr::from(<[u8; 16]>::try_from(bytes.get(..16)?).ok()?);
            write!(out, "{address}").ok()
        }
        KeyType::Protocol => {
            out.push_str(protocol_name(*bytes.first()?)?);
            Some(())
        }
        KeyType::Port => {
            let port = u16::from_be_bytes([*bytes.first()?, *bytes.get(1)?]);
            write!(out, "{port}").ok()
        }
    }
}

/// How a set's keys are laid out, from its declaration (`{ type ipv4_addr . inet_proto .
/// inet_service : verdict ; ... }`); `None` for a type this program never declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyLayout {
    Keys(Vec<KeyType>),
    /// `typeof numgen random mod N : ip daddr . PROTO dport ; flags interval`: intervals of draws
    /// (`0-32767`) to an address and a port (` : 10.0.0.1 . 80`).
    Draws,
    /// A rule's anonymous map that a `numgen` result indexes: keys 0, 1, ... (host order) to a
    /// verdict (` : goto chain`) or an address and a port (` : 10.0.0.1 . 80`).
    Indices,
}

impl KeyLayout {
    pub fn from_spec(spec: &str) -> Option<KeyLayout> {
        let declared = spec
            .split(';')
            .next()?
            .trim()
            .trim_start_matches('{')
            .trim();
        if declared.starts_with("typeof numgen random mod ")
            && ["th", "tcp", "udp", "sctp"]
                .iter()
                .any(|proto| declared.ends_with(&format!(" daddr . {proto} dport")))
        {
            return Some(KeyLayout::Draws);
        }
        let types = declared.strip_prefix("type ")?;
        let key = types.split(" : ").next()?;
        let components = key
            .split(" . ")
            .map(|word| KeyType::parse(word.trim()))
            .collect::<Option<Vec<_>>>()?;
        (!components.is_empty()).then_some(KeyLayout::Keys(components))
    }

    /// A key's text, as this program writes it (draws are read as intervals instead, see
    /// [`set_elements`]).
    pub fn key_text(&self, bytes: &[u8]) -> Option<String> {
        let components = match self {
            KeyLayout::Keys(components) => components,
            KeyLayout::Indices => {
                return Some(u32::from_ne_bytes(bytes.try_into().ok()?).to_string());
            }
            KeyLayout::Draws => return None,
        };
        let concatenated = components.len() > 1;
        let mut text = String::with_capacity(48);
        let mut offset = 0;
        for (index, kind) in components.iter().enumerate() {
            if index > 0 {
                text.push_str(" . ");
            }
            let len = len_in_key(*kind, concatenated);
            write_component(*kind, bytes.get(offset..offset + len)?, &mut text)?;
            offset += len;
        }
        (offset == bytes.len()).then_some(text)
    }
}

/// Why elements could not be read as text.
#[derive(Debug, thiserror::Error)]
pub enum ElementsError {
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("set {set}: {what}")]
    Undecodable { set: String, what: String },
}

/// A verdict's text: `goto chain`, `drop`, `jump chain`.
fn verdict(value: &[u8]) -> Option<String> {
    let (_, verdict) = attributes(value).find(|(kind, _)| *kind == DATA_VERDICT)?;
    let mut code = None;
    let mut chain = None;
    for (kind, value) in attributes(verdict) {
        match kind {
            VERDICT_CODE => code = Some(i32::from_be_bytes(value.get(..4)?.try_into().ok()?)),
            VERDICT_CHAIN => chain = Some(nul_terminated(value)),
            _ => {}
        }
    }
    verdict_text(code?, chain.as_deref())
}

/// The element list of a reply for `table`/`set` (empty for another reply).
fn element_list<'a>(reply: &'a RawMessage, table: &str, set: &str) -> &'a [u8] {
    let Some(message) = reply.attributes_of(NFT_MSG_NEWSETELEM) else {
        return &[];
    };
    let mut names = (None, None);
    let mut list: &[u8] = &[];
    for (kind, value) in attributes(message) {
        match kind {
            LIST_TABLE => names.0 = Some(nul_terminated(value)),
            LIST_SET => names.1 = Some(nul_terminated(value)),
            LIST_ELEMENTS => list = value,
            _ => {}
        }
    }
    if names.0.as_deref() != Some(table) || names.1.as_deref() != Some(set) {
        return &[];
    }
    list
}

/// The elements a reply carries for `table`/`set`: key text -> the text after the key.
pub(crate) fn decode(
    reply: &RawMessage,
    table: &str,
    set: &str,
    layout: &KeyLayout,
    out: &mut Vec<(String, String)>,
) -> Result<(), String> {
    for (_, element) in attributes(element_list(reply, table, set)) {
        let mut key = None;
        let mut rest = String::new();
        let mut verdict = None;
        for (kind, value) in attributes(element) {
            match kind {
                ELEM_KEY => {
                    let bytes = data_value(value).ok_or("a key without a value")?;
                    key = Some(layout.key_text(bytes).ok_or("a key of another layout")?);
                }
                ELEM_DATA => {
                    let destination = || {
                        let destination = destination_text(data_value(value)?)?;
                        Some(destination.trim_start_matches(" : ").to_string())
                    };
                    let data = match layout {
                        KeyLayout::Indices => self::verdict(value).or_else(destination),
                        _ => self::verdict(value),
                    };
                    verdict = Some(data.ok_or("data that is neither a verdict nor a destination")?)
                }
                ELEM_FLAGS if value.iter().any(|b| *b != 0) => {
                    return Err("an interval or catch-all element".into());
                }
                ELEM_USERDATA => {
                    if let Some(comment) = udata_comment(value) {
                        rest.push_str(&format!(" comment \"{comment}\""));
                    }
                }
                _ => {}
            }
        }
        if let Some(verdict) = verdict {
            rest.push_str(&format!(" : {verdict}"));
        }
        out.push((key.ok_or("an element without a key")?, rest));
    }
    Ok(())
}

/// The elements of a map of draws in one reply, as `(FIRST, ' : ADDRESS . PORT')` for starts
/// and `(END, "")` for ends (the draw after an interval's last); [`intervals`] pairs them.
fn decode_draws(list: &[u8], out: &mut Vec<(u32, String)>) -> Result<(), String> {
    for (_, element) in attributes(list) {
        let mut key = None;
        let mut data = None;
        let mut end = false;
        for (kind, value) in attributes(element) {
            match kind {
                ELEM_KEY => {
                    let bytes = data_value(value).ok_or("a key without a value")?;
                    key = Some(u32::from_be_bytes(
                        bytes.try_into().map_err(|_| "a key that is not a draw")?,
                    ));
                }
                ELEM_DATA => {
                    let bytes = data_value(value).ok_or("data without a value")?;
                    data = Some(destination_text(bytes).ok_or("data that is not a destination")?);
                }
                ELEM_FLAGS => end = value.get(..4).is_some_and(|f| f != [0, 0, 0, 0]),
                _ => {}
            }
        }
        let key = key.ok_or("an element without a key")?;
        match (end, data) {
            (true, _) => out.push((key, String::new())),
            (false, Some(data)) => out.push((key, data)),
            (false, None) => return Err("a start of an interval without data".into()),
        }
    }
    Ok(())
}

/// The bytes of an NFTA_DATA_VALUE nested in a key or data attribute.
fn data_value(nested: &[u8]) -> Option<&[u8]> {
    attributes(nested)
        .find(|(kind, _)| *kind == DATA_VALUE)
        .map(|(_, bytes)| bytes)
}

/// ` : ADDRESS . PORT` from an address, a port and two bytes of padding.
fn destination_text(bytes: &[u8]) -> Option<String> {
    let (address, port): (std::net::IpAddr, &[u8]) = match bytes.len() {
        8 => (
            Ipv4Addr::from(<[u8; 4]>::try_from(&bytes[..4]).ok()?).into(),
            &bytes[4..6],
        ),
        20 => (
            Ipv6Addr::from(<[u8; 16]>::try_from(&bytes[..16]).ok()?).into(),
            &bytes[16..18],
        ),
        _ => return None,
    };
    Some(format!(
        " : {address} . {}",
        u16::from_be_bytes([port[0], port[1]])
    ))
}

/// Interval elements as this program writes them (`FIRST-LAST`), from starts (with data) and
/// ends (without): each start runs to the next end.
fn intervals(mut bounds: Vec<(u32, String)>) -> Result<BTreeMap<String, String>, String> {
    bounds.sort_by_key(|(key, data)| (*key, !data.is_empty()));
    let mut out = BTreeMap::new();
    let mut open: Option<(u32, String)> = None;
    for (key, data) in bounds {
        if data.is_empty() {
            // An end that closes nothing ends the gap below the first interval (nft writes
            // one at 0).
            if let Some((first, data)) = open.take() {
                out.insert(format!("{first}-{}", key.wrapping_sub(1)), data);
            }
        } else if open.replace((key, data)).is_some() {
            return Err("a start without an end".into());
        }
    }
    if open.is_some() {
        return Err("a start without an end".into());
    }
    Ok(out)
}

/// Every element of `set` (laid out as `layout`) in `table` of `family`, as text, over
/// `connection` (one for many sets).
pub fn set_elements(
    connection: &mut Connection,
    family: IpFamily,
    table: &str,
    set: &str,
    layout: &KeyLayout,
) -> Result<BTreeMap<String, String>, ElementsError> {
    let request = RawMessage::request(
        NFT_MSG_GETSETELEM,
        family,
        &[(LIST_TABLE, table), (LIST_SET, set)],
    );
    let replies = dump(connection, request)?;
    let undecodable = |what| ElementsError::Undecodable {
        set: set.to_string(),
        what,
    };
    if *layout == KeyLayout::Draws {
        let mut bounds = Vec::new();
        for reply in &replies {
            decode_draws(element_list(reply, table, set), &mut bounds).map_err(undecodable)?;
        }
        return intervals(bounds).map_err(undecodable);
    }
    let mut elements = Vec::new();
    for reply in &replies {
        decode(reply, table, set, layout, &mut elements).map_err(undecodable)?;
    }
    Ok(elements.into_iter().collect())
}

/// The intervals of addresses an interval set of addresses holds (a rule's anonymous set of
/// prefixes), each as its first address and the one after its last, as numbers.
pub fn address_intervals(
    connection: &mut Connection,
    family: IpFamily,
    table: &str,
    set: &str,
) -> Result<Vec<(u128, u128)>, ElementsError> {
    let request = RawMessage::request(
        NFT_MSG_GETSETELEM,
        family,
        &[(LIST_TABLE, table), (LIST_SET, set)],
    );
    let mut bounds: Vec<(u128, bool)> = Vec::new();
    for reply in &dump(connection, request)? {
        for (_, element) in attributes(element_list(reply, table, set)) {
            let (mut key, mut end) = (None, false);
            for (kind, value) in attributes(element) {
                match kind {
                    ELEM_KEY => key = data_value(value).and_then(address_number),
                    ELEM_FLAGS => end = value.get(..4).is_some_and(|f| f != [0, 0, 0, 0]),
                    _ => {}
                }
            }
            bounds.extend(key.map(|key| (key, !end)));
        }
    }
    Ok(bounded_intervals(bounds))
}

/// Intervals from their bounds, each `(key, true)` for a start and `(key, false)` for the end
/// after its last: each start runs to the next end (an end at 0 closes the gap below the
/// first).
pub fn bounded_intervals(mut bounds: Vec<(u128, bool)>) -> Vec<(u128, u128)> {
    bounds.sort_unstable();
    let mut intervals = Vec::new();
    let mut open = None;
    for (key, start) in bounds {
        match (start, open.take()) {
            (true, _) => open = Some(key),
            (false, Some(first)) => intervals.push((first, key)),
            (false, None) => {}
        }
    }
    intervals.extend(open.map(|first| (first, u128::MAX)));
    intervals
}

/// An address's bytes (4 or 16) as a number.
pub fn address_number(bytes: &[u8]) -> Option<u128> {
    match bytes.len() {
        4 => Some(u128::from(u32::from_be_bytes(bytes.try_into().ok()?))),
        16 => Some(u128::from_be_bytes(bytes.try_into().ok()?)),
        _ => None,
    }
}

/// The element of `set` (laid out as `layout`) whose key is `key` (its bytes as the kernel holds
/// them), as text, or `None` when the set holds none: one request for one element.
pub fn element(
    connection: &mut Connection,
    family: IpFamily,
    table: &str,
    set: &str,
    layout: &KeyLayout,
    key: &[u8],
) -> Result<Option<(String, String)>, ElementsError> {
    let mut request = RawMessage::request(
        NFT_MSG_GETSETELEM,
        family,
        &[(LIST_TABLE, table), (LIST_SET, set)],
    );
    let mut list = Attributes::new();
    list.nested(LIST_ELEMENTS, |elements| {
        elements.nested(1, |element| {
            element.nested(ELEM_KEY, |k| {
                k.raw(DATA_VALUE, key);
            });
        });
    });
    request.payload.extend(list.into_bytes());
    let replies = match connection.request(request, false) {
        Ok(replies) => replies,
        Err(err) if err.errno() == Some(nix::libc::ENOENT) => return Ok(None),
        Err(err) => return Err(err.into()),
    };
    let mut elements = Vec::new();
    for reply in &replies {
        decode(reply, table, set, layout, &mut elements).map_err(|what| {
            ElementsError::Undecodable {
                set: set.to_string(),
                what,
            }
        })?;
    }
    Ok(elements.into_iter().next())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        out.extend(kind.to_ne_bytes());
        out.extend(value);
        out.resize(out.len().div_ceil(4) * 4, 0);
        out
    }

    #[test]
    fn layouts_come_from_our_declarations() {
        let map = KeyLayout::from_spec(
            "{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"x\" ; }",
        )
        .unwrap();
        let key = [172, 30, 0, 41, 6, 0, 0, 0, 0, 80, 0, 0];
        assert_eq!(
            map.key_text(&key).as_deref(),
            Some("172.30.0.41 . tcp . 80")
        );
        assert_eq!(map.key_text(&key[..8]), None);
        let set =
            KeyLayout::from_spec("{ type ipv6_addr ; comment \"Active ClusterIPs\" ; }").unwrap();
        let mut v6 = [0u8; 16];
        v6[0] = 0xfd;
        v6[15] = 0x41;
        assert_eq!(set.key_text(&v6).as_deref(), Some("fd00::41"));
        assert_eq!(KeyLayout::from_spec("{ type mark ; }"), None);
    }

    #[test]
    fn replies_decode_to_the_text_we_write() {
        let layout =
            KeyLayout::from_spec("{ type ipv4_addr . inet_proto . inet_service : verdict ; }")
                .unwrap();
        let key = attribute(
            ELEM_KEY,
            &attribute(DATA_VALUE, &[172, 30, 0, 46, 6, 0, 0, 0, 0, 80, 0, 0]),
        );
        let mut verdict = attribute(VERDICT_CODE, &(-4i32).to_be_bytes());
        verdict.extend(attribute(VERDICT_CHAIN, b"reject-chain\0"));
        let data = attribute(ELEM_DATA, &attribute(DATA_VERDICT, &verdict));
        let mut comment = vec![0, 13]; // libnftnl: the comment (type 0), 13 bytes
        comment.extend(b"ns6/svc6:p80\0");
        let mut element = key;
        element.extend(data);
        element.extend(attribute(ELEM_USERDATA, &comment));
        let mut payload = vec![2, 0, 0, 0];
        payload.extend(attribute(LIST_TABLE, b"kube-proxy\0"));
        payload.extend(attribute(LIST_SET, b"no-endpoint-services\0"));
        payload.extend(attribute(LIST_ELEMENTS, &attribute(1, &element)));
        let reply = RawMessage {
            message_type: 10 << 8 | NFT_MSG_NEWSETELEM,
            payload,
        };
        let mut out = Vec::new();
        decode(
            &reply,
            "kube-proxy",
            "no-endpoint-services",
            &layout,
            &mut out,
        )
        .unwrap();
        assert_eq!(
            out,
            [(
                "172.30.0.46 . tcp . 80".to_string(),
                " comment \"ns6/svc6:p80\" : goto reject-chain".to_string()
            )]
        );
        // Another set's reply is not this set's.
        let mut other = Vec::new();
        decode(&reply, "kube-proxy", "service-ips", &layout, &mut other).unwrap();
        assert!(other.is_empty());
    }
}
