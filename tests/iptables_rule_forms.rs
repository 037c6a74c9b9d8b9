//! The kernel's form of each of our rules is what `sys::xtables::rules` says it is, on both back
//! ends: every golden restore and every upstream case is restored into a namespace with
//! iptables-nft-restore and each chain read back over netlink, rule by rule, expression by
//! expression; and restored with iptables-legacy-restore and read back with
//! iptables-legacy-save, line by line. This is what lets a restart keep chains that are already
//! right.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use kube_proxy_rs::model::IpFamily;
use kube_proxy_rs::sys::nf_tables::expr::{Data, Expr, Verdict};
use kube_proxy_rs::sys::nfacct::{NetlinkNfacct, Nfacct};
use kube_proxy_rs::sys::xtables::rules::{
    chain_expressions, chain_fingerprints, expected_fingerprint, nft_expressions, save_text,
};
use kube_proxy_rs::sys::xtables::tokenize;
use support::netns::{Netns, require_netns};

/// The rules a restore file appends to each (table, chain), in order.
fn appended_rules(text: &str) -> BTreeMap<(String, String), Vec<String>> {
    let mut table = String::new();
    let mut rules: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = name.to_string();
        } else if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split_whitespace().next().unwrap().to_string();
            rules.entry((table.clone(), chain)).or_default();
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let (chain, spec) = rest.split_once(' ').unwrap_or((rest, ""));
            rules
                .entry((table.clone(), chain.to_string()))
                .or_default()
                .push(spec.to_string());
        }
    }
    rules
}

/// The family of a restore file's addresses.
fn family_of(text: &str) -> IpFamily {
    let v6 = text
        .lines()
        .filter_map(|line| tokenize(line).ok())
        .any(|words| {
            words.windows(2).any(|pair| {
                ["-s", "-d"].contains(&pair[0].as_str())
                    && pair[1]
                        .split('/')
                        .next()
                        .unwrap()
                        .parse::<std::net::Ipv6Addr>()
                        .is_ok()
            })
        });
    if v6 { IpFamily::V6 } else { IpFamily::V4 }
}

/// A fresh namespace with `text` restored by `tool --noflush` (the counters upstream's rules
/// name created first: a rule can name them only once they exist).
fn restored(role: &str, tool: &str, file: &Path, text: &str) -> Netns {
    let ns = Netns::new(role);
    ns.run(|| {
        let mut nfacct = NetlinkNfacct::open().unwrap();
        for name in [
            "ct_state_invalid_dropped_pkts",
            "localhost_nps_accepted_pkts",
        ] {
            nfacct.ensure(name).unwrap();
        }
    });
    let restored = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, tool, "--noflush"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(text.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(
        restored.status.success(),
        "{}: restore failed",
        file.display()
    );
    ns
}

/// Restores `text` into a fresh namespace and compares every appended chain, rule by rule;
/// returns the differences and how many rules were compared.
fn check(file: &Path, text: &str) -> (Vec<String>, usize) {
    let family = family_of(text);
    let tool = match family {
        IpFamily::V4 => "iptables-nft-restore",
        IpFamily::V6 => "ip6tables-nft-restore",
    };
    let ns = restored("xlate", tool, file, text);
    let mut problems = Vec::new();
    let mut compared = 0;
    for ((table, chain), rules) in appended_rules(text) {
        let (table2, chain2) = (table.clone(), chain.clone());
        let kernel = ns.run(move || chain_expressions(family, &table2, &chain2).unwrap());
        if kernel.len() != rules.len() {
            problems.push(format!(
                "{}: {table} {chain}: {} rules in the kernel, {} written",
                file.display(),
                kernel.len(),
                rules.len()
            ));
            continue;
        }
        compared += rules.len();
        for (spec, held) in rules.iter().zip(&kernel) {
            let ours = nft_expressions(family == IpFamily::V6, spec)
                .unwrap_or_else(|err| panic!("{}: {spec}: {err}", file.display()));
            if &ours != held {
                problems.push(format!(
                    "{}: {table} {chain}: {spec}\n  kernel: {held:?}\n  ours:   {ours:?}",
                    file.display()
                ));
            }
        }
        // The bulk reader agrees with the one-chain reader.
        let (table2, chain2) = (table.clone(), chain.clone());
        let fingerprints =
            ns.run(move || chain_fingerprints(family, &table2, &[chain2.as_str()]).unwrap());
        let expected: Vec<u64> = rules
            .iter()
            .map(|spec| expected_fingerprint(family, spec).unwrap())
            .collect();
        if fingerprints.first() != Some(&expected) {
            problems.push(format!(
                "{}: {table} {chain}: fingerprints differ",
                file.display()
            ));
        }
    }
    (problems, compared)
}

fn corpus() -> Vec<(std::path::PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(root.join("golden/iptables")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "restore") {
            files.push(path);
        }
    }
    for entry in std::fs::read_dir(root.join("upstream/iptables")).unwrap() {
        let path = entry.unwrap().path().join("expected.restore");
        if path.exists() {
            files.push(path);
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text)
        })
        .collect()
}

