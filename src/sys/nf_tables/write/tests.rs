//! Our messages against the ones `nft` sends for the same text, byte for byte. The captures in
//! tests/testdata/nft/*.batch were taken with `nft --debug=mnl -c` in a namespace
//! (tests/nft_netlink.rs, `UPDATE_GOLDEN=1` takes them again): one line per message, its type
//! and its payload (nfgenmsg and attributes) in hex, from BATCH_BEGIN on.

use std::fmt::Write as _;

use super::*;

const CASES: [(&str, &str, &str); 9] = [
    (
        "corpus-ip",
        include_str!("../../../../tests/testdata/nft/corpus-ip.nft"),
        include_str!("../../../../tests/testdata/nft/corpus-ip.batch"),
    ),
    (
        "corpus-ip6",
        include_str!("../../../../tests/testdata/nft/corpus-ip6.nft"),
        include_str!("../../../../tests/testdata/nft/corpus-ip6.batch"),
    ),
    (
        "changes-ip",
        include_str!("../../../../tests/testdata/nft/changes-ip.nft"),
        include_str!("../../../../tests/testdata/nft/changes-ip.batch"),
    ),
    (
        "changes-ip6",
        include_str!("../../../../tests/testdata/nft/changes-ip6.nft"),
        include_str!("../../../../tests/testdata/nft/changes-ip6.batch"),
    ),
    (
        "draws-ip",
        include_str!("../../../../tests/testdata/nft/draws-ip.nft"),
        include_str!("../../../../tests/testdata/nft/draws-ip.batch"),
    ),
    (
        "draws-ip6",
        include_str!("../../../../tests/testdata/nft/draws-ip6.nft"),
        include_str!("../../../../tests/testdata/nft/draws-ip6.batch"),
    ),
    (
        "flowtable-ip",
        include_str!("../../../../tests/testdata/nft/flowtable-ip.nft"),
        include_str!("../../../../tests/testdata/nft/flowtable-ip.batch"),
    ),
    (
        "flowtable-ip6",
        include_str!("../../../../tests/testdata/nft/flowtable-ip6.nft"),
        include_str!("../../../../tests/testdata/nft/flowtable-ip6.batch"),
    ),
    (
        "remove-tables",
        include_str!("../../../../tests/testdata/nft/remove-tables.nft"),
        include_str!("../../../../tests/testdata/nft/remove-tables.batch"),
    ),
];

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// nft's messages: (type, payload hex), BATCH_BEGIN and BATCH_END left out.
fn captured(batch: &str) -> Vec<(u16, String)> {
    batch
        .lines()
        .filter_map(|line| {
            let (kind, payload) = line.split_once(' ')?;
            let kind: u16 = kind.parse().ok()?;
            // nft asks for the generation after a batch the kernel refused (GETGEN, 16): not
            // part of the batch.
            (kind >> 8 == wire::NFNL_SUBSYS_NFTABLES && kind & 0xff != 16)
                .then(|| (kind, payload.to_string()))
        })
        .collect()
}

/// An element message's payload without its set id attribute (4).
fn without_set_id(payload: &str) -> String {
    let bytes: Vec<u8> = (0..payload.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&payload[i..i + 2], 16).unwrap())
        .collect();
    let mut out = bytes[..4].to_vec();
    let mut offset = 4;
    while offset + 4 <= bytes.len() {
        let length = u16::from_ne_bytes([bytes[offset], bytes[offset + 1]]) as usize;
        let kind = u16::from_ne_bytes([bytes[offset + 2], bytes[offset + 3]]) & 0x3fff;
        let padded = (length + 3) & !3;
        if kind != 4 {
            out.extend(&bytes[offset..(offset + padded).min(bytes.len())]);
        }
        offset += padded;
    }
    hex(&out)
}

