//! TestNodePorts: a NodePort Service (3001) with an endpoint on no node and one on this node,
//! under localhostNodePorts and nodePortAddresses as each subcase sets them, in each family.

use super::{Case, EXTERNAL, LOCALHOST, NODE_IP6, POD, Scenario, accept, untouched};
use crate::model::{IpFamily, Protocol};
use crate::proxier::fixtures::{NODE, NODE_IP, ep, family_context, svc};

/// One subcase.
struct Subcase {
    name: &'static str,
    family: IpFamily,
    localhost_node_ports: bool,
    /// nodePortAddresses; `None`: the mode's default.
    node_port_addresses: Option<&'static [&'static str]>,
    /// NodePort traffic to the node's second address is accepted.
    alt_node_ip: bool,
    /// NodePort traffic to the loopback address is accepted (upstream: IPv4 with
    /// localhostNodePorts, and a loopback address among nodePortAddresses when they are set).
    localhost: bool,
}

fn scenario(case: &Subcase) -> Scenario {
    let v4 = case.family == IpFamily::V4;
    // Upstream's fake network (lo and eth0) and addresses for the family.
    let (addresses, node_ip, alt_ip, pod, external, localhost): (&[&'static str], _, _, _, _, _) =
        if v4 {
            let addresses: &[&str] = &["127.0.0.1", NODE_IP, "192.168.1.2", "192.168.99.11"];
            (addresses, NODE_IP, "192.168.1.2", POD, EXTERNAL, LOCALHOST)
        } else {
            let addresses: &[&str] = &["::1", NODE_IP6, "2001:db8:1::2"];
            (
                addresses,
                NODE_IP6,
                "2001:db8:1::2",
                "fd00:10::2",
                "2600:5200::1",
                "::1",
            )
        };
    let (cluster_ip, ep1, ep2) = if v4 {
        ("172.30.0.41", "10.180.0.1", "10.180.2.1")
    } else {
        ("fd00:172:30::41", "fd00:10:180::1", "fd00:10:180::2:1")
    };
    let service = svc("ns1", "svc1", cluster_ip, |s| s.node_port = Some(3001))
        .with_endpoints(vec![ep(ep1, 80, ""), ep(ep2, 80, NODE)]);
    let both = [
        std::net::SocketAddr::new(ep1.parse().unwrap(), 80).to_string(),
        std::net::SocketAddr::new(ep2.parse().unwrap(), 80).to_string(),
    ];
    let both: Vec<&str> = both.iter().map(String::as_str).collect();
    let tcp = |name, src, dst, port, from_node, want| Case {
        name,
        src,
        dst,
        port,
        protocol: Protocol::Tcp,
        from_node,
        want,
    };
    #[rustfmt::skip]
    let cases = vec![
        tcp("pod to cluster IP", pod, cluster_ip, 80, false, accept(&both, false)),
        tcp("external to nodePort", external, node_ip, 3001, false, accept(&both, true)),
        tcp("node to nodePort", node_ip, node_ip, 3001, true, accept(&both, true)),
        tcp("localhost to nodePort", localhost, localhost, 3001, true, if case.localhost { accept(&both, true) } else { untouched() }),
        tcp("external to nodePort on secondary IP", external, alt_ip, 3001, false, if case.alt_node_ip { accept(&both, true) } else { untouched() }),
    ];
    let mut scenario = Scenario::new(
        format!("TestNodePorts, {}", case.name),
        vec![service],
        cases,
    );
    scenario.common = if v4 {
        family_context(IpFamily::V4, NODE_IP, "10.0.0.0/8")
    } else {
        family_context(IpFamily::V6, NODE_IP6, "fd00:10::/64")
    };
    scenario.localhost_node_ports = case.localhost_node_ports;
    scenario.node_port_addresses = case
        .node_port_addresses
        .map(|list| list.iter().map(|a| a.to_string()).collect());
    scenario.addresses = addresses.to_vec();
    scenario
}

/// nftables' subcases (its file's own table): no localhost NodePorts and no
/// localhostNodePorts flag; without nodePortAddresses, the mode's default (its fake proxier's
/// 192.168.0.2/32 and 2001:db8::1/128: the node's primary addresses), so the second address
/// takes no NodePort traffic. The loopback flow stays, as
/// every mode's: untouched.
pub fn node_ports_nftables() -> Vec<Scenario> {
    use IpFamily::{V4, V6};
    #[rustfmt::skip]
    let cases = [
        Subcase { name: "ipv4", family: V4, localhost_node_ports: false, node_port_addresses: None, alt_node_ip: false, localhost: false },
        Subcase { name: "ipv4, multiple nodeport-addresses", family: V4, localhost_node_ports: false, node_port_addresses: Some(&["192.168.0.0/24", "192.168.1.0/24", "2001:db8::/64"]), alt_node_ip: true, localhost: false },
        Subcase { name: "ipv6", family: V6, localhost_node_ports: false, node_port_addresses: None, alt_node_ip: false, localhost: false },
        Subcase { name: "ipv6, multiple nodeport-addresses", family: V6, localhost_node_ports: false, node_port_addresses: Some(&["192.168.0.0/24", "192.168.1.0/24", "2001:db8::/64", "2001:db8:1::2/128"]), alt_node_ip: true, localhost: false },
    ];
    cases.iter().map(scenario).collect()
}

/// Every subcase of iptables' file, and ours.
pub fn node_ports() -> Vec<Scenario> {
    use IpFamily::{V4, V6};
    let multiple: &'static [&'static str] = &["192.168.0.0/24", "192.168.1.0/24", "2001:db8::/64"];
    #[rustfmt::skip]
    let cases = [
        Subcase { name: "ipv4, localhost-nodeports enabled", family: V4, localhost_node_ports: true, node_port_addresses: Some(&[]), alt_node_ip: true, localhost: true },
        Subcase { name: "ipv4, localhost-nodeports disabled", family: V4, localhost_node_ports: false, node_port_addresses: Some(&[]), alt_node_ip: true, localhost: false },
        Subcase { name: "ipv4, localhost-nodeports disabled, localhost in nodeport-addresses", family: V4, localhost_node_ports: false, node_port_addresses: Some(&["192.168.0.0/24", "127.0.0.1/32"]), alt_node_ip: false, localhost: false },
        Subcase { name: "ipv4, localhost-nodeports enabled, multiple nodeport-addresses", family: V4, localhost_node_ports: false, node_port_addresses: Some(multiple), alt_node_ip: true, localhost: false },
        Subcase { name: "ipv6, localhost-nodeports enabled", family: V6, localhost_node_ports: true, node_port_addresses: Some(&[]), alt_node_ip: true, localhost: false },
        Subcase { name: "ipv6, localhost-nodeports disabled", family: V6, localhost_node_ports: false, node_port_addresses: Some(&[]), alt_node_ip: true, localhost: false },
        Subcase { name: "ipv6, localhost-nodeports disabled, multiple nodeport-addresses", family: V6, localhost_node_ports: false, node_port_addresses: Some(multiple), alt_node_ip: false, localhost: false },
        // Ours, the same way: 1.37's keywords, mixed with each other and with CIDRs.
        Subcase { name: "ipv4, primary and localhost", family: V4, localhost_node_ports: true, node_port_addresses: Some(&["primary", "localhost"]), alt_node_ip: false, localhost: true },
        Subcase { name: "ipv4, primary only", family: V4, localhost_node_ports: true, node_port_addresses: Some(&["primary"]), alt_node_ip: false, localhost: false },
        Subcase { name: "ipv4, all and a CIDR", family: V4, localhost_node_ports: true, node_port_addresses: Some(&["all", "192.168.0.0/24"]), alt_node_ip: true, localhost: true },
        Subcase { name: "ipv6, primary and localhost", family: V6, localhost_node_ports: true, node_port_addresses: Some(&["primary", "localhost"]), alt_node_ip: false, localhost: false },
        Subcase { name: "ipv6, localhost and a CIDR", family: V6, localhost_node_ports: true, node_port_addresses: Some(&["localhost", "2001:db8::/64"]), alt_node_ip: false, localhost: false },
    ];
    cases.iter().map(scenario).collect()
}
