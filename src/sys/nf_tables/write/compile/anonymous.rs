//! A rule's anonymous sets and maps (`numgen ... vmap { ... }`, `... map { ... }`,
//! `ip saddr { ... }`): declared in the rule's batch, with their elements, as nft declares them.

use super::*;
use crate::sys::nf_tables::expr::Verdict;

/// An anonymous set or map being declared, and the lookup of it the rule holds.
struct Anonymous {
    name: String,
    flags: u32,
    key_type: u32,
    key_len: u32,
    /// A map's data other than a verdict: its type and length.
    data_type: Option<(u32, u32)>,
    elements: Vec<Element>,
    size: u32,
    udata: UserData,
    lookup: Expr,
}

impl Compiler {
    /// The name of the current rule's `index`-th anonymous set (`kind`: `map` or `set`).
    fn anonymous_name(&self, kind: &str, index: usize) -> String {
        match self.names {
            AnonymousNames::AsNft => format!("__{kind}%d"),
            AnonymousNames::ByRule => {
                use sha2::Digest;
                let (chain, place) = &self.current_rule;
                let digest = sha2::Sha256::digest(format!("{chain}#{place}#{index}").as_bytes());
                let encoded = data_encoding::BASE32_NOPAD.encode(&digest);
                format!("__{kind}{}", &encoded[..16])
            }
        }
    }

    pub(super) fn next_set_id(&mut self) -> u32 {
        self.last_set_id += 1;
        self.last_set_id
    }

    /// Declares a rule's anonymous set or map and its elements; returns the rule's lookup.
    pub(super) fn anonymous_set(
        &mut self,
        scope: Scope<'_>,
        set: rule::AnonymousSet,
    ) -> Result<Expr, Unsupported> {
        let id = self.next_set_id();
        self.anonymous_in_rule += 1;
        let index = self.anonymous_in_rule;
        let ipv6 = scope.is_ipv6();
        let anonymous = match set {
            rule::AnonymousSet::VerdictMap {
                targets,
                sreg,
                dreg,
            } => verdict_map(self.anonymous_name("map", index), id, targets, sreg, dreg),
            rule::AnonymousSet::DestinationMap {
                targets,
                sreg,
                dreg,
            } => {
                let name = self.anonymous_name("map", index);
                destination_map(name, id, ipv6, targets, sreg, dreg)
            }
            rule::AnonymousSet::Addresses {
                matches,
                source,
                sreg,
                inverted,
            } => {
                let name = self.anonymous_name("set", index);
                address_set(name, id, ipv6, &matches, source, (sreg, inverted))
            }
        };
        Ok(self.declare_anonymous(scope, id, anonymous))
    }

    /// The set's declaration, then its elements; returns the rule's lookup of it.
    fn declare_anonymous(&mut self, scope: Scope<'_>, id: u32, set: Anonymous) -> Expr {
        let mut a = Attributes::new();
        a.string(1, scope.table)
            .string(2, &set.name)
            .u32(3, set.flags)
            .u32(4, set.key_type)
            .u32(5, set.key_len);
        match set.data_type {
            Some((kind, len)) => {
                a.u32(6, kind).u32(7, len);
            }
            None if set.flags & SET_MAP != 0 => {
                a.u32(6, DATA_VERDICT).u32(7, 0);
            }
            None => {}
        }
        a.u32(10, id)
            .nested(9, |desc| {
                desc.u32(1, set.size);
            })
            .raw(13, set.udata.bytes());
        self.push(NFT_MSG_NEWSET, NLM_F_CREATE, scope, a);
        // A service with thousands of endpoints: its elements in several messages (the set is
        // bound, and so complete, only when the rule comes).
        let chunks: Vec<&[Element]> = if set.elements.is_empty() {
            vec![&[]]
        } else {
            set.elements.chunks(MAX_ELEMENTS_PER_MESSAGE).collect()
        };
        for chunk in chunks {
            let mut a = Attributes::new();
            a.string(1, scope.table).string(2, &set.name).u32(4, id);
            encode_elements(&mut a, chunk);
            self.push(NFT_MSG_NEWSETELEM, NLM_F_CREATE, scope, a);
        }
        set.lookup
    }
}

