//! nf_tables messages as bytes: netlink attributes (type-length-value, 4-byte aligned, nested
//! ones flagged), the nfgenmsg header, and a batch framed by BATCH_BEGIN / BATCH_END as `nft`
//! sends it. Pure: the layouts follow the kernel's uapi (linux/netfilter/nf_tables.h) and are
//! checked byte for byte against what `nft` sends (tests/testdata/nft/).

//!
//! Every nf_tables number this program uses is here, once: what the reads, the change events,
//! the writes and the iptables-nft read-back say to the kernel and hear from it.

/// The nf_tables netfilter subsystem, and its multicast group (the change events).
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub const NFNLGRP_NFTABLES: u32 = 7;
/// Batch delimiters (netfilter's own message types, not nf_tables').
pub const NFNL_MSG_BATCH_BEGIN: u16 = 16;
pub const NFNL_MSG_BATCH_END: u16 = 17;
/// nfgenmsg families.
pub use crate::sys::netlink::{Attributes, NFPROTO_IPV4, NFPROTO_IPV6};

/// nf_tables message types.
pub const NFT_MSG_NEWTABLE: u16 = 0;
pub const NFT_MSG_GETTABLE: u16 = 1;
pub const NFT_MSG_DELTABLE: u16 = 2;
pub const NFT_MSG_NEWCHAIN: u16 = 3;
pub const NFT_MSG_GETCHAIN: u16 = 4;
pub const NFT_MSG_DELCHAIN: u16 = 5;
pub const NFT_MSG_NEWRULE: u16 = 6;
pub const NFT_MSG_GETRULE: u16 = 7;
pub const NFT_MSG_DELRULE: u16 = 8;
pub const NFT_MSG_NEWSET: u16 = 9;
pub const NFT_MSG_GETSET: u16 = 10;
pub const NFT_MSG_DELSET: u16 = 11;
pub const NFT_MSG_NEWSETELEM: u16 = 12;
pub const NFT_MSG_GETSETELEM: u16 = 13;
pub const NFT_MSG_DELSETELEM: u16 = 14;
pub const NFT_MSG_NEWOBJ: u16 = 18;
pub const NFT_MSG_GETOBJ: u16 = 19;
pub const NFT_MSG_DELOBJ: u16 = 20;
pub const NFT_MSG_NEWFLOWTABLE: u16 = 22;
pub const NFT_MSG_GETFLOWTABLE: u16 = 23;
pub const NFT_MSG_DELFLOWTABLE: u16 = 24;
/// A flowtable: NFTA_FLOWTABLE_TABLE is 1, then these; its hook's number, priority and devices.
pub const NFTA_FLOWTABLE_NAME: u16 = 2;
pub const NFTA_FLOWTABLE_HOOK: u16 = 3;
pub const NFTA_FLOWTABLE_FLAGS: u16 = 7;
pub const NFTA_FLOWTABLE_HOOK_NUM: u16 = 1;
pub const NFTA_FLOWTABLE_HOOK_PRIORITY: u16 = 2;
pub const NFTA_FLOWTABLE_HOOK_DEVS: u16 = 3;
pub const NFTA_DEVICE_NAME: u16 = 1;
/// Stateful objects (`add counter`): NFTA_OBJ_TABLE is 1, then these.
pub const NFTA_OBJ_NAME: u16 = 2;
pub const NFTA_OBJ_TYPE: u16 = 3;
pub const NFTA_OBJ_DATA: u16 = 4;
pub const NFT_OBJECT_COUNTER: u32 = 1;
pub const NFTA_COUNTER_BYTES: u16 = 1;
pub const NFTA_COUNTER_PACKETS: u16 = 2;

