//! Upstream kube-proxy's own expected iptables dumps (pkg/proxy/iptables/proxier_test.go), as
//! data in tests/upstream/iptables/: each case's objects go through the daemon's flag parser,
//! its conversion of API objects and the iptables proxier's first sync (against the in-memory
//! kernel), and the restore input is compared as upstream's assertIPTablesRulesEqual compares:
//! sorted by upstream's sortIPTablesRules, then equal line for line. See tests/upstream/README.md.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use kube_proxy_rs::config::{self, Flags, NodeNameSources};
use kube_proxy_rs::k8s::files::read_objects;
use kube_proxy_rs::model::{ChangeSummary, IpFamily, NamespacedName, ProxyState};
use kube_proxy_rs::proxier::Proxier;
use kube_proxy_rs::proxier::iptables::{IptablesProxier, IptablesSettings, NfacctCounters};
use kube_proxy_rs::sys::host::net::{FakeSysctl, FixedAddresses};
use kube_proxy_rs::sys::xtables::Iptables;
use kube_proxy_rs::sys::xtables::fake::FakeIptables;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    args: Vec<String>,
    family: String,
    local_addresses: Vec<IpAddr>,
    nfacct: bool,
    random_fully: bool,
    #[serde(default)]
    only_chains: Vec<String>,
    /// Set where we deliberately refuse the input upstream's fake accepts: the problem we report.
    #[serde(default)]
    refused: Option<String>,
    /// Several syncs of one proxier (objects.yaml and expected.restore are then per step).
    #[serde(default)]
    steps: Vec<Step>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    /// Every object after this step.
    objects: String,
    /// Upstream's restore payload for this step.
    expected: String,
    /// Compare our payload with upstream's (a first sync); otherwise compare what the kernel
    /// holds after the step, each side's payloads applied in order.
    #[serde(default)]
    payload: bool,
    /// A rule another program adds before the step: "<table> <chain> <spec>".
    #[serde(default)]
    inject: Option<String>,
}

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/iptables");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join("case.yaml").exists())
        .collect();
    dirs.sort();
    dirs
}

/// Our proxier as upstream's NewFakeProxier and the case's flags make it, with the node's name.
fn proxier(dir: &Path, case: &Case) -> (IptablesProxier<FakeIptables>, String) {
    let flags = Flags::parse_from(case.args.iter().cloned())
        .unwrap_or_else(|err| panic!("{}: flags: {err}", dir.display()));
    let settings = config::resolve(
        &flags,
        &NodeNameSources {
            env_node_name: None,
            hostname: Some("unused".into()),
        },
    )
    .unwrap_or_else(|err| panic!("{}: config: {err}", dir.display()));
    let mut iptables_settings = IptablesSettings::from_config(&settings.config);
    if case.nfacct {
        iptables_settings.nfacct = NfacctCounters::ALL;
    }
    let mut proxier = IptablesProxier::new(
        FakeIptables::default(),
        iptables_settings,
        Box::new(FixedAddresses(case.local_addresses.clone())),
        Box::new(FakeSysctl::default()),
    );
    proxier.record_transactions = true;
    (proxier, settings.node_name)
}

/// The state the objects of `file` make, and the problems they had.
fn state(dir: &Path, file: &str, case: &Case, node_name: &str) -> (ProxyState, Vec<String>) {
    let mut objects = read_objects(&[dir.join(file)], node_name, true).unwrap();
    // Upstream's fake proxier is single-family; its node IP is eth0's (lo's where eth0 has
    // none in the family).
    let eth0: Vec<IpAddr> = case
        .local_addresses
        .iter()
        .copied()
        .filter(|ip| !ip.is_loopback())
        .collect();
    objects.state.node.addresses = match eth0.is_empty() {
        true => case.local_addresses.clone(),
        false => eth0,
    };
    (objects.state, objects.problems)
}

fn family(case: &Case) -> IpFamily {
    match case.family.as_str() {
        "IPv4" => IpFamily::V4,
        "IPv6" => IpFamily::V6,
        other => panic!("family {other}"),
    }
}

/// The restore input of the proxier's last sync in the case's family.
fn last_payload(proxier: &IptablesProxier<FakeIptables>, case: &Case) -> String {
    proxier
        .last_transactions
        .iter()
        .filter(|(f, _)| *f == family(case))
        .map(|(_, text)| text.as_str())
        .collect()
}

