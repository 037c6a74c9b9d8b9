//! Tables of packets through the rules of upstream's overall scenario (and a few more).

use std::net::IpAddr;

use super::*;
pub(super) use crate::proxier::flows::{Case, POD, accept, explained};
use crate::proxier::flows::{Scenario, flow_of};
use crate::proxier::iptables::explain::Session;
use crate::proxier::local::NodePortSelection;
use crate::proxier::xtables::tracer::{Packet, Verdict, trace};
use crate::sys::xtables::fake::FakeIptables;
use crate::sys::xtables::{Backend, Iptables};

/// Traces each case, and checks that `explain` (reading the same fake) says what the trace
/// finds: the endpoints, masquerading, the drop or the rejection.
pub(super) fn run(services: &[Svc], ctx: &RenderContext, cases: &[Case]) {
    run_on(services, ctx, &[NODE_IP, "127.0.0.1"], cases);
}

/// A scenario of upstream's flow tables, through this mode's rules.
pub(super) fn run_scenario(scenario: &Scenario) {
    let wrong = scenario_disagreements(scenario, |_| {});
    assert!(wrong.is_empty(), "{}:\n{}", scenario.name, wrong.join("\n"));
}

/// Where the tracer or `explain` says otherwise than the scenario expects, on the rules the
/// scenario renders as `mutate` leaves them.
pub(super) fn scenario_disagreements(
    scenario: &Scenario,
    mutate: impl Fn(&mut FakeIptables),
) -> Vec<String> {
    let mut ctx = context();
    ctx.common = scenario.common.clone();
    ctx.localhost_node_ports = scenario.localhost_node_ports;
    if let Some(configured) = &scenario.node_port_addresses {
        let selection = NodePortSelection::new(configured);
        ctx.node_port_addresses = selection.addresses(ctx.common.node_ip, || scenario.addresses());
    }
    let mut ipt = FakeIptables::default();
    ipt.restore(ctx.common.family, &full_text(&scenario.services, &ctx))
        .unwrap();
    mutate(&mut ipt);
    disagreements_in(
        &ipt,
        ctx.common.family,
        &scenario.addresses(),
        &scenario.cases,
    )
}

/// Where the tracer or `explain`, each on the rules `ipt` holds, says otherwise than `cases`
/// expect.
fn disagreements_in(
    ipt: &FakeIptables,
    family: crate::model::IpFamily,
    local: &[IpAddr],
    cases: &[Case],
) -> Vec<String> {
    let mut explaining = Session::with(Box::new(ipt.clone()), Backend::Nft, local.to_vec());
    let mut wrong = Vec::new();
    for case in cases {
        let explanation = explaining.explain(&flow_of(case)).unwrap();
        let verdict = explained(&explanation);
        if verdict != case.want {
            wrong.push(format!(
                "explained {:?}: {verdict:?}, expected {:?}; {explanation:#?}",
                case.name, case.want
            ));
        }
        let verdict = trace(ipt, family, local, &Packet::of(case));
        if verdict != case.want {
            wrong.push(format!(
                "traced {:?}: {verdict:?}, expected {:?}",
                case.name, case.want
            ));
        }
    }
    wrong
}

