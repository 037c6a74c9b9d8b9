//! Named sets' declarations and elements: parsed from our text, encoded as nft encodes them.

use super::*;

/// A named set's declaration: `type T [. T ...] [: verdict] ; [flags dynamic,timeout ;]
/// [timeout Ns ;] [comment "..." ;]`.
pub(super) struct SetSpec<'a> {
    /// `typeof numgen random mod N : ip daddr . PROTO dport ; flags interval`: a map from
    /// intervals of draws to an address and a port (the draws, and nft's number for the
    /// transport header the port is read from).
    pub(super) destinations: Option<(u32, u8)>,
    pub(super) key_type: u32,
    pub(super) key_len: u32,
    pub(super) components: usize,
    pub(super) dynamic: bool,
    pub(super) timeout_flag: bool,
    pub(super) timeout_ms: Option<u64>,
    pub(super) comment: Option<&'a str>,
}

impl<'a> SetSpec<'a> {
    pub(super) fn parse(spec: &[&'a str], is_map: bool) -> Result<Self, Unsupported> {
        let mut parsed = SetSpec {
            destinations: None,
            key_type: 0,
            key_len: 0,
            components: 0,
            dynamic: false,
            timeout_flag: false,
            timeout_ms: None,
            comment: None,
        };
        for clause in spec.split(|w| *w == ";").filter(|c| !c.is_empty()) {
            match clause {
                ["type", key @ ..] => {
                    let key = if is_map {
                        match key {
                            [key @ .., ":", "verdict"] => key,
                            _ => return Err("a map's data must be a verdict".into()),
                        }
                    } else {
                        key
                    };
                    for (index, word) in key.iter().enumerate() {
                        if index % 2 == 1 {
                            if *word != "." {
                                return Err(format!("unexpected {word:?} in a set type"));
                            }
                            continue;
                        }
                        let kind = KeyType::parse(word)
                            .ok_or_else(|| format!("unknown set type {word:?}"))?;
                        parsed.key_type = parsed.key_type << TYPE_BITS | kind.number();
                        // Each component of a key takes four bytes or more.
                        parsed.key_len += kind.value_len().div_ceil(4) as u32 * 4;
                        parsed.components += 1;
                    }
                    if parsed.components == 1
                        && parsed.key_type != TYPE_IPADDR
                        && parsed.key_type != TYPE_IP6ADDR
                    {
                        return Err("only address sets stand alone".into());
                    }
                }
                [
                    "typeof",
                    "numgen",
                    "random",
                    "mod",
                    draws,
                    ":",
                    "ip" | "ip6",
                    "daddr",
                    ".",
                    transport,
                    "dport",
                ] if is_map => {
                    let draws: u32 = draws
                        .parse()
                        .map_err(|_| format!("not a modulus: {draws:?}"))?;
                    let header = transport_header(transport)
                        .ok_or_else(|| format!("unknown transport header {transport:?}"))?;
                    parsed.destinations = Some((draws, header));
                    parsed.key_type = TYPE_INTEGER;
                    parsed.key_len = 4;
                    parsed.components = 1;
                }
                ["flags", "interval"] if parsed.destinations.is_some() => {}
                ["flags", flags] => {
                    for flag in flags.split(',') {
                        match flag {
                            "dynamic" => parsed.dynamic = true,
                            "timeout" => parsed.timeout_flag = true,
                            other => return Err(format!("unknown set flag {other:?}")),
                        }
                    }
                }
                ["timeout", timeout] => {
                    let seconds: u64 = timeout
                        .strip_suffix('s')
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| format!("not a timeout in seconds: {timeout:?}"))?;
                    parsed.timeout_ms = Some(seconds * 1000);
                }
                ["comment", comment] => parsed.comment = Some(unquote(comment)?),
                other => return Err(format!("unsupported set clause {other:?}")),
            }
        }
        if parsed.components == 0 {
            return Err("a set needs a type".into());
        }
        Ok(parsed)
    }
}

/// One element: its key, which bound of an interval it is (interval sets), its verdict
/// (maps) and comment.
pub(super) struct Element {
    pub(super) key: Vec<u8>,
    pub(super) bound: Option<Bound>,
    pub(super) data: Option<Data>,
    pub(super) comment: Option<String>,
}

impl Element {
    /// `KEY [. KEY ...] [comment "..."] [: VERDICT]`, or `FIRST-LAST : ADDRESS . PORT` (an
    /// interval of draws, two elements); deletions name the key only.
    pub(super) fn parse(body: &[&str], add: bool, ipv6: bool) -> Result<Vec<Self>, Unsupported> {
        if let Some((first, last)) = body.first().and_then(|w| draw_interval(w)) {
            let data = match &body[1..] {
                [] if !add => None,
                [":", address, ".", port] if add => {
                    let address: IpAddr = address
                        .parse()
                        .map_err(|_| format!("not an address: {address:?}"))?;
                    if address.is_ipv6() != ipv6 {
                        return Err("an address of the other family".into());
                    }
                    let port: u16 = port.parse().map_err(|_| format!("not a port: {port:?}"))?;
                    let mut data = values::address_bytes(address);
                    data.extend(port.to_be_bytes());
                    data.extend([0, 0]);
                    Some(Data::Value(data))
                }
                _ => return Err("unsupported interval element".into()),
            };
            let end = last
                .checked_add(1)
                .ok_or_else(|| "an interval that reaches the last draw".to_string())?;
            return Ok(vec![
                Element {
                    key: first.to_be_bytes().to_vec(),
                    bound: None,
                    data,
                    comment: None,
                },
                Element {
                    key: end.to_be_bytes().to_vec(),
                    bound: Some(Bound::End),
                    data: None,
                    comment: None,
                },
            ]);
        }
        Self::parse_one(body, add).map(|element| vec![element])
    }

