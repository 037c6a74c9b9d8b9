//! Upstream's own expectations of whole tables (pkg/proxy/nftables proxier_test.go:
//! TestSyncProxyRulesRepeated, a proxier synced again and again, and TestBadIPs), as data in
//! tests/upstream/nftables/: each step's
//! objects go through the daemon's flag parser and its conversion of API objects into one
//! proxier of ours (against the stateful fake), and after each sync the whole table is compared
//! with upstream's dump as upstream compares (sorted), outside the constructs our layout
//! replaces (docs/nftables.md: a service without session affinity DNATs through a slot of a
//! shared endpoint map) and without the digest
//! comments our service chains carry and the chain of the table's digests. Upstream deletes a stale chain only once it has aged;
//! ours a second after flushing it: a step upstream ages is synced here with no delay, the
//! others with one long enough never to pass.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;

use super::tests::as_objects;
use super::*;
use crate::config::{self, Flags, NodeNameSources};
use crate::k8s::files::read_objects;
use crate::proxier::Proxier;
use crate::proxier::nftables::digests::DIGEST_CHAIN;
use crate::proxier::nftables::render::DIGEST_PREFIX;
use crate::proxier::nftables::render::tests::{assert_same_table, dump, outside_our_changes};
use crate::sys::host::net::FixedAddresses;
use crate::sys::nf_tables::fake::FakeNftables;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    args: Vec<String>,
    /// The ServiceCIDRs upstream's fake proxier is given (not a kube-proxy flag).
    service_cidrs: Vec<IpNet>,
    family: String,
    local_addresses: Vec<IpAddr>,
    steps: Vec<Step>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    /// Every object after this step.
    objects: String,
    /// Upstream's dump after this step's sync, when upstream checks one.
    #[serde(default)]
    expected: Option<String>,
    /// Upstream aged its stale chains before this sync.
    #[serde(default)]
    age_stale_chains: bool,
    /// How many nftables operations upstream's sync made (ours write less: not compared).
    #[serde(default)]
    #[allow(dead_code)]
    upstream_operations: Option<usize>,
}

fn case_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/upstream/nftables")
        .join(name)
}

/// Our table's text without the digest comments on our service chains and without the chain
/// of the table's digests.
fn without_digests(text: &str) -> String {
    text.lines()
        .filter(|line| !line.split(' ').any(|word| word == DIGEST_CHAIN))
        .map(
            |line| match line.find(&format!(" comment \"{DIGEST_PREFIX}")) {
                Some(start) => {
                    let rest = &line[start + 1..];
                    let end = rest[" comment \"".len()..]
                        .find('"')
                        .map(|i| i + " comment \"".len() + 1)
                        .unwrap_or(rest.len());
                    format!("{}{}", &line[..start], &rest[end..])
                }
                None => line.to_string(),
            },
        )
        .map(|line| format!("{line}\n"))
        .collect()
}

#[test]
fn upstreams_repeated_syncs() {
    let compared = run_case("TestSyncProxyRulesRepeated");
    assert_eq!(compared, 12, "upstream checks twelve of its thirteen syncs");
}

#[test]
fn upstreams_bad_ips() {
    assert_eq!(run_case("TestBadIPs"), 1);
}

/// Runs the case in `name`'s directory; returns how many dumps were compared.
fn run_case(name: &str) -> usize {
    let dir = case_dir(name);
    let case: Case =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.join("case.yaml")).unwrap()).unwrap();
    assert_eq!(case.family, "IPv4");
    let flags = Flags::parse_from(case.args.iter().cloned()).unwrap();
    let settings = config::resolve(
        &flags,
        &NodeNameSources {
            env_node_name: None,
            hostname: Some("unused".into()),
        },
    )
    .unwrap();
    let mut p = NftablesProxier::new(
        FakeNftables::default(),
        NftablesSettings::from_config(&settings.config),
        Box::new(FixedAddresses(case.local_addresses.clone())),
    );
    let never = Duration::from_secs(3600);
    let mut previous = ProxyState::default();
    let mut compared = 0;
    for (index, step) in case.steps.iter().enumerate() {
        let mut objects =
            read_objects(&[dir.join(&step.objects)], &settings.node_name, true).unwrap();
        assert!(
            objects.problems.is_empty(),
            "{}: {:?}",
            step.objects,
            objects.problems
        );
        let state = &mut objects.state;
        // Upstream's fake is single-family; its node IP is eth0's.
        state.node.addresses = case
            .local_addresses
            .iter()
            .copied()
            .filter(|ip| !ip.is_loopback())
            .collect();
        state.service_cidrs = case.service_cidrs.clone();
        let changes = ChangeSummary {
            changed_services: state
                .services
                .keys()
                .chain(previous.services.keys())
                .chain(state.endpoints.keys())
                .chain(previous.endpoints.keys())
                .filter(|key| {
                    state.services.get(*key) != previous.services.get(*key)
                        || state.endpoints.get(*key) != previous.endpoints.get(*key)
                })
                .cloned()
                .collect(),
            ..ChangeSummary::default()
        };
        p.stale_chain_delay = if step.age_stale_chains {
            Duration::ZERO
        } else {
            never
        };
        p.sync(state, &changes)
            .unwrap_or_else(|err| panic!("step {}: {err}", index + 1));
        if let Some(expected) = &step.expected {
            let want = std::fs::read_to_string(dir.join(expected)).unwrap();
            let ctx = p.context(IpFamily::V4, &state.node, &state.service_cidrs);
            let table = p.nft.table(IpFamily::V4, TABLE).expect("our table");
            let ours = without_digests(&dump(&as_objects(table), &ctx));
            println!("step {} ({})", index + 1, step.objects);
            assert_same_table(&outside_our_changes(&ours), &outside_our_changes(&want));
            compared += 1;
        }
        previous = objects.state;
    }
    compared
}

#[test]
fn digest_comments_are_taken_out_and_nothing_else() {
    let line = format!(
        "add rule ip kube-proxy service-X ip daddr 1.2.3.4 dnat to 10.0.0.1 comment \"{DIGEST_PREFIX}ABC\""
    );
    assert_eq!(
        without_digests(&line),
        "add rule ip kube-proxy service-X ip daddr 1.2.3.4 dnat to 10.0.0.1\n"
    );
    let other = "add rule ip kube-proxy services ip daddr @x reject comment \"kept\"";
    assert_eq!(without_digests(other), format!("{other}\n"));
}