/// Attributes. The table is attribute 1 of table, chain, rule and set messages alike
/// (NFTA_TABLE_NAME, NFTA_CHAIN_TABLE, NFTA_RULE_TABLE, NFTA_SET_TABLE).
pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_RULE_CHAIN: u16 = 2;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub const NFTA_RULE_USERDATA: u16 = 7;
/// A set's name: NFTA_SET_NAME and NFTA_SET_ELEM_LIST_SET are both 2.
pub const NFTA_SET_NAME: u16 = 2;
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_DATA: u16 = 2;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub const NFTA_SET_ELEM_USERDATA: u16 = 6;
pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
pub const NFTA_VERDICT_CODE: u16 = 1;
pub const NFTA_VERDICT_CHAIN: u16 = 2;
pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;
/// In a rule's or an element's user data (libnftnl's TLVs), the comment.
pub const NFTNL_UDATA_COMMENT: u8 = 0;
pub use crate::sys::netlink::NLA_TYPE_MASK;

/// Expressions: registers (the verdict register and the 16-byte register 1, whose 32-bit
/// parts are 8..11), payload bases, comparison operators, meta and conntrack keys.
pub const REG_VERDICT: u32 = 0;
pub const REG_1: u32 = 1;
pub const REG_2: u32 = 2;
pub const BASE_NETWORK: u32 = 1;
pub const BASE_TRANSPORT: u32 = 2;
pub const CMP_EQ: u32 = 0;
pub const CMP_NEQ: u32 = 1;
pub const CMP_LTE: u32 = 3;
pub const CMP_GT: u32 = 4;
pub const META_MARK: u32 = 3;
pub const META_IIFNAME: u32 = 6;
pub const META_OIFNAME: u32 = 7;
pub const META_L4PROTO: u32 = 16;
pub const CT_STATE: u32 = 0;
pub const CT_STATUS: u32 = 2;
/// The packets of a connection, both directions (host order, 64 bits).
pub const CT_PACKETS: u32 = 14;
/// A direction's destination address, IPv4 and IPv6 (`ct original ip daddr`).
pub const CT_DST_IP: u32 = 20;
pub const CT_DST_IP6: u32 = 22;
/// Verdict codes.
pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_JUMP: i32 = -3;
pub const NFT_GOTO: i32 = -4;
pub const NFT_RETURN: i32 = -5;
/// A verdict map's data type.
pub const DATA_VERDICT: u32 = 0xffff_ff00;
/// Set flags.
pub const SET_ANONYMOUS: u32 = 0x1;
pub const SET_CONSTANT: u32 = 0x2;
pub const SET_INTERVAL: u32 = 0x4;
pub const SET_MAP: u32 = 0x8;
pub const SET_TIMEOUT: u32 = 0x10;
pub const SET_EVAL: u32 = 0x20;
/// An element that ends an interval.
pub const ELEM_INTERVAL_END: u32 = 0x1;
/// Lookup flag: match when the key is not in the set.
pub const LOOKUP_INVERTED: u32 = 0x1;

/// Netlink header flags.
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;
/// libnftnl's user data: records of a type byte, a length byte and the value. Comments are
/// NUL-terminated strings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserData {
    bytes: Vec<u8>,
}

impl UserData {
    pub fn new() -> Self {
        UserData::default()
    }

    pub fn record(mut self, kind: u8, value: &[u8]) -> Self {
        self.bytes.push(kind);
        self.bytes.push(value.len() as u8);
        self.bytes.extend_from_slice(value);
        self
    }

    /// A string record (NUL-terminated, as nft writes comments).
    pub fn text(self, kind: u8, value: &str) -> Self {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        self.record(kind, &bytes)
    }

