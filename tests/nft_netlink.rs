//! nftables transactions over netlink against the real kernel and the real `nft` (root; in
//! namespaces): the same text applied by our compiler and by `nft -f` leaves the same ruleset
//! (as `nft list` prints it, expressions included), a refused transaction names its line and
//! changes nothing, and (`UPDATE_GOLDEN=1`) nft's own messages are captured for the byte-level
//! unit test (src/sys/nft_netlink/tests.rs).

mod support;

use std::path::Path;

use kube_proxy_rs::model::IpFamily;
use kube_proxy_rs::sys::nf_tables::fake::FakeNftables;
use kube_proxy_rs::sys::nf_tables::{NftError, Nftables, SystemNftables};
use support::netns::{Netns, require_netns};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/testdata/nft");

fn read(name: &str) -> String {
    std::fs::read_to_string(Path::new(DATA).join(name)).expect("test data")
}

/// Applies `text` in `ns` with our netlink writer.
fn apply_netlink(ns: &Netns, text: &str) -> Result<(), NftError> {
    let text = text.to_string();
    ns.run(move || SystemNftables::netlink_only().apply(&text))
}

fn apply_nft(ns: &Netns, text: &str) {
    let path = std::env::temp_dir().join(format!("kprs-nft-{}-{}", std::process::id(), ns.name));
    std::fs::write(&path, text).unwrap();
    ns.exec(&["nft", "-f", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(path);
}

/// The ruleset as nft prints it, and the expressions behind it; the elements of each set in
/// a fixed order (the kernel's hash tables list them in an order their insertion decides).
fn listing(ns: &Netns) -> String {
    let plain = ns.output(&["nft", "list", "ruleset"]);
    let expressions = ns.output(&["nft", "--debug=netlink", "list", "ruleset"]);
    let mut lines: Vec<&str> = Vec::new();
    let mut elements: Vec<&str> = Vec::new();
    // nft names anonymous sets __map0, __map1, ...; ours are named after their rule.
    let anonymous = |line: &str| -> String {
        line.split(' ')
            .map(|word| {
                for prefix in ["@__map", "__map", "@__set", "__set"] {
                    if word.starts_with(prefix) {
                        return prefix.to_string();
                    }
                }
                word.to_string()
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let all: Vec<String> = plain
        .lines()
        .chain(expressions.lines())
        .map(anonymous)
        .collect();
    for line in all.iter().map(String::as_str) {
        // nft's additions to an interval map also end the gap below its first interval, at
        // 0; ours leave the gap unended (nothing matches below an interval's start either way).
        if line.starts_with("\telement 00000000  : 1 [end]") {
            continue;
        }
        if line.starts_with("\telement ") {
            elements.push(line);
            continue;
        }
        elements.sort();
        lines.append(&mut elements);
        lines.push(line);
    }
    elements.sort();
    lines.append(&mut elements);
    lines.join("\n")
}

#[test]
fn netlink_writes_what_nft_writes() {
    require_netns();
    for family in ["ip", "ip6"] {
        let ours = Netns::new("nl-ours");
        let theirs = Netns::new("nl-nft");
        for step in [
            format!("corpus-{family}.nft"),
            format!("changes-{family}.nft"),
            format!("draws-{family}.nft"),
            format!("draws-changes-{family}.nft"),
            "remove-tables.nft".to_string(),
        ] {
            let text = read(&step);
            apply_netlink(&ours, &text).unwrap_or_else(|err| panic!("{step}: {err}"));
            apply_nft(&theirs, &text);
            let (a, b) = (listing(&ours), listing(&theirs));
            let differing: Vec<String> = a
                .lines()
                .zip(b.lines())
                .filter(|(x, y)| x != y)
                .take(10)
                .map(|(x, y)| format!("ours: {x}\nnft:  {y}"))
                .collect();
            assert!(
                a == b,
                "{step}: our ruleset differs from nft's:\n{}",
                differing.join("\n")
            );
            if step.starts_with("corpus") {
                assert!(a.contains("numgen random mod 2 vmap"), "{a}");
            }
        }
    }
}

#[test]
fn a_refused_transaction_names_its_line_and_changes_nothing() {
    require_netns();
    let ns = Netns::new("nl-refused");
    apply_netlink(
        &ns,
        "add table ip kube-proxy\nadd chain ip kube-proxy a\nadd rule ip kube-proxy a drop\n",
    )
    .unwrap();
    let before = listing(&ns);
    let err = apply_netlink(
        &ns,
        "add chain ip kube-proxy b\nadd rule ip kube-proxy b jump a\nflush chain ip kube-proxy a\n\
         add rule ip kube-proxy a goto missing\nadd rule ip kube-proxy b drop\n",
    )
    .unwrap_err();
    match &err {
        NftError::Transaction { line, context, .. } => {
            assert_eq!(*line, Some(4), "{err}");
            assert!(context.contains("goto missing"), "{err}");
        }
        other => panic!("{other}"),
    }
    assert_eq!(listing(&ns), before, "a refused batch must change nothing");
}

/// A check (nftables mode's start-up probe) has the kernel handle a transaction and abort it:
/// an accepted one changes nothing, a refused one names its line.
#[test]
fn a_check_changes_nothing_and_names_a_refused_line() {
    require_netns();
    let ns = Netns::new("nl-check");
    apply_netlink(&ns, "add table ip kept\n").unwrap();
    let before = listing(&ns);
    let probe = "add table ip kube-proxy-probe\n\
                 add chain ip kube-proxy-probe c { type nat hook prerouting priority -100 ; }\n\
                 add rule ip kube-proxy-probe c meta l4proto tcp dnat to 10.0.0.1:80\n";
    let checked = ns.run(move || kube_proxy_rs::sys::nf_tables::check(probe));
    checked.unwrap();
    assert_eq!(listing(&ns), before, "a check must change nothing");
    let refused = "add table ip kube-proxy-probe\nadd chain ip kube-proxy-probe c\n\
                   add rule ip kube-proxy-probe c goto missing\n";
    let err = ns
        .run(move || kube_proxy_rs::sys::nf_tables::check(refused))
        .unwrap_err();
    match &err {
        NftError::Transaction { line, .. } => assert_eq!(*line, Some(3), "{err}"),
        other => panic!("{other}"),
    }
    assert_eq!(listing(&ns), before);
}

/// Parses `nft --debug=mnl` output into one line per message sent from BATCH_BEGIN on:
/// `TYPE HEX` (HEX: nfgenmsg and attributes).
fn mnl_messages(debug: &str) -> String {
    let mut out = String::new();
    let mut current: Option<(u16, Vec<u8>)> = None;
    let mut started = false;
    let finish = |current: Option<(u16, Vec<u8>)>, out: &mut String| {
        if let Some((kind, bytes)) = current {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            out.push_str(&format!("{kind} {hex}\n"));
        }
    };
    for raw in debug.lines() {
        let line = strip_colours(raw);
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if line.contains("type | flags") && cells.len() > 2 {
            let kind: u16 = cells[1].parse().unwrap_or(0);
            if kind == 16 {
                started = true;
            }
            let previous = current.take();
            if started {
                finish(previous, &mut out);
                current = Some((kind, Vec::new()));
            }
            continue;
        }
        let Some((_, bytes)) = current.as_mut() else {
            continue;
        };
        // A refusal's message names the file, whose path holds "data": not a message line.
        if (line.contains("extra header") || line.contains("data"))
            && !line.contains("len |flags| type")
            && cells.len() > 2
        {
            for byte in cells[1].split_whitespace() {
                bytes.push(u8::from_str_radix(byte, 16).expect("hex byte"));
            }
        } else if line.contains("len |flags| type") {
            // |LLLLL|NB|TTTTT|: an attribute header, N for nested, B for byte order.
            let length: u16 = cells[1].parse().expect("length");
            let flags = cells[2];
            let mut kind: u16 = cells[3].parse().expect("type");
            if flags.starts_with('N') {
                kind |= 0x8000;
            }
            if flags.chars().nth(1) == Some('B') {
                kind |= 0x4000;
            }
            bytes.extend(length.to_ne_bytes());
            bytes.extend(kind.to_ne_bytes());
        }
    }
    finish(current, &mut out);
    out
}

fn strip_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// nft's messages for `file` (of tests/testdata/nft/), checked but not applied in `ns`.
fn capture(ns: &Netns, file: &str) -> String {
    let path = format!("{DATA}/{file}");
    mnl_messages(&ns.output_with_stderr(&["nft", "--debug=mnl", "-c", "-f", &path]))
}

#[test]
fn captures_of_nfts_messages_are_current() {
    require_netns();
    if std::env::var_os("UPDATE_GOLDEN").is_none() {
        // The unit test holds our messages to the stored captures; here only check that the
        // capture parser still reads nft's debug output.
        let ns = Netns::new("nl-capture");
        assert_eq!(
            capture(&ns, "remove-tables.nft"),
            read("remove-tables.batch")
        );
        return;
    }
    let store = |name: &str, text: String| std::fs::write(format!("{DATA}/{name}"), text).unwrap();
    for family in ["ip", "ip6"] {
        let ns = Netns::new("nl-capture");
        store(
            &format!("corpus-{family}.batch"),
            capture(&ns, &format!("corpus-{family}.nft")),
        );
        ns.exec(&["nft", "-f", &format!("{DATA}/corpus-{family}.nft")]);
        store(
            &format!("changes-{family}.batch"),
            capture(&ns, &format!("changes-{family}.nft")),
        );
        let ns = Netns::new("nl-capture");
        store(
            &format!("draws-{family}.batch"),
            capture(&ns, &format!("draws-{family}.nft")),
        );
        // nft prints its messages before the kernel answers: a kernel without flowtables
        // refuses this batch, and its capture is still nft's.
        let ns = Netns::new("nl-capture");
        store(
            &format!("flowtable-{family}.batch"),
            capture(&ns, &format!("flowtable-{family}.nft")),
        );
    }
    let ns = Netns::new("nl-capture");
    store("remove-tables.batch", capture(&ns, "remove-tables.nft"));
}

/// The elements of our sets and maps read back from the kernel are the text they were written
/// with (keys, comments, verdicts, concatenations, both families): what a restart compares.
#[test]
fn elements_read_back_as_they_were_written() {
    require_netns();
    for (family, keyword) in [(IpFamily::V4, "ip"), (IpFamily::V6, "ip6")] {
        let ns = Netns::new("nl-elements");
        let mut fake = FakeNftables::default();
        let mut sets = Vec::new();
        for step in [
            format!("corpus-{keyword}.nft"),
            format!("changes-{keyword}.nft"),
            format!("draws-{keyword}.nft"),
            format!("draws-changes-{keyword}.nft"),
        ] {
            let text = read(&step);
            apply_netlink(&ns, &text).unwrap_or_else(|err| panic!("{step}: {err}"));
            fake.apply(&text).unwrap();
            for line in text.lines() {
                let words: Vec<&str> = line.splitn(6, ' ').collect();
                if let ["add", "set" | "map", _, "kube-proxy", name, spec] = words.as_slice()
                    && !spec.contains("dynamic")
                {
                    sets.push((name.to_string(), spec.to_string()));
                }
            }
        }
        let wanted = fake.elements(family, "kube-proxy", &sets).unwrap();
        let sets_for_thread = sets.clone();
        let read = ns.run(move || {
            SystemNftables::netlink_only().elements(family, "kube-proxy", &sets_for_thread)
        });
        let read = read.unwrap_or_else(|err| panic!("{keyword}: {err}"));
        assert_eq!(read, wanted, "{keyword}");
        assert!(
            read.values().map(|e| e.len()).sum::<usize>() > 10,
            "{keyword}: {read:?}"
        );
    }
}

/// One writer keeps its socket between transactions: each transaction lands in the namespace
/// of the thread that writes it, and a refusal after accepted batches names its own line.
#[test]
fn a_kept_socket_follows_the_writers_namespace_and_its_own_batches() {
    require_netns();
    let (first, second) = (Netns::new("nl-kept-a"), Netns::new("nl-kept-b"));
    let mut writer = SystemNftables::netlink_only();
    writer = first.run(move || {
        writer
            .apply("add table ip kube-proxy\nadd chain ip kube-proxy a\n")
            .unwrap();
        writer.apply("add rule ip kube-proxy a drop\n").unwrap();
        writer
    });
    writer = second.run(move || {
        writer
            .apply("add table ip kube-proxy\nadd chain ip kube-proxy b\n")
            .unwrap();
        writer
    });
    assert!(listing(&first).contains("chain a"), "{}", listing(&first));
    assert!(!listing(&first).contains("chain b"), "{}", listing(&first));
    assert!(listing(&second).contains("chain b"), "{}", listing(&second));
    assert!(
        !listing(&second).contains("chain a"),
        "{}",
        listing(&second)
    );
    let err = first.run(move || {
        writer
            .apply("add chain ip kube-proxy c\nadd rule ip kube-proxy c goto missing\n")
            .unwrap_err()
    });
    match &err {
        NftError::Transaction { line, .. } => assert_eq!(*line, Some(2), "{err}"),
        other => panic!("{other}"),
    }
    assert!(!listing(&first).contains("chain c"), "{}", listing(&first));
}

/// Element lists longer than one netlink attribute holds (a full sync's run of intervals in one
/// endpoint map; the anonymous map of a service with thousands of endpoints) reach the kernel
/// whole, in several messages.
#[test]
fn long_element_lists_reach_the_kernel_whole() {
    require_netns();
    let ns = Netns::new("nl-long");
    let mut text = String::from(
        "add table ip6 t\nadd map ip6 t m { typeof numgen random mod 16384 : ip6 daddr . tcp dport ; flags interval ; }\nadd chain ip6 t c\n",
    );
    for index in 0..2_000u32 {
        let first = index * 16_384;
        text.push_str(&format!(
            "add element ip6 t m {{ {first}-{} : fd00:10:180::1 . 80 }}\n",
            first + 16_383
        ));
    }
    let targets: Vec<String> = (0..3_000u32)
        .map(|index| format!("{index} : fd00:10:180::{:x} . 80", index + 1))
        .collect();
    text.push_str(&format!(
        "add rule ip6 t c meta l4proto tcp dnat ip6 addr . port to numgen random mod 3000 map {{ {} }}\n",
        targets.join(" , ")
    ));
    apply_netlink(&ns, &text).unwrap();
    let map = ns.output(&["nft", "list", "map", "ip6", "t", "m"]);
    assert_eq!(map.matches(" : fd00:10:180::1 . 80").count(), 2_000);
    let chain = ns.output(&["nft", "list", "chain", "ip6", "t", "c"]);
    assert_eq!(chain.matches(" . 80").count(), 3_000);
}

/// Every rule of the corpus and the draws' table, read back from the kernel chain by chain,
/// decodes into the expressions we sent for it, as `decode_rule` reads our own messages (and
/// the unit test `every_expression_of_ours_reads_back_as_written` shows that reading our
/// messages gives back the expressions they were made from). The kernel's additions (a
/// bitwise's operation, the flags and range maxima it keeps) are read past; counters are left
/// out; no expression stays undecoded.
#[test]
fn rules_read_back_decode_into_what_we_sent() {
    use std::collections::BTreeMap;

    use kube_proxy_rs::sys::nf_tables::expr::{Expr, decode_rule};
    use kube_proxy_rs::sys::nf_tables::read::chain_rules;
    use kube_proxy_rs::sys::nf_tables::wire::{NFT_MSG_NEWRULE, NFTA_RULE_CHAIN};
    use kube_proxy_rs::sys::nf_tables::write::compile;

    require_netns();
    let normal = |mut rule: Vec<Expr>| {
        for expr in &mut rule {
            if let Expr::Bitwise { boolean_op, .. } = expr {
                *boolean_op = true;
            }
        }
        rule
    };
    for (family, ip) in [(IpFamily::V4, "ip"), (IpFamily::V6, "ip6")] {
        for step in [format!("corpus-{ip}.nft"), format!("draws-{ip}.nft")] {
            let ns = Netns::new("nl-read");
            let mut sent: BTreeMap<String, Vec<Vec<Expr>>> = BTreeMap::new();
            let text = read(&step);
            apply_netlink(&ns, &text).unwrap_or_else(|err| panic!("{step}: {err}"));
            for message in compile(&text).expect("compiles").messages {
                if message.kind != NFT_MSG_NEWRULE {
                    continue;
                }
                let chain = kube_proxy_rs::sys::nf_tables::read::attributes(&message.attributes)
                    .find(|(kind, _)| *kind == NFTA_RULE_CHAIN)
                    .map(|(_, name)| {
                        String::from_utf8_lossy(name.split(|b| *b == 0).next().unwrap())
                            .into_owned()
                    })
                    .expect("a rule's chain");
                sent.entry(chain)
                    .or_default()
                    .push(normal(decode_rule(&message.attributes)));
            }
            let chains: Vec<&str> = sent.keys().map(String::as_str).collect();
            let chains_owned: Vec<String> = chains.iter().map(|c| c.to_string()).collect();
            let read = ns.run(move || {
                let names: Vec<&str> = chains_owned.iter().map(String::as_str).collect();
                chain_rules(family, "kube-proxy", &names).expect("read rules")
            });
            let mut rules = 0;
            for (chain, read) in chains.iter().zip(read) {
                let read: Vec<Vec<Expr>> = read.into_iter().map(normal).collect();
                assert_eq!(read, sent[*chain], "{ip} chain {chain}");
                assert!(
                    read.iter()
                        .flatten()
                        .all(|e| !matches!(e, Expr::Other { .. })),
                    "{ip} chain {chain}: an expression read back undecoded: {read:?}"
                );
                rules += read.len();
            }
            assert!(rules > 0, "{step}: no rule read back");
        }
    }
}