#[test]
fn every_rule_we_write_is_held_as_translated() {
    require_netns();
    let corpus = corpus();
    assert!(corpus.len() > 50, "the corpus is missing");
    let mut problems = Vec::new();
    let mut compared = 0;
    for (path, text) in &corpus {
        let (found, rules) = check(path, text);
        problems.extend(found);
        compared += rules;
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(compared > 1000, "only {compared} rules compared");
}

/// Restores `text` with iptables-legacy-restore into a fresh namespace and compares every
/// appended rule with what iptables-legacy-save prints for it; returns the differences and how
/// many rules were compared.
fn check_legacy(file: &Path, text: &str) -> (Vec<String>, usize) {
    let family = family_of(text);
    let prefix = match family {
        IpFamily::V4 => "iptables",
        IpFamily::V6 => "ip6tables",
    };
    let ns = restored(
        "xlate-legacy",
        &format!("{prefix}-legacy-restore"),
        file,
        text,
    );
    let mut problems = Vec::new();
    let mut compared = 0;
    for ((table, chain), rules) in appended_rules(text) {
        let saved = ns.output(&[&format!("{prefix}-legacy-save"), "-t", &table]);
        let held = kube_proxy_rs::sys::xtables::rules_of(&saved, &chain);
        if held.len() != rules.len() {
            problems.push(format!(
                "{}: {table} {chain}: {} rules saved, {} written",
                file.display(),
                held.len(),
                rules.len()
            ));
            continue;
        }
        compared += rules.len();
        for (spec, held) in rules.iter().zip(&held) {
            let ours = save_text(family == IpFamily::V6, spec)
                .unwrap_or_else(|err| panic!("{}: {spec}: {err}", file.display()));
            if &ours != held {
                problems.push(format!(
                    "{}: {table} {chain}: {spec}\n  saved: {held}\n  ours:  {ours}",
                    file.display()
                ));
            }
        }
    }
    (problems, compared)
}

#[test]
fn every_rule_we_write_is_saved_as_we_say_on_legacy() {
    require_netns();
    let mut problems = Vec::new();
    let mut compared = 0;
    for (path, text) in &corpus() {
        let (found, rules) = check_legacy(path, text);
        problems.extend(found);
        compared += rules;
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(compared > 1000, "only {compared} rules compared");
}

#[test]
fn a_changed_rule_changes_the_fingerprint() {
    // The comparison would keep a chain it should rewrite if different rules looked alike.
    let rules = [
        "-m comment --comment ns/svc:p -s 10.1.0.1 -j KUBE-MARK-MASQ",
        "-m comment --comment ns/svc:p -s 10.1.0.2 -j KUBE-MARK-MASQ",
        "-m comment --comment ns/svc:q -s 10.1.0.1 -j KUBE-MARK-MASQ",
        "-m comment --comment ns/svc:p -m tcp -p tcp -j DNAT --to-destination 10.1.0.1:80",
        "-m comment --comment ns/svc:p -m tcp -p tcp -j DNAT --to-destination 10.1.0.1:81",
        "-m comment --comment ns/svc:p -m udp -p udp -j DNAT --to-destination 10.1.0.1:80",
        "-m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-A",
        "-m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-A",
        "-m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-B",
        "-m tcp -p tcp -d 10.96.0.1 --dport 80 -j KUBE-SVC-A",
        "-m tcp -p tcp -d 10.96.0.1 --dport 81 -j KUBE-SVC-A",
        "-m tcp -p tcp ! -d 10.96.0.1 --dport 80 -j KUBE-SVC-A",
        "-m tcp -p tcp -d 10.96.0.0/24 --dport 80 -j KUBE-SVC-A",
    ];
    let mut seen = BTreeMap::new();
    for rule in rules {
        let fingerprint = expected_fingerprint(IpFamily::V4, rule).unwrap();
        assert_eq!(seen.insert(fingerprint, rule), None, "{rule}");
    }
}

#[test]
fn rules_it_cannot_vouch_for_are_refused() {
    for rule in [
        "-m physdev --physdev-in eth0 -j DROP",
        "-j LOG --log-prefix x",
        "-m comment --comment a -m tcp -p udp --dport 80 -j ACCEPT",
        "-m statistic --mode nth --every 2 -j KUBE-SEP-A",
        "-m tcp -p tcp --dport 80 --syn -j ACCEPT",
        "-j REJECT --reject-with tcp-reset",
        "-s 10.0.0.1 -s 10.0.0.2 -j ACCEPT",
        "-m comment --comment \"unterminated -j ACCEPT",
    ] {
        assert!(
            nft_expressions(false, rule).is_err(),
            "{rule}: {:?}",
            nft_expressions(false, rule)
        );
    }
    assert!(tokenize("-j ACCEPT").is_ok());
    assert!(matches!(
        nft_expressions(false, "-j ACCEPT").unwrap().as_slice(),
        [Expr::Immediate {
            dreg: 0,
            data: Data::Verdict(Verdict {
                code: 1,
                chain: None
            })
        }]
    ));
}

/// IPVS mode's rules match ipsets, which iptables-nft keeps as the set's kernel index: read back
/// over netlink (the set named through ipset) and on legacy from the saved text, each rule reads
/// as our parser reads what we wrote.
#[test]
fn set_matches_read_back_with_their_set_names() {
    use kube_proxy_rs::sys::xtables::rules::read_rule;
    use kube_proxy_rs::sys::xtables::{Backend, Iptables, SystemIptables};
    require_netns();
    let rules = [
        "-m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ",
        "-m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ",
        "-m set ! --match-set KUBE-LOOP-BACK dst,dst,src -j RETURN",
        "-p tcp -m comment --comment \"Kubernetes nodeport TCP port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ",
        "-m comment --comment \"Kubernetes service external ip + port for masquerade and filter purpose\" -m set --match-set KUBE-EXTERNAL-IP dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT",
        "-m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
    ];
    for backend in [Backend::Nft, Backend::Legacy] {
        let ns = Netns::new("xlate-sets");
        for (set, kind) in [
            ("KUBE-CLUSTER-IP", "hash:ip,port"),
            ("KUBE-LOOP-BACK", "hash:ip,port,ip"),
            ("KUBE-EXTERNAL-IP", "hash:ip,port"),
        ] {
            ns.exec(&["ipset", "create", set, kind]);
        }
        ns.exec(&[
            "ipset",
            "create",
            "KUBE-NODE-PORT-TCP",
            "bitmap:port",
            "range",
            "0-65535",
        ]);
        let mut text = String::from("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n");
        for rule in rules {
            text.push_str(&format!("-A KUBE-SERVICES {rule}\n"));
        }
        text.push_str("COMMIT\n");
        let tool = format!("iptables-{}-restore", backend.as_str());
        let restore = ns.output_with_stderr(&[
            "sh",
            "-c",
            &format!(
                "printf '%s' '{}' | {tool} --noflush && echo restored",
                text.replace('\'', "'\\''")
            ),
        ]);
        assert!(restore.contains("restored"), "{restore}");
        let read = ns.run(move || {
            SystemIptables::new(backend)
                .rule_options(IpFamily::V4, "nat", &["KUBE-SERVICES"])
                .unwrap()
        });
        let expected: Vec<_> = rules.iter().map(|rule| read_rule(false, rule)).collect();
        assert_eq!(read.len(), 1);
        for ((got, want), rule) in read[0].iter().zip(&expected).zip(rules) {
            let mut got = got
                .as_ref()
                .unwrap_or_else(|err| panic!("{backend:?}: {rule}: {err}"))
                .clone();
            // The kernel's index is what iptables-nft reads; the name is what we wrote.
            for matched in &mut got.matches {
                if let kube_proxy_rs::sys::xtables::rules::MatchOptions::Set { index, .. } = matched
                {
                    *index = None;
                }
            }
            assert_eq!(&got, want.as_ref().unwrap(), "{backend:?}: {rule}");
        }
        assert_eq!(read[0].len(), rules.len(), "{backend:?}");
    }
}