/// nft numbers the sets of a batch after those it read from the kernel; ours start at one.
/// Gives nft's numbers of the sets this batch declares ours, in order, wherever they appear
/// (set declarations, element lists, lookups, dynamic set updates).
fn renumber_sets(ours: &[(u16, String)], theirs: &mut [(u16, String)]) {
    let ids = |messages: &[(u16, String)]| -> Vec<String> {
        messages
            .iter()
            .filter(|m| m.0 & 0xff == wire::NFT_MSG_NEWSET)
            .filter_map(|m| {
                let at = m.1.find("08000a00")?;
                Some(m.1[at + 8..at + 16].to_string())
            })
            .collect()
    };
    let pairs: Vec<(String, String)> = ids(theirs).into_iter().zip(ids(ours)).collect();
    for (_, payload) in theirs.iter_mut() {
        for (from, to) in &pairs {
            for attribute in ["08000a00", "08000400", "08000200"] {
                *payload =
                    payload.replace(&format!("{attribute}{from}"), &format!("{attribute}{to}"));
            }
        }
    }
}

/// Sorts each run of consecutive element additions.
fn sort_element_runs(messages: &mut [(u16, String)]) {
    let is_element = |m: &(u16, String)| m.0 & 0xff == wire::NFT_MSG_NEWSETELEM;
    let mut start = 0;
    while start < messages.len() {
        let mut end = start;
        while end < messages.len() && is_element(&messages[end]) {
            end += 1;
        }
        messages[start..end].sort();
        start = end.max(start + 1);
    }
}

#[test]
fn every_message_equals_what_nft_sends() {
    for (name, text, batch) in CASES {
        let compiled =
            compile_with(text, AnonymousNames::AsNft).unwrap_or_else(|err| panic!("{name}: {err}"));
        let mut ours: Vec<(u16, String)> = compiled
            .messages
            .iter()
            .map(|m| {
                let mut payload = vec![m.family, 0, 0, 0];
                payload.extend(&m.attributes);
                (wire::NFNL_SUBSYS_NFTABLES << 8 | m.kind, hex(&payload))
            })
            .collect();
        let mut theirs = captured(batch);
        if name.starts_with("changes") {
            // nft numbers the sets it read from the kernel too, and names them by that number
            // in element messages; we name sets this batch did not declare by name only (which
            // is what the kernel looks them up by).
            for (kind, payload) in theirs.iter_mut().chain(ours.iter_mut()) {
                if *kind & 0xff == wire::NFT_MSG_NEWSETELEM
                    || *kind & 0xff == wire::NFT_MSG_DELSETELEM
                {
                    *payload = without_set_id(payload);
                }
            }
        }
        if name.starts_with("changes") {
            renumber_sets(&ours, &mut theirs);
        }
        // nft sends the elements of a map declared in the same batch twice in a row (the
        // second message changes nothing); we send them once.
        theirs.dedup_by(|a, b| a == b && a.0 & 0xff == wire::NFT_MSG_NEWSETELEM);
        // nft may reorder adjacent element additions; the kernel ends the same either way.
        sort_element_runs(&mut ours);
        sort_element_runs(&mut theirs);
        for (index, (a, b)) in ours.iter().zip(&theirs).enumerate() {
            let line = compiled.lines[index];
            let source = text.lines().nth(line - 1).unwrap_or_default();
            assert_eq!(a, b, "{name}: message {index} (line {line}: {source})");
        }
        assert_eq!(ours.len(), theirs.len(), "{name}: message count");
    }
}

#[test]
fn each_message_knows_its_line() {
    let compiled = compile(
        "# a comment\n\nadd table ip kube-proxy\nadd chain ip kube-proxy c\n\
         add rule ip kube-proxy c numgen random mod 1 vmap { 0 : goto c }\n",
    )
    .unwrap();
    // The rule brings its anonymous map and the map's elements.
    assert_eq!(compiled.lines, [3, 4, 5, 5, 5]);
}

/// A long run of interval lines in one map (a full sync at 10,000 services puts 1,500 in each)
/// is split into messages whose element list fits its 16-bit attribute length: one attribute
/// cut short loses elements without an error from the kernel.
#[test]
fn long_runs_of_intervals_split_into_messages_that_fit() {
    let mut text = String::from(
        "add table ip6 t
add map ip6 t m { typeof numgen random mod 16384 : ip6 daddr . tcp dport ; flags interval ; }\n",
    );
    for index in 0..2_000u32 {
        let first = index * 16_384;
        let _ = writeln!(
            text,
            "add element ip6 t m {{ {first}-{} : fd00:10:180::1 . 80 }}",
            first + 16_383
        );
    }
    let compiled = compile(&text).unwrap();
    let elements = &compiled.messages[2..];
    assert!(elements.len() >= 4_000 / 512, "{}", elements.len());
    assert!(
        elements
            .iter()
            .all(|m| m.attributes.len() < usize::from(u16::MAX))
    );
    // Every line is in one of them, each message carrying the first line it holds.
    assert_eq!(compiled.lines.len(), compiled.messages.len());
    assert_eq!(compiled.lines[2], 3);
}