/// An anonymous map a `numgen` result indexes (keys 0, 1, ... in host order) to `data`.
fn numgen_map(
    name: String,
    id: u32,
    data: Vec<Data>,
    udata: UserData,
    (sreg, dreg): (u32, u32),
) -> Anonymous {
    let elements: Vec<Element> = data
        .into_iter()
        .enumerate()
        .map(|(index, data)| Element {
            key: (index as u32).to_ne_bytes().to_vec(),
            bound: None,
            data: Some(data),
            comment: None,
        })
        .collect();
    let size = elements.len() as u32;
    let lookup = Expr::Lookup {
        sreg,
        dreg: Some(dreg),
        set: SetRef {
            name: name.clone(),
            id: Some(id),
        },
        inverted: false,
    };
    Anonymous {
        name,
        flags: SET_ANONYMOUS | SET_CONSTANT | SET_MAP,
        key_type: TYPE_INTEGER,
        key_len: 4,
        data_type: None,
        elements,
        size,
        udata,
        lookup,
    }
}

/// `numgen ... vmap { 0 : goto A , ... }`: data a verdict (nft's typeof record of it).
fn verdict_map(name: String, id: u32, targets: Vec<Verdict>, sreg: u32, dreg: u32) -> Anonymous {
    let data = targets.into_iter().map(Data::Verdict).collect();
    let udata = UserData::new()
        .host_u32(UDATA_SET_KEYBYTEORDER, BYTEORDER_HOST)
        .host_u32(UDATA_SET_DATABYTEORDER, 0)
        .record(UDATA_SET_DATA_TYPEOF, &[0, 4, 1, 0, 0, 0, 1, 0])
        .host_u32(UDATA_SET_DATA_INTERVAL, 0);
    numgen_map(name, id, data, udata, (sreg, dreg))
}

/// `dnat ... to numgen ... map { 0 : A . P , ... }`: data an address and a port.
fn destination_map(
    name: String,
    id: u32,
    ipv6: bool,
    targets: Vec<(IpAddr, u16)>,
    sreg: u32,
    dreg: u32,
) -> Anonymous {
    let data = targets
        .into_iter()
        .map(|(address, port)| {
            let mut data = values::address_bytes(address);
            data.extend(port.to_be_bytes());
            data.extend([0, 0]);
            Data::Value(data)
        })
        .collect();
    let udata = UserData::new()
        .host_u32(UDATA_SET_KEYBYTEORDER, BYTEORDER_HOST)
        .host_u32(UDATA_SET_DATABYTEORDER, 0)
        .host_u32(UDATA_SET_DATA_INTERVAL, 0);
    let (address_type, address_len) = if ipv6 {
        (TYPE_IP6ADDR, 16)
    } else {
        (TYPE_IPADDR, 4)
    };
    Anonymous {
        data_type: Some((
            address_type << TYPE_BITS | TYPE_INET_SERVICE,
            address_len + 4,
        )),
        ..numgen_map(name, id, data, udata, (sreg, dreg))
    }
}

/// `ip saddr [!=] { 10.0.0.0/8, ... }`: an interval set of addresses, looked up from `sreg`
/// (inverted or not).
fn address_set(
    name: String,
    id: u32,
    ipv6: bool,
    matches: &[values::AddressMatch],
    source: bool,
    (sreg, inverted): (u32, bool),
) -> Anonymous {
    let (intervals, size) = values::interval_elements(matches, ipv6);
    let elements = intervals
        .into_iter()
        .map(|interval| Element {
            key: interval.key,
            bound: Some(interval.kind),
            data: None,
            comment: None,
        })
        .collect();
    // nft's description of the key's expression: the payload of the IP header's source or
    // destination field.
    let (header, field) = match (ipv6, source) {
        (false, true) => (12, 11),
        (false, false) => (12, 12),
        (true, true) => (13, 8),
        (true, false) => (13, 9),
    };
    let mut typeof_record = vec![0, 4, 7, 0, 0, 0, 1, 12, 0, 4, header, 0, 0, 0];
    typeof_record.extend([1, 4, field, 0, 0, 0]);
    let udata = UserData::new()
        .host_u32(UDATA_SET_KEYBYTEORDER, BYTEORDER_BIG)
        .host_u32(UDATA_SET_MERGE_ELEMENTS, 1)
        .record(UDATA_SET_KEY_TYPEOF, &typeof_record);
    let lookup = Expr::Lookup {
        sreg,
        dreg: None,
        set: SetRef {
            name: name.clone(),
            id: Some(id),
        },
        inverted,
    };
    let (key_type, key_len) = if ipv6 {
        (TYPE_IP6ADDR, 16)
    } else {
        (TYPE_IPADDR, 4)
    };
    Anonymous {
        name,
        flags: SET_ANONYMOUS | SET_CONSTANT | SET_INTERVAL,
        key_type,
        key_len,
        data_type: None,
        elements,
        size,
        udata,
        lookup,
    }
}