/// Our restore input for a one-sync case, and the problems the objects had.
fn render(dir: &Path, case: &Case) -> (String, Vec<String>) {
    let (mut proxier, node_name) = proxier(dir, case);
    let (state, problems) = state(dir, "objects.yaml", case, &node_name);
    proxier
        .sync(&state, &Default::default())
        .unwrap_or_else(|err| panic!("{}: sync: {err}", dir.display()));
    (last_payload(&proxier, case), problems)
}

/// The services whose ports or endpoints differ between two states (what the tracker reports).
fn changes(before: &ProxyState, after: &ProxyState) -> ChangeSummary {
    let keys: BTreeSet<&NamespacedName> = before
        .services
        .keys()
        .chain(after.services.keys())
        .chain(before.endpoints.keys())
        .chain(after.endpoints.keys())
        .collect();
    ChangeSummary {
        changed_services: keys
            .into_iter()
            .filter(|k| {
                before.services.get(*k) != after.services.get(*k)
                    || before.endpoints.get(*k) != after.endpoints.get(*k)
            })
            .cloned()
            .collect(),
        ..ChangeSummary::default()
    }
}

/// Our chains in filter and nat (not the canary), in a form where only meaningful order
/// counts: the shared chains' rules as sets (each service's are independent), but nat
/// KUBE-SERVICES' last rule kept last; a service's own chains in order.
fn kernel_state(iptables: &FakeIptables, family: IpFamily) -> Vec<String> {
    let mut chains = Vec::new();
    for table in ["filter", "nat"] {
        for (chain, rules) in iptables.table(family, table).chains {
            if !chain.starts_with("KUBE-") || chain == "KUBE-PROXY-CANARY" {
                continue;
            }
            let mut rules = rules.clone();
            let shared = ![
                "KUBE-SVC-",
                "KUBE-SVL-",
                "KUBE-EXT-",
                "KUBE-FW-",
                "KUBE-SEP-",
            ]
            .iter()
            .any(|p| chain.starts_with(p));
            if table == "nat" && chain == "KUBE-SERVICES" {
                let last = rules.pop();
                rules.sort();
                rules.extend(last);
            } else if shared {
                rules.sort();
            }
            let mut block = vec![format!(":{table} {chain}")];
            block.extend(rules.into_iter().map(|r| format!("-A {chain} {r}")));
            chains.push(block);
        }
    }
    chains.sort();
    chains.concat()
}

/// A multi-step case: each step's state synced by one proxier of ours; upstream's payloads
/// applied in order to a second fake kernel.
fn check_steps(dir: &Path, case: &Case) -> Result<(), String> {
    let family = family(case);
    let (mut ours, node_name) = proxier(dir, case);
    let mut upstream = FakeIptables::default();
    let mut before = ProxyState::default();
    for (index, step) in case.steps.iter().enumerate() {
        let at = format!("step {}", index + 1);
        let (after, problems) = state(dir, &step.objects, case, &node_name);
        if !problems.is_empty() {
            return Err(format!("{at}: objects refused: {problems:?}"));
        }
        if let Some(inject) = &step.inject {
            let mut words = inject.splitn(3, ' ');
            let (table, chain, spec) = (
                words.next().unwrap_or(""),
                words.next().unwrap_or(""),
                words.next().unwrap_or(""),
            );
            ours.iptables().add_foreign_rule(family, table, chain, spec);
            upstream.add_foreign_rule(family, table, chain, spec);
        }
        let changed = changes(&before, &after);
        if let Err(err) = ours.sync(&after, &changed) {
            return Err(format!("{at}: our sync failed: {err}"));
        }
        before = after;
        let expected = std::fs::read_to_string(dir.join(&step.expected)).unwrap();
        upstream
            .restore(family, &expected)
            .map_err(|err| format!("{at}: upstream's payload does not apply: {err}"))?;
        if step.payload {
            let mut tables = parse(&upstream_payload(&last_payload(&ours, case), case));
            tables.retain(|t| !t.chains.is_empty() || !t.rules.is_empty());
            let sorted = sort_rules(&mut tables);
            if sorted != expected.trim_start() {
                return Err(format!(
                    "{at}: differs from upstream's payload:\n{}",
                    diff(&expected, &sorted)
                ));
            }
        }
        let want = kernel_state(&upstream, family).join("\n") + "\n";
        let have = upstream_payload(
            &(kernel_state(ours.iptables(), family).join("\n") + "\n"),
            case,
        );
        if want != have {
            return Err(format!("{at}: the kernels differ:\n{}", diff(&want, &have)));
        }
    }
    Ok(())
}

