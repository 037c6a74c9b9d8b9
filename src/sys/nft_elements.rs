//! The elements of our own sets and maps read back over netlink, as the text this program writes
//! them in (`172.30.0.41 . tcp . 80`, with ` comment "ns/svc:p" : goto chain` after the key), so
//! that a restart writes only the elements that differ instead of refilling every set.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{
    DecodeError, NetlinkDeserializable, NetlinkHeader, NetlinkSerializable, NlaBuffer, NlasIterator,
};
use netlink_sys::protocols::NETLINK_NETFILTER;

use super::netlink::{Connection, NetlinkError};
use crate::model::IpFamily;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const LIST_TABLE: u16 = 1;
const LIST_SET: u16 = 2;
const LIST_ELEMENTS: u16 = 3;
const ELEM_KEY: u16 = 1;
const ELEM_DATA: u16 = 2;
const ELEM_FLAGS: u16 = 3;
const ELEM_USERDATA: u16 = 6;
const DATA_VALUE: u16 = 1;
const DATA_VERDICT: u16 = 2;
const VERDICT_CODE: u16 = 1;
const VERDICT_CHAIN: u16 = 2;
/// In an element's user data (libnftnl's TLVs), the comment.
const UDATA_ELEM_COMMENT: u8 = 0;
/// A dump the ruleset's changes interrupt is read again, this many times at most.
const DUMP_ATTEMPTS: usize = 5;

/// One component of a set's key, as its declaration names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Component {
    Ipv4,
    Ipv6,
    Protocol,
    Port,
}

impl Component {
    /// Bytes it takes alone, and in a concatenation (padded to four).
    fn len(self, concatenated: bool) -> usize {
        let len: usize = match self {
            Component::Ipv4 => 4,
            Component::Ipv6 => 16,
            Component::Protocol => 1,
            Component::Port => 2,
        };
        if concatenated {
            len.div_ceil(4) * 4
        } else {
            len
        }
    }

    /// Appends its text to `out`.
    fn write(self, bytes: &[u8], out: &mut String) -> Option<()> {
        match self {
            Component::Ipv4 => {
                let address = Ipv4Addr::from(<[u8; 4]>::try_from(bytes.get(..4)?).ok()?);
                write!(out, "{address}").ok()
            }
            Component::Ipv6 => {
                let address = Ipv6Addr::from(<[u8; 16]>::try_from(bytes.get(..16)?).ok()?);
                write!(out, "{address}").ok()
            }
            Component::Protocol => {
                out.push_str(match bytes.first()? {
                    6 => "tcp",
                    17 => "udp",
                    132 => "sctp",
                    _ => return None,
                });
                Some(())
            }
            Component::Port => {
                let port = u16::from_be_bytes([*bytes.first()?, *bytes.get(1)?]);
                write!(out, "{port}").ok()
            }
        }
    }
}

/// How a set's keys are laid out, from its declaration (`{ type ipv4_addr . inet_proto .
/// inet_service : verdict ; ... }`); `None` for a type this program never declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyLayout(Vec<Component>);

impl KeyLayout {
    pub fn from_spec(spec: &str) -> Option<KeyLayout> {
        let declared = spec
            .split(';')
            .next()?
            .trim()
            .trim_start_matches('{')
            .trim();
        let types = declared.strip_prefix("type ")?;
        let key = types.split(" : ").next()?;
        let components = key
            .split(" . ")
            .map(|word| match word.trim() {
                "ipv4_addr" => Some(Component::Ipv4),
                "ipv6_addr" => Some(Component::Ipv6),
                "inet_proto" => Some(Component::Protocol),
                "inet_service" => Some(Component::Port),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        (!components.is_empty()).then_some(KeyLayout(components))
    }

    /// A key's text, as this program writes it.
    pub fn key_text(&self, bytes: &[u8]) -> Option<String> {
        let concatenated = self.0.len() > 1;
        let mut text = String::with_capacity(48);
        let mut offset = 0;
        for (index, component) in self.0.iter().enumerate() {
            if index > 0 {
                text.push_str(" . ");
            }
            let len = component.len(concatenated);
            component.write(bytes.get(offset..offset + len)?, &mut text)?;
            offset += len;
        }
        (offset == bytes.len()).then_some(text)
    }
}

/// A GETSETELEM request, or a NEWSETELEM reply kept whole for decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElementsMessage {
    pub message_type: u16,
    /// nfgenmsg and attributes.
    pub payload: Vec<u8>,
}

impl ElementsMessage {
    /// The request for every element of `set` in `table` of `family`.
    pub fn dump_request(family: IpFamily, table: &str, set: &str) -> Self {
        let family = match family {
            IpFamily::V4 => 2,
            IpFamily::V6 => 10,
        };
        let mut payload = vec![family, 0, 0, 0];
        for (kind, value) in [(LIST_TABLE, table), (LIST_SET, set)] {
            let length = 4 + value.len() + 1;
            payload.extend((length as u16).to_ne_bytes());
            payload.extend(kind.to_ne_bytes());
            payload.extend(value.as_bytes());
            payload.push(0);
            payload.resize(payload.len().div_ceil(4) * 4, 0);
        }
        ElementsMessage {
            message_type: NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETSETELEM,
            payload,
        }
    }
}

impl NetlinkSerializable for ElementsMessage {
    fn message_type(&self) -> u16 {
        self.message_type
    }