    /// A 32-bit record in host byte order (nft's byte-order and interval records).
    pub fn host_u32(self, kind: u8, value: u32) -> Self {
        self.record(kind, &value.to_ne_bytes())
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// One nf_tables request: its message type (within the subsystem), header flags, the
/// nfgenmsg family and its attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub kind: u16,
    pub flags: u16,
    pub family: u8,
    pub attributes: Vec<u8>,
}

impl Message {
    /// The message on the wire with `sequence` as its number.
    pub fn write(&self, sequence: u32, out: &mut Vec<u8>) {
        let length = 16 + 4 + self.attributes.len();
        out.extend_from_slice(&(length as u32).to_ne_bytes());
        out.extend_from_slice(&(NFNL_SUBSYS_NFTABLES << 8 | self.kind).to_ne_bytes());
        out.extend_from_slice(&(NLM_F_REQUEST | self.flags).to_ne_bytes());
        out.extend_from_slice(&sequence.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: family, version 0, resource id 0.
        out.extend_from_slice(&[self.family, 0, 0, 0]);
        out.extend_from_slice(&self.attributes);
    }
}

/// A batch delimiter: nfgenmsg with family AF_UNSPEC and the subsystem as resource id.
fn delimiter(kind: u16, sequence: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&20u32.to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    out.extend_from_slice(&sequence.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&NFNL_SUBSYS_NFTABLES.to_be_bytes());
}

/// The batch that applies `messages` as one transaction, numbered from `first_sequence`
/// (BATCH_BEGIN has it, the messages follow, BATCH_END comes last).
pub fn batch(messages: &[Message], first_sequence: u32) -> Vec<u8> {
    let mut out = unterminated_batch(messages, first_sequence);
    delimiter(
        NFNL_MSG_BATCH_END,
        first_sequence.wrapping_add(1 + messages.len() as u32),
        &mut out,
    );
    out
}

/// `messages` after BATCH_BEGIN and no BATCH_END: the kernel handles each message and then
/// aborts the transaction (what `nft --check` sends).
pub fn unterminated_batch(messages: &[Message], first_sequence: u32) -> Vec<u8> {
    let size: usize = messages.iter().map(|m| 20 + m.attributes.len()).sum();
    let mut out = Vec::with_capacity(size + 40);
    delimiter(NFNL_MSG_BATCH_BEGIN, first_sequence, &mut out);
    for (index, message) in messages.iter().enumerate() {
        message.write(first_sequence.wrapping_add(1 + index as u32), &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_pad_and_nest() {
        let mut attributes = Attributes::new();
        attributes.string(1, "kube-proxy").nested(4, |inner| {
            inner.u32(1, 0).u32(2, (-110i32) as u32);
        });
        assert_eq!(
            attributes.bytes(),
            [
                15, 0, 1, 0, b'k', b'u', b'b', b'e', b'-', b'p', b'r', b'o', b'x', b'y', 0, 0, 20,
                0, 4, 0x80, 8, 0, 1, 0, 0, 0, 0, 0, 8, 0, 2, 0, 0xff, 0xff, 0xff, 0x92,
            ]
        );
    }

    #[test]
    fn a_batch_is_framed_as_nft_frames_it() {
        let message = Message {
            kind: NFT_MSG_NEWCHAIN,
            flags: NLM_F_CREATE,
            family: 2,
            attributes: Vec::new(),
        };
        let bytes = batch(&[message], 7);
        assert_eq!(bytes.len(), 60);
        // BATCH_BEGIN: type 16, request, sequence 7, resource id 10 in network order.
        assert_eq!(&bytes[4..6], &16u16.to_ne_bytes());
        assert_eq!(&bytes[8..12], &7u32.to_ne_bytes());
        assert_eq!(&bytes[16..20], &[0, 0, 0, 10]);
        // The message: subsystem 10, NEWCHAIN, request | create, sequence 8, family ip.
        assert_eq!(&bytes[24..26], &0x0a03u16.to_ne_bytes());
        assert_eq!(&bytes[26..28], &0x0401u16.to_ne_bytes());
        assert_eq!(&bytes[28..32], &8u32.to_ne_bytes());
        assert_eq!(bytes[36], 2);
        // BATCH_END, sequence 9.
        assert_eq!(&bytes[44..46], &17u16.to_ne_bytes());
        assert_eq!(&bytes[48..52], &9u32.to_ne_bytes());
    }
}