/// A restore input parsed as upstream's iptablestest.ParseIPTablesDump sees it.
#[derive(Debug, Default)]
struct Table {
    name: String,
    chains: Vec<String>,
    /// (chain, the whole `-A` line).
    rules: Vec<(String, String)>,
    deleted: Vec<String>,
}

fn parse(text: &str) -> Vec<Table> {
    let mut tables: Vec<Table> = Vec::new();
    let mut current: Option<usize> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            // Several transactions of one table (we split large restores) are one table here.
            let index = match tables.iter().position(|t| t.name == name) {
                Some(index) => index,
                None => {
                    tables.push(Table {
                        name: name.to_string(),
                        ..Table::default()
                    });
                    tables.len() - 1
                }
            };
            current = Some(index);
            continue;
        }
        let Some(table) = current.map(|i| &mut tables[i]) else {
            continue;
        };
        if line == "COMMIT" {
            current = None;
        } else if let Some(decl) = line.strip_prefix(':') {
            let chain = decl.split_whitespace().next().unwrap_or("").to_string();
            if !table.chains.contains(&chain) {
                table.chains.push(chain);
            }
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let chain = rest.split_whitespace().next().unwrap_or("").to_string();
            table.rules.push((chain, line.to_string()));
        } else if let Some(chain) = line.strip_prefix("-X ") {
            table.deleted.push(chain.trim().to_string());
        } else if !line.trim().is_empty() && !line.starts_with('#') {
            panic!("unexpected restore line {line:?}");
        }
    }
    tables
}

/// A rule's comment, unquoted.
fn comment(rule: &str) -> Option<String> {
    let (_, after) = rule.split_once("--comment ")?;
    if let Some(quoted) = after.strip_prefix('"') {
        quoted.split_once('"').map(|(c, _)| c.to_string())
    } else {
        after.split_whitespace().next().map(str::to_string)
    }
}

/// upstream's orderByCommentServiceName: the comment up to its first space or colon.
fn service_of(rule: &str) -> Option<String> {
    comment(rule).map(|c| c.split([' ', ':']).next().unwrap_or_default().to_string())
}

fn by_service(a: &str, b: &str) -> bool {
    match (service_of(a), service_of(b)) {
        (Some(a), Some(b)) => a < b,
        _ => false,
    }
}

/// Go's sort.SliceStable as an insertion sort with the same `less` (the same result for the
/// short chains of these cases, and for any input where `less` is a strict weak order).
fn stable_sort(rules: &mut [String], less: impl Fn(&str, &str) -> bool) {
    for i in 1..rules.len() {
        let mut j = i;
        while j > 0 && less(&rules[j], &rules[j - 1]) {
            rules.swap(j, j - 1);
            j -= 1;
        }
    }
}

fn chain_order(a: &str, b: &str) -> std::cmp::Ordering {
    let rank = |c: &str| match c {
        "KUBE-NODEPORTS" => 0,
        "KUBE-SERVICES" => 1,
        c if c.starts_with("KUBE-") => 2,
        _ => 3,
    };
    rank(a).cmp(&rank(b)).then_with(|| a.cmp(b))
}