    fn parse_one(body: &[&str], add: bool) -> Result<Self, Unsupported> {
        let split = body.iter().position(|w| *w == "comment" || *w == ":");
        let (key_words, mut rest) = body.split_at(split.unwrap_or(body.len()));
        let components: Vec<&str> = key_words
            .iter()
            .enumerate()
            .filter_map(|(i, w)| (i % 2 == 0).then_some(*w))
            .collect();
        if key_words
            .iter()
            .enumerate()
            .any(|(i, w)| i % 2 == 1 && *w != ".")
        {
            return Err("unexpected word in an element key".into());
        }
        let key = values::key(&components)?;
        let mut comment = None;
        if let ["comment", text, tail @ ..] = rest {
            comment = Some(unquote(text)?.to_string());
            rest = tail;
        }
        let data = match rest {
            [] => None,
            [":", verdict @ ..] => Some(Data::Verdict(parse_verdict(verdict)?)),
            _ => return Err("unsupported element".into()),
        };
        if !add && (data.is_some() || comment.is_some()) {
            return Err("a deletion names the key only".into());
        }
        Ok(Element {
            key,
            bound: None,
            data,
            comment,
        })
    }
}

/// NFTA_SET_ELEM_LIST_ELEMENTS: each element nested under its position.
pub(super) fn encode_elements(a: &mut Attributes, elements: &[Element]) {
    a.nested(3, |list| {
        for (index, element) in elements.iter().enumerate() {
            list.nested(index as u16 + 1, |e| {
                if element.bound == Some(Bound::End) {
                    e.u32(3, ELEM_INTERVAL_END);
                }
                Data::<&[u8], &str>::Value(&element.key).encode(1, e);
                if element.bound == Some(Bound::OpenStart) {
                    // nft marks an interval without an end in the element's user data.
                    e.raw(
                        6,
                        UserData::new()
                            .host_u32(UDATA_ELEM_FLAGS, ELEM_F_INTERVAL_OPEN)
                            .bytes(),
                    );
                }
                if let Some(data) = &element.data {
                    data.encode(2, e);
                }
                if let Some(comment) = &element.comment {
                    e.raw(6, comment_udata(comment).bytes());
                }
            });
        }
    });
}

/// `FIRST-LAST`, two numbers, the first not above the last.
pub(super) fn draw_interval(word: &str) -> Option<(u32, u32)> {
    let (first, last) = word.split_once('-')?;
    let first: u32 = first.parse().ok()?;
    let last: u32 = last.parse().ok()?;
    (first <= last).then_some((first, last))
}

/// nft's typeof record of a `numgen random mod DRAWS` key.
pub(super) fn numgen_typeof(draws: u32) -> Vec<u8> {
    // Expression numgen (23); its type random (1), modulus and offset 0.
    let mut record = vec![0, 4, 23, 0, 0, 0, 1, 18, 0, 4, 1, 0, 0, 0, 1, 4];
    record.extend(draws.to_ne_bytes());
    record.extend([2, 4, 0, 0, 0, 0]);
    record
}

/// nft's number for the header a `PROTO dport` is read from (its `enum proto_desc_id`).
pub(super) fn transport_header(word: &str) -> Option<u8> {
    match word {
        "udp" => Some(6),
        "tcp" => Some(8),
        "sctp" => Some(10),
        "th" => Some(11),
        _ => None,
    }
}

/// nft's typeof record of `ip daddr . PROTO dport` (or `ip6 daddr`) data.
pub(super) fn destination_typeof(ipv6: bool, transport: u8) -> Vec<u8> {
    // A concatenation (13) of two payloads (7): the network header's destination (ip 12/12,
    // ip6 13/9), then the transport header's destination port (2).
    let (header, field) = if ipv6 { (13, 9) } else { (12, 12) };
    let mut record = vec![
        0, 4, 13, 0, 0, 0, 1, 44, 0, 20, 0, 4, 7, 0, 0, 0, 1, 12, 0, 4,
    ];
    record.extend([header, 0, 0, 0, 1, 4, field, 0, 0, 0]);
    record.extend([
        1, 20, 0, 4, 7, 0, 0, 0, 1, 12, 0, 4, transport, 0, 0, 0, 1, 4, 2, 0, 0, 0,
    ]);
    record
}