    fn buffer_len(&self) -> usize {
        self.payload.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer.copy_from_slice(&self.payload);
    }
}

impl NetlinkDeserializable for ElementsMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, DecodeError> {
        Ok(ElementsMessage {
            message_type: header.message_type,
            payload: payload.to_vec(),
        })
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

fn nested(value: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    NlasIterator::new(value)
        .filter_map(Result::ok)
        .map(|attribute: NlaBuffer<&[u8]>| {
            let (kind, length) = (attribute.kind(), usize::from(attribute.length()));
            // The iterator's buffers run to the end of the list: the value is this attribute's.
            (
                kind,
                attribute.into_inner().get(4..length).unwrap_or_default(),
            )
        })
}

fn text(value: &[u8]) -> String {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

/// A verdict's text: `goto chain`, `drop`, ...
fn verdict_text(value: &[u8]) -> Option<String> {
    let (_, verdict) = nested(value).find(|(kind, _)| *kind == DATA_VERDICT)?;
    let mut code = None;
    let mut chain = None;
    for (kind, value) in nested(verdict) {
        match kind {
            VERDICT_CODE => code = Some(i32::from_be_bytes(value.get(..4)?.try_into().ok()?)),
            VERDICT_CHAIN => chain = Some(text(value)),
            _ => {}
        }
    }
    Some(match (code?, chain) {
        (0, _) => "drop".into(),
        (1, _) => "accept".into(),
        (-5, _) => "return".into(),
        (-3, Some(chain)) => format!("jump {chain}"),
        (-4, Some(chain)) => format!("goto {chain}"),
        _ => return None,
    })
}

/// An element's comment, from its user data.
fn element_comment(userdata: &[u8]) -> Option<String> {
    let mut rest = userdata;
    while let [kind, length, tail @ ..] = rest {
        let length = usize::from(*length);
        let value = tail.get(..length)?;
        if *kind == UDATA_ELEM_COMMENT {
            return Some(text(value));
        }
        rest = &tail[length..];
    }
    None
}

/// The elements a reply carries for `table`/`set`: key text -> the text after the key.
pub fn decode(
    reply: &ElementsMessage,
    table: &str,
    set: &str,
    layout: &KeyLayout,
    out: &mut Vec<(String, String)>,
) -> Result<(), String> {
    if reply.message_type & 0xff != NFT_MSG_NEWSETELEM {
        return Ok(());
    }
    let attributes = reply.payload.get(4..).unwrap_or_default();
    let mut names = (None, None);
    let mut list = None;
    for (kind, value) in nested(attributes) {
        match kind {
            LIST_TABLE => names.0 = Some(text(value)),
            LIST_SET => names.1 = Some(text(value)),
            LIST_ELEMENTS => list = Some(value),
            _ => {}
        }
    }
    if names.0.as_deref() != Some(table) || names.1.as_deref() != Some(set) {
        return Ok(());
    }
    for (_, element) in nested(list.unwrap_or_default()) {
        let mut key = None;
        let mut rest = String::new();
        let mut verdict = None;
        for (kind, value) in nested(element) {
            match kind {
                ELEM_KEY => {
                    let (_, bytes) = nested(value)
                        .find(|(k, _)| *k == DATA_VALUE)
                        .ok_or("a key without a value")?;
                    key = Some(layout.key_text(bytes).ok_or("a key of another layout")?);
                }
                ELEM_DATA => {
                    verdict = Some(verdict_text(value).ok_or("data that is not a verdict")?)
                }
                ELEM_FLAGS if value.iter().any(|b| *b != 0) => {
                    return Err("an interval or catch-all element".into());
                }
                ELEM_USERDATA => {
                    if let Some(comment) = element_comment(value) {
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

/// Every element of `set` (laid out as `layout`) in `table` of `family`, as text.
pub fn set_elements(
    family: IpFamily,
    table: &str,
    set: &str,
    layout: &KeyLayout,
) -> Result<BTreeMap<String, String>, ElementsError> {
    let mut connection = Connection::open(NETLINK_NETFILTER)?;
    let request = ElementsMessage::dump_request(family, table, set);
    let mut attempt = 1;
    let replies = loop {
        match connection.request(request.clone(), true) {
            Ok(replies) => break replies,
            Err(NetlinkError::DumpInterrupted) if attempt < DUMP_ATTEMPTS => attempt += 1,
            Err(err) => return Err(err.into()),
        }
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
    Ok(elements.into_iter().collect())
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
        let mut comment = vec![UDATA_ELEM_COMMENT, 13];
        comment.extend(b"ns6/svc6:p80\0");
        let mut element = key;
        element.extend(data);
        element.extend(attribute(ELEM_USERDATA, &comment));
        let mut payload = vec![2, 0, 0, 0];
        payload.extend(attribute(LIST_TABLE, b"kube-proxy\0"));
        payload.extend(attribute(LIST_SET, b"no-endpoint-services\0"));
        payload.extend(attribute(LIST_ELEMENTS, &attribute(1, &element)));
        let reply = ElementsMessage {
            message_type: NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWSETELEM,
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