/// upstream's sortIPTablesRules followed by dump.String().
fn sort_rules(tables: &mut [Table]) -> String {
    tables.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::new();
    for table in tables.iter_mut() {
        table.chains.sort_by(|a, b| chain_order(a, b));
        out.push_str(&format!("*{}\n", table.name));
        for chain in &table.chains {
            out.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for chain in &table.chains {
            let mut rules: Vec<String> = table
                .rules
                .iter()
                .filter(|(c, _)| c == chain)
                .map(|(_, r)| r.clone())
                .collect();
            match (table.name.as_str(), chain.as_str()) {
                (_, "KUBE-NODEPORTS") | ("filter", "KUBE-SERVICES") => {
                    stable_sort(&mut rules, by_service)
                }
                ("nat", "KUBE-SERVICES") => {
                    let last =
                        |r: &str| comment(r).is_some_and(|c| c.contains("must be the last rule"));
                    stable_sort(&mut rules, |a, b| {
                        if last(a) {
                            false
                        } else if last(b) {
                            true
                        } else {
                            by_service(a, b)
                        }
                    })
                }
                _ => {}
            }
            for rule in rules {
                out.push_str(&rule);
                out.push('\n');
            }
        }
        for chain in &table.deleted {
            out.push_str(&format!("-X {chain}\n"));
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// What upstream's restore payload never holds: the jumps from built-in chains (upstream adds
/// them with separate `iptables` calls; we restore them in the same transaction) and our canary.
fn upstream_payload(ours: &str, case: &Case) -> String {
    ours.lines()
        .filter(|line| !line.starts_with("-I "))
        .filter(|line| !line.starts_with(":KUBE-PROXY-CANARY "))
        .map(|line| {
            // Upstream's fake iptables claims no --random-fully unless the test says so; every
            // iptables since 1.6.2 has it, and upstream uses it wherever it is.
            if case.random_fully {
                line.to_string()
            } else {
                line.replace(" -j MASQUERADE --random-fully", " -j MASQUERADE")
            }
        })
        .map(|line| line + "\n")
        .collect()
}

/// Only the chains upstream's assertIPTablesChainEqual looks at; a chain absent from both is
/// equal (upstream's "absent or empty").
fn only_chains(tables: &mut Vec<Table>, wanted: &[String]) {
    let wanted: BTreeSet<(&str, &str)> = wanted
        .iter()
        .map(|w| w.split_once(' ').expect("\"<table> <CHAIN>\""))
        .collect();
    for table in tables.iter_mut() {
        let keep = |chain: &str| wanted.contains(&(table.name.as_str(), chain));
        table.chains.retain(|c| keep(c));
        table.rules.retain(|(c, _)| keep(c));
        table.deleted.clear();
    }
    tables.retain(|t| wanted.iter().any(|(name, _)| *name == t.name));
}

/// upstream's checkIPTablesRuleJumps: every chain used is declared, every chain jumped to has
/// rules, every declared chain is used (but the fixed ones).
fn check_jumps(text: &str) -> Result<(), String> {
    const TERMINAL: [&str; 8] = [
        "ACCEPT",
        "REJECT",
        "DROP",
        "MARK",
        "RETURN",
        "DNAT",
        "SNAT",
        "MASQUERADE",
    ];
    const UNJUMPED: [&str; 8] = [
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-FORWARD",
        "KUBE-MARK-MASQ",
        "KUBE-PROXY-FIREWALL",
        "KUBE-FIREWALL",
    ];
    for table in parse(text) {
        let declared: BTreeSet<&str> = table.chains.iter().map(String::as_str).collect();
        let mut jumped = BTreeSet::new();
        for (chain, rule) in &table.rules {
            if !declared.contains(chain.as_str()) {
                return Err(format!("{}: rule in undeclared chain {chain}", table.name));
            }
            let words: Vec<&str> = rule.split_whitespace().collect();
            if let Some(i) = words.iter().position(|w| *w == "-j") {
                let target = words.get(i + 1).copied().unwrap_or("");
                if TERMINAL.contains(&target) {
                    continue;
                }
                if !declared.contains(target) && !table.deleted.iter().any(|d| d == target) {
                    return Err(format!("{}: jump to undeclared {target}", table.name));
                }
                jumped.insert(target.to_string());
            }
        }
        for chain in &jumped {
            let has_rules = table.rules.iter().any(|(c, _)| c == chain);
            if !has_rules && chain != "KUBE-NODEPORTS" {
                return Err(format!("{}: {chain} is jumped to but empty", table.name));
            }
        }
        for chain in &declared {
            if !jumped.contains(*chain) && !UNJUMPED.contains(chain) {
                return Err(format!("{}: {chain} is never jumped to", table.name));
            }
        }
    }
    Ok(())
}

fn check(dir: &Path) -> Result<(), String> {
    let case: Case =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("case.yaml")).unwrap())
            .map_err(|err| format!("case.yaml: {err}"))?;
    if !case.steps.is_empty() {
        return check_steps(dir, &case);
    }
    let expected = std::fs::read_to_string(dir.join("expected.restore")).unwrap();
    let expected = expected.trim_start();
    let (ours, problems) = render(dir, &case);
    if let Some(refused) = &case.refused {
        return match problems.iter().any(|p| p.contains(refused.as_str())) {
            true => Ok(()),
            false => Err(format!(
                "expected the input refused with {refused:?}, got {problems:?}"
            )),
        };
    }
    if !problems.is_empty() {
        return Err(format!("objects refused: {problems:?}"));
    }
    let mut tables = parse(&upstream_payload(&ours, &case));
    // The mangle table holds only our canary.
    tables.retain(|t| !t.chains.is_empty() || !t.rules.is_empty());
    if case.only_chains.is_empty() {
        check_jumps(expected).map_err(|err| format!("expected text: {err}"))?;
    } else {
        only_chains(&mut tables, &case.only_chains);
    }
    let sorted = sort_rules(&mut tables);
    if case.only_chains.is_empty() {
        check_jumps(&sorted).map_err(|err| format!("our text: {err}"))?;
    }
    if sorted != expected {
        return Err(format!(
            "differs from upstream's expectation:\n{}",
            diff(expected, &sorted)
        ));
    }
    Ok(())
}

/// Lines only in one of the texts, marked `-` (upstream) and `+` (ours).
fn diff(expected: &str, ours: &str) -> String {
    let want: Vec<&str> = expected.lines().collect();
    let have: Vec<&str> = ours.lines().collect();
    let mut out = String::new();
    for line in &want {
        if !have.contains(line) {
            out.push_str(&format!("- {line}\n"));
        }
    }
    for line in &have {
        if !want.contains(line) {
            out.push_str(&format!("+ {line}\n"));
        }
    }
    if out.is_empty() {
        out.push_str("(the same lines in another order)\n");
        out.push_str(&format!("--- upstream\n{expected}--- ours\n{ours}"));
    }
    out
}

#[test]
fn upstream_expectations_hold() {
    let only = std::env::var("UPSTREAM_CASE").ok();
    let mut failures = Vec::new();
    let mut checked = 0;
    for dir in cases() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        checked += 1;
        if let Err(err) = check(&dir) {
            failures.push(format!("== {name}: {err}"));
        }
    }
    assert!(checked > 0, "no case ran");
    assert!(
        failures.is_empty(),
        "{} of {checked} cases fail:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_sorter_is_upstreams() {
    // From upstream's TestSortIPTablesRules: nat KUBE-SERVICES keeps the nodeports rule last
    // and orders the rest by service, chains come KUBE-NODEPORTS, KUBE-SERVICES, other KUBE-*,
    // then the rest.
    let input = "*nat\n:KUBE-SERVICES - [0:0]\n:WHY-IS-THIS-CHAIN-HERE - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n\
-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -j KUBE-NODEPORTS\n\
-A KUBE-SERVICES -m comment --comment \"ns2/svc2:p80 cluster IP\" -j KUBE-MARK-MASQ\n\
-A KUBE-SERVICES -m comment --comment \"ns1/svc1:p80 cluster IP\" -j KUBE-MARK-MASQ\n\
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -j KUBE-MARK-MASQ\n\
-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -j KUBE-MARK-MASQ\n\
COMMIT\n*filter\n:KUBE-FORWARD - [0:0]\nCOMMIT\n";
    let want = "*filter\n:KUBE-FORWARD - [0:0]\nCOMMIT\n*nat\n:KUBE-NODEPORTS - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:WHY-IS-THIS-CHAIN-HERE - [0:0]\n\
-A KUBE-NODEPORTS -m comment --comment ns1/svc1:p80 -j KUBE-MARK-MASQ\n\
-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -j KUBE-MARK-MASQ\n\
-A KUBE-SERVICES -m comment --comment \"ns1/svc1:p80 cluster IP\" -j KUBE-MARK-MASQ\n\
-A KUBE-SERVICES -m comment --comment \"ns2/svc2:p80 cluster IP\" -j KUBE-MARK-MASQ\n\
-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -j KUBE-NODEPORTS\n\
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
COMMIT\n";
    assert_eq!(sort_rules(&mut parse(input)), want);
    // The consistency check catches what upstream's does.
    assert!(check_jumps("*nat\n:KUBE-SVC-X - [0:0]\nCOMMIT\n").is_err());
    assert!(
        check_jumps("*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j KUBE-SVC-X\nCOMMIT\n")
            .is_err()
    );
    assert!(check_jumps("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n-A KUBE-SERVICES -j KUBE-SVC-X\nCOMMIT\n").is_err());
}
