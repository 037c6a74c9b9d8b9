//! `nft -f` files the benchmarks load by hand: a bare load of a text, and our table's text
//! reshaped as upstream 1.37 writes its services.
#![allow(dead_code)]

use std::time::Duration;

use super::netns::Netns;

/// `nft -f -` of `text` in `ns`, timed.
pub fn bare_nft(ns: &Netns, text: &str) -> Duration {
    ns.feed("nft", &["-f", "-"], text)
}

/// Our first sync's text reshaped as upstream 1.37 writes a service (its layout without the
/// construct ours replaces): each policy chain DNATs through an anonymous map of its own,
/// `dnat ip addr . port to numgen random mod N map { 0 : 10.1.0.1 . 8080 , ... }` (one
/// endpoint: `dnat ip addr . port to 10.1.0.1 . 8080`). The endpoints are read off our slots'
/// shares; the shared endpoint maps go.
pub fn upstream_shaped(ours: &str) -> String {
    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    // (map, first draw of a share) -> the endpoint's address and port.
    let mut shares: BTreeMap<(&str, u64), (&str, &str)> = BTreeMap::new();
    for line in ours.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        if let [
            "add",
            "element",
            _,
            _,
            map,
            "{",
            interval,
            ":",
            ip,
            ".",
            port,
            "}",
        ] = words[..]
            && map.starts_with("endpoints-")
            && let Some(first) = interval.split('-').next().and_then(|n| n.parse().ok())
        {
            shares.insert((map, first), (ip, port));
        }
    }
    let mut out = String::new();
    for line in ours.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        if line.contains(" endpoints-") && !line.starts_with("add rule ") {
            continue;
        }
        let Some(at) = words.iter().position(|w| *w == "offset") else {
            let _ = writeln!(out, "{line}");
            continue;
        };
        let (family, chain) = (words[2], words[4]);
        let first: u64 = words[at + 1].parse().unwrap();
        let map = words[at + 3].trim_start_matches('@');
        let endpoints: Vec<String> = shares
            .range((map, first)..(map, first + 16_384))
            .map(|(_, (ip, port))| format!("{ip} . {port}"))
            .collect();
        let target = match &endpoints[..] {
            [one] => one.clone(),
            all => {
                let elements: Vec<String> = all
                    .iter()
                    .enumerate()
                    .map(|(index, endpoint)| format!("{index} : {endpoint}"))
                    .collect();
                format!(
                    "numgen random mod {} map {{ {} }}",
                    all.len(),
                    elements.join(" , ")
                )
            }
        };
        let after = |word: &str| {
            let at = words.iter().position(|w| *w == word).expect("a DNAT rule");
            words[at + 1]
        };
        let (protocol, ip) = (after("l4proto"), after("dnat"));
        let _ = writeln!(
            out,
            "add rule {family} kube-proxy {chain} meta l4proto {protocol} dnat {ip} addr . port to {target}"
        );
    }
    out
}