/// As [`run`], on a node with these addresses.
pub(super) fn run_on(services: &[Svc], ctx: &RenderContext, addresses: &[&str], cases: &[Case]) {
    let mut ipt = FakeIptables::default();
    ipt.restore(ctx.common.family, &full_text(services, ctx))
        .unwrap();
    let local: Vec<IpAddr> = addresses.iter().map(|a| a.parse().unwrap()).collect();
    let wrong = disagreements_in(&ipt, ctx.common.family, &local, cases);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

const OUTSIDE: &str = "203.0.113.200";

#[test]
fn overall_packet_flows() {
    #[rustfmt::skip]
    let cases = [
        Case { name: "pod to cluster IP", src: POD, dst: "172.30.0.41", port: 80, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.1:80"], false) },
        Case { name: "outside to cluster IP is masqueraded", src: OUTSIDE, dst: "172.30.0.41", port: 80, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.1:80"], true) },
        Case { name: "node to cluster IP is masqueraded", src: NODE_IP, dst: "172.30.0.41", port: 80, protocol: Protocol::Tcp, from_node: true, want: accept(&["10.180.0.1:80"], true) },
        Case { name: "hairpin: endpoint to its own service", src: "10.180.0.1", dst: "172.30.0.41", port: 80, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.1:80"], true) },
        Case { name: "wrong port to cluster IP is untouched", src: POD, dst: "172.30.0.41", port: 81, protocol: Protocol::Tcp, from_node: false, want: accept(&[], false) },
        Case { name: "cluster IP without endpoints is rejected", src: POD, dst: "172.30.0.46", port: 80, protocol: Protocol::Tcp, from_node: false, want: Verdict::Reject },
        Case { name: "ETP Local, no local endpoints: external IP from outside dropped", src: OUTSIDE, dst: "192.168.99.22", port: 80, protocol: Protocol::Tcp, from_node: false, want: Verdict::Drop },
        Case { name: "ETP Local, no local endpoints: LB IP from outside dropped", src: OUTSIDE, dst: "1.2.3.4", port: 80, protocol: Protocol::Tcp, from_node: false, want: Verdict::Drop },
        Case { name: "ETP Local, no local endpoints: NodePort from outside dropped", src: OUTSIDE, dst: NODE_IP, port: 3001, protocol: Protocol::Tcp, from_node: false, want: Verdict::Drop },
        Case { name: "ETP Local: pod to external IP short-circuits to any endpoint", src: POD, dst: "192.168.99.22", port: 80, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.2:80"], false) },
        Case { name: "ETP Local: node to LB IP short-circuits, masqueraded", src: NODE_IP, dst: "1.2.3.4", port: 80, protocol: Protocol::Tcp, from_node: true, want: accept(&["10.180.0.2:80"], true) },
        Case { name: "ETP Local: cluster IP still works", src: POD, dst: "172.30.0.42", port: 80, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.2:80"], false) },
        Case { name: "NodePort from outside", src: OUTSIDE, dst: NODE_IP, port: 3003, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.3:80"], true) },
        Case { name: "NodePort on localhost", src: "127.0.0.1", dst: "127.0.0.1", port: 3003, protocol: Protocol::Tcp, from_node: true, want: accept(&["10.180.0.3:80"], true) },
        Case { name: "external IP spreads over both endpoints", src: OUTSIDE, dst: "192.168.99.33", port: 80, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.4:80", "10.180.0.5:80"], true) },
        Case { name: "LB source range allows", src: "203.0.113.7", dst: "5.6.7.8", port: 80, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.3:80"], true) },
        Case { name: "LB source range refuses the rest", src: OUTSIDE, dst: "5.6.7.8", port: 80, protocol: Protocol::Tcp, from_node: false, want: Verdict::Drop },
        Case { name: "NodePort is not subject to source ranges", src: OUTSIDE, dst: NODE_IP, port: 3002, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.3:80"], true) },
        Case { name: "unrelated traffic to the node", src: OUTSIDE, dst: NODE_IP, port: 22, protocol: Protocol::Tcp, from_node: false, want: accept(&[], false) },
    ];
    run(&overall_services(), &context(), &cases);
}

#[test]
fn local_policy_flows() {
    let etp = svc("ns1", "etp", "172.30.0.51", |s| {
        s.node_port = Some(30051);
        s.external_policy_local = true;
    })
    .with_endpoints(vec![
        ep("10.180.0.1", 80, NODE),
        ep("10.180.1.1", 80, "other"),
    ]);
    let itp = svc("ns1", "itp", "172.30.0.52", |s| {
        s.internal_policy_local = true
    })
    .with_endpoints(vec![
        ep("10.180.0.2", 80, NODE),
        ep("10.180.1.2", 80, "other"),
    ]);
    let itp_none = svc("ns1", "itp-none", "172.30.0.53", |s| {
        s.internal_policy_local = true
    })
    .with_endpoints(vec![ep("10.180.1.3", 80, "other")]);
    #[rustfmt::skip]
    let cases = [
        Case { name: "ETP Local from outside: local endpoint only, source kept", src: OUTSIDE, dst: NODE_IP, port: 30051, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.1:80"], false) },
        Case { name: "ETP Local cluster IP: every endpoint", src: POD, dst: "172.30.0.51", port: 80, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.1:80", "10.180.1.1:80"], false) },
        Case { name: "ITP Local: only the local endpoint", src: POD, dst: "172.30.0.52", port: 80, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.2:80"], false) },
        Case { name: "ITP Local without local endpoints: dropped", src: POD, dst: "172.30.0.53", port: 80, protocol: Protocol::Tcp, from_node: false, want: Verdict::Drop },
    ];
    run(&[etp, itp, itp_none], &context(), &cases);
}

#[test]
fn masquerade_all_flows() {
    let s =
        svc("ns1", "svc1", "172.30.0.41", |_| {}).with_endpoints(vec![ep("10.180.0.1", 80, "")]);
    let mut ctx = context();
    ctx.common.masquerade_all = true;
    let cases = [Case {
        name: "pod traffic masqueraded too",
        src: POD,
        dst: "172.30.0.41",
        port: 80,
        protocol: Protocol::Tcp,
        from_node: false,
        want: accept(&["10.180.0.1:80"], true),
    }];
    run(&[s], &ctx, &cases);
}

#[test]
fn unreadable_source_ranges_let_no_source_in() {
    let closed = svc("ns1", "lb", "172.30.0.61", |s| {
        s.node_port = Some(30061);
        s.load_balancer_ips = vec!["5.6.7.61".parse().unwrap()];
        s.source_ranges_closed = true;
    })
    .with_endpoints(vec![ep("10.180.0.1", 80, "")]);
    #[rustfmt::skip]
    let cases = [
        Case { name: "LB IP from outside: dropped", src: OUTSIDE, dst: "5.6.7.61", port: 80, protocol: Protocol::Tcp, from_node: false, want: Verdict::Drop },
        Case { name: "LB IP from a pod: dropped", src: POD, dst: "5.6.7.61", port: 80, protocol: Protocol::Tcp, from_node: false, want: Verdict::Drop },
        Case { name: "cluster IP unaffected", src: POD, dst: "172.30.0.61", port: 80, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.1:80"], false) },
        Case { name: "NodePort unaffected (never subject to source ranges)", src: OUTSIDE, dst: NODE_IP, port: 30061, protocol: Protocol::Tcp, from_node: false, want: accept(&["10.180.0.1:80"], true) },
    ];
    run(&[closed], &context(), &cases);
}
