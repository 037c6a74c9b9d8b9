//! Golden restore texts for scenarios modelled on upstream's proxier tests. Each file under
//! tests/golden/iptables/ was reviewed against upstream's layout; `UPDATE_GOLDEN=1` rewrites them.

use std::path::PathBuf;

use super::*;
use crate::proxier::iptables::render::{KUBE_MARK_MASQ, NodePortAddresses};
use crate::sys::xtables::Iptables;
use crate::sys::xtables::fake::FakeIptables;
use crate::sys::xtables::jump_target;

fn golden(name: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/iptables")
        .join(format!("{name}.restore"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("missing golden file {}", path.display()));
    assert_text_eq(text, &want);
    assert_eq!(text, want, "{name}: same lines but a different order");
}

/// Applies the text to the stateful fake (which refuses jumps to missing chains) and checks that
/// every jump target exists and every service chain is referenced.
fn check_consistent(text: &str, family: IpFamily) {
    let mut ipt = FakeIptables::default();
    ipt.restore(family, text)
        .unwrap_or_else(|err| panic!("{err}\n{text}"));
    let nat = ipt.table(family, "nat");
    for (chain, rules) in &nat.chains {
        for rule in rules {
            if let Some(target) = jump_target(rule).filter(|t| t.starts_with("KUBE-")) {
                assert!(
                    nat.chain(target).is_some(),
                    "{chain} jumps to missing {target}"
                );
            }
        }
        if super::super::names::is_service_chain(chain) {
            let referenced = nat
                .chains
                .iter()
                .flat_map(|(_, r)| r)
                .any(|r| jump_target(r) == Some(chain.as_str()));
            assert!(referenced, "{chain} is never jumped to");
        }
    }
    assert!(nat.chain(KUBE_MARK_MASQ).is_some());
}

fn check(name: &str, services: &[Svc], ctx: &RenderContext) {
    let text = full_text(services, ctx);
    check_consistent(&text, ctx.common.family);
    golden(name, &text);
}

#[test]
fn overall() {
    check("overall", &overall_services(), &context());
}

#[test]
fn cluster_ip_three_endpoints() {
    let s = svc("ns1", "svc1", "172.30.0.41", |_| {}).with_endpoints(vec![
        ep("10.180.0.1", 80, ""),
        ep("10.180.0.2", 80, ""),
        ep("10.180.0.3", 80, ""),
    ]);
    check("cluster_ip", &[s], &context());
}

#[test]
fn multi_port_and_same_port_tcp_udp() {
    let s = svc_port(
        "kube-system",
        "kube-dns",
        "dns-tcp",
        Protocol::Tcp,
        53,
        "10.96.0.10",
        |_| {},
    )
    .with_endpoints(vec![ep("10.244.0.5", 53, ""), ep("10.244.1.6", 53, "")])
    .add_port(
        "dns",
        Protocol::Udp,
        53,
        vec![ep("10.244.0.5", 53, ""), ep("10.244.1.6", 53, "")],
    )
    .add_port(
        "metrics",
        Protocol::Tcp,
        9153,
        vec![ep("10.244.0.5", 9153, "")],
    )
    .add_port(
        "sig",
        Protocol::Sctp,
        9000,
        vec![ep("10.244.0.5", 9000, "")],
    );
    check("multi_port", &[s], &context());
}

#[test]
fn node_port_on_listed_addresses() {
    let s = svc("ns1", "svc1", "172.30.0.41", |s| s.node_port = Some(30080))
        .with_endpoints(vec![ep("10.180.0.1", 80, "")]);
    let mut ctx = context();
    ctx.node_port_addresses = NodePortAddresses::Only(vec![
        "192.168.0.2".parse().unwrap(),
        "127.0.0.1".parse().unwrap(),
    ]);
    check("node_port_addresses", &[s], &ctx);
    let s = svc("ns1", "svc1", "172.30.0.41", |s| s.node_port = Some(30080))
        .with_endpoints(vec![ep("10.180.0.1", 80, "")]);
    let mut ctx = context();
    ctx.localhost_node_ports = false;
    check("node_port_no_localhost", &[s], &ctx);
}

/// The userspace proxy serves 127.0.0.1: no rule sends it to KUBE-NODEPORTS, none drops it
/// (a Local NodePort without a local endpoint is refused by the proxy, which has no listener);
/// the localnet firewall rule stays, as route_localnet is left as it was found.
#[test]
fn localhost_left_to_the_proxy() {
    let s = svc("ns1", "svc1", "172.30.0.41", |s| {
        s.node_port = Some(30080);
        s.external_policy_local = true;
    })
    .with_endpoints(vec![ep("10.180.1.1", 80, "other-node")]);
    let mut ctx = context();
    ctx.localhost_node_ports = false;
    ctx.localhost_proxy = true;
    ctx.node_port_addresses = NodePortAddresses::Only(vec![
        "192.168.0.2".parse().unwrap(),
        "127.0.0.1".parse().unwrap(),
    ]);
    check("localhost_proxy", &[s], &ctx);
}

#[test]
fn load_balancer_source_ranges_including_the_node() {
    let s = svc("ns1", "svc1", "172.30.0.41", |s| {
        s.node_port = Some(30080);
        s.load_balancer_ips = vec!["5.6.7.8".parse().unwrap(), "5.6.7.9".parse().unwrap()];
        s.load_balancer_source_ranges = vec![
            "203.0.113.0/25".parse().unwrap(),
            "192.168.0.0/24".parse().unwrap(),
        ];
    })
    .with_endpoints(vec![ep("10.180.0.1", 80, "")]);
    check("lb_source_ranges", &[s], &context());
}

#[test]
fn external_policy_local_with_local_endpoints() {
    let s = svc("ns1", "svc1", "172.30.0.41", |s| {
        s.node_port = Some(30080);
        s.load_balancer_ips = vec!["5.6.7.8".parse().unwrap()];
        s.external_policy_local = true;
        s.health_check_node_port = Some(30000);
    })
    .with_endpoints(vec![
        ep("10.180.0.1", 80, NODE),
        ep("10.180.1.1", 80, "other-node"),
    ]);
    check("etp_local", &[s], &context());
}

#[test]
fn internal_policy_local_with_and_without_local_endpoints() {
    let with = svc("ns1", "with", "172.30.0.41", |s| {
        s.internal_policy_local = true
    })
    .with_endpoints(vec![
        ep("10.180.0.1", 80, NODE),
        ep("10.180.1.1", 80, "other-node"),
    ]);
    let without = svc("ns1", "without", "172.30.0.42", |s| {
        s.internal_policy_local = true
    })
    .with_endpoints(vec![ep("10.180.1.2", 80, "other-node")]);
    check("itp_local", &[with, without], &context());
}

#[test]
fn no_endpoints_rejects_every_address() {
    let s = svc("ns1", "svc1", "172.30.0.41", |s| {
        s.node_port = Some(30080);
        s.external_ips = vec!["192.168.99.11".parse().unwrap()];
        s.load_balancer_ips = vec!["1.2.3.4".parse().unwrap()];
    });
    check("no_endpoints", &[s], &context());
}

#[test]
fn terminating_endpoints_serve_when_none_are_ready() {
    let mut terminating = ep("10.180.0.2", 80, NODE);
    terminating.ready = false;
    terminating.terminating = true;
    let mut gone = ep("10.180.0.3", 80, NODE);
    gone.ready = false;
    gone.serving = false;
    gone.terminating = true;
    let s = svc("ns1", "svc1", "172.30.0.41", |s| {
        s.node_port = Some(30080);
        s.external_policy_local = true;
    })
    .with_endpoints(vec![ep("10.180.1.1", 80, "other-node"), terminating, gone]);
    check("terminating", &[s], &context());
}

#[test]
fn masquerade_all_and_no_local_detector() {
    let s = svc("ns1", "svc1", "172.30.0.41", |s| s.node_port = Some(30080))
        .with_endpoints(vec![ep("10.180.0.1", 80, "")]);
    let mut ctx = context();
    ctx.common.masquerade_all = true;
    ctx.common.masquerade_mark = 0x1;
    check("masquerade_all", &[s], &ctx);
    let s = svc("ns1", "svc1", "172.30.0.41", |s| {
        s.node_port = Some(30080);
        s.external_policy_local = true;
    })
    .with_endpoints(vec![ep("10.180.0.1", 80, NODE)]);
    let mut ctx = context();
    ctx.common.local_detector = LocalDetector::None;
    ctx.tcp_be_liberal = true;
    check("no_local_detector", &[s], &ctx);
}

#[test]
fn ipv6() {
    let s = svc("ns1", "svc1", "172.30.0.41,fd00:172:30::41", |s| {
        s.node_port = Some(30080);
        s.external_ips = vec![
            "192.168.99.11".parse().unwrap(),
            "fd00:99::11".parse().unwrap(),
        ];
        s.session_affinity_seconds = Some(300);
    })
    .with_endpoints(vec![
        ep("10.180.0.1", 80, ""),
        ep("fd00:10:180::1", 80, ""),
        ep("fd00:10:180::2", 80, ""),
    ]);
    let mut ctx = context();
    ctx.common.family = IpFamily::V6;
    ctx.common.node_ip = Some("fd00::2".parse().unwrap());
    ctx.common.local_detector = LocalDetector::Cidrs(vec!["fd00:10::/64".parse().unwrap()]);
    check("ipv6", &[s], &ctx);
}

#[test]
fn comments_cannot_carry_rule_text() {
    use super::super::render::comment;
    assert_eq!(
        comment("ns/svc:p80 -> [fd00::1]:80"),
        "-m comment --comment \"ns/svc:p80 -> [fd00::1]:80\""
    );
    let hostile = comment("x\" -j ACCEPT\n-A KUBE-SERVICES -j DROP $(id) `id` \\");
    assert!(!hostile.contains('\n') && !hostile.contains('\\') && !hostile.contains('`'));
    assert_eq!(hostile.matches('"').count(), 2, "{hostile}");
}