/// So is the anonymous map of a service with thousands of endpoints.
#[test]
fn big_anonymous_maps_split_into_messages_that_fit() {
    let mut rule = String::from(
        "add table ip6 t\nadd chain ip6 t c\nadd rule ip6 t c meta l4proto tcp dnat ip6 addr . port to numgen random mod 3000 map { ",
    );
    for index in 0..3_000u32 {
        if index > 0 {
            rule.push_str(" , ");
        }
        let _ = write!(rule, "{index} : fd00:10:180::{:x} . 80", index + 1);
    }
    rule.push_str(" }\n");
    let compiled = compile(&rule).unwrap();
    let elements: Vec<&Message> = compiled
        .messages
        .iter()
        .filter(|m| m.kind == super::wire::NFT_MSG_NEWSETELEM)
        .collect();
    assert!(elements.len() >= 3_000 / 512, "{}", elements.len());
    assert!(
        compiled
            .messages
            .iter()
            .all(|m| m.attributes.len() < usize::from(u16::MAX))
    );
}

#[test]
fn text_this_program_never_writes_is_refused_with_its_line() {
    for (text, line) in [
        ("add table inet filter\n", 1),
        ("add table ip t\nadd rule ip t c limit rate 1/second\n", 2),
        ("add rule ip t c ip saddr 1.2.3.4 ip daddr ::1 drop\n", 1),
        ("add rule ip t c ip saddr { 1.2.3.4, 5.6.7.8 } drop\n", 1),
        ("add rule ip t c ip saddr != 0.0.0.0/0 drop\n", 1),
        (
            "add rule ip t c numgen random mod 2 vmap { 0 : goto a }\n",
            1,
        ),
        ("add rule ip t c comment \"unterminated\n", 1),
        ("add set ip t s { type ether_addr ; }\n", 1),
        ("add element ip t s { 1.2.3.4 comment \"x\" }\n", 0),
    ] {
        match compile(text) {
            Err(err) => assert_eq!(err.line, line, "{text}: {err}"),
            Ok(_) => assert_eq!(line, 0, "{text} compiled"),
        }
    }
}

#[test]
fn kernel_errors_name_the_message_and_carry_its_text() {
    // An NLMSG_ERROR for sequence 3 with errno ENOENT, capped, with an extended-ACK message.
    let mut data = Vec::new();
    let text = b"Chain not found\0";
    let attribute_length = 4 + text.len();
    let length = 16 + 4 + 16 + ((attribute_length + 3) & !3);
    data.extend((length as u32).to_ne_bytes());
    data.extend(2u16.to_ne_bytes());
    data.extend((NLM_F_CAPPED | NLM_F_ACK_TLVS).to_ne_bytes());
    data.extend(3u32.to_ne_bytes());
    data.extend(0u32.to_ne_bytes());
    data.extend((-2i32).to_ne_bytes());
    data.extend(36u32.to_ne_bytes());
    data.extend([0; 4]);
    data.extend(3u32.to_ne_bytes());
    data.extend(0u32.to_ne_bytes());
    data.extend((attribute_length as u16).to_ne_bytes());
    data.extend(NLMSGERR_ATTR_MSG.to_ne_bytes());
    data.extend(text);
    while data.len() % 4 != 0 {
        data.push(0);
    }
    assert_eq!(
        errors_in(&data),
        vec![(3, 2, Some("Chain not found".to_string()))]
    );
}

#[test]
fn quoted_flowtable_devices_compile_as_bare_ones() {
    let head = "add flowtable ip t f { hook ingress priority filter ; devices = {";
    let bare = compile(&format!("{head} lo, veth-a }} ; }}\n")).unwrap();
    let quoted = compile(&format!("{head} \"lo\", \"veth-a\" }} ; }}\n")).unwrap();
    assert_eq!(bare.messages.len(), 1);
    assert_eq!(bare.messages[0].attributes, quoted.messages[0].attributes);
}
