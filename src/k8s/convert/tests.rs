use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice as ApiEndpointSlice;

use super::*;
use crate::model::{ServicePort, ServicePortMap};

const CLUSTER: &str = include_str!("../../../tests/testdata/cluster.yaml");

fn items(kind: &str) -> Vec<serde_json::Value> {
    let list: serde_json::Value = serde_yaml_ng::from_str(CLUSTER).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == kind)
        .cloned()
        .collect()
}

fn services() -> BTreeMap<String, Converted<ServicePortMap>> {
    items("Service")
        .into_iter()
        .map(|v| {
            let svc: Service = serde_json::from_value(v).unwrap();
            let key = object_key(&svc.metadata).unwrap().to_string();
            (key, service_ports(&svc).unwrap())
        })
        .collect()
}

fn yaml_service(text: &str) -> Service {
    serde_yaml_ng::from_str(text).unwrap()
}

fn only_port(map: &ServicePortMap) -> &ServicePort {
    assert_eq!(map.len(), 1);
    map.values().next().unwrap()
}

#[test]
fn cluster_ip_and_multi_port() {
    let all = services();
    let kubernetes = only_port(&all["default/kubernetes"].value);
    assert_eq!(kubernetes.name.to_string(), "default/kubernetes:https");
    assert_eq!(
        kubernetes.cluster_ips,
        vec!["10.96.0.1".parse::<IpAddr>().unwrap()]
    );
    assert_eq!((kubernetes.port, kubernetes.node_port), (443, None));
    assert!(!kubernetes.externally_accessible());

    let dns = &all["kube-system/kube-dns"].value;
    let names: Vec<String> = dns.keys().map(|n| format!("{n} {}", n.protocol)).collect();
    assert_eq!(
        names,
        vec![
            "kube-system/kube-dns:dns UDP",
            "kube-system/kube-dns:dns-tcp TCP",
            "kube-system/kube-dns:metrics TCP"
        ]
    );
}

#[test]
fn node_port_with_affinity() {
    let all = services();
    let web = only_port(&all["default/go-web-service"].value);
    assert_eq!(web.node_port, Some(30009));
    assert_eq!(web.session_affinity_seconds, Some(600));
    assert!(!web.external_policy_local);
    assert!(web.externally_accessible());
}

#[test]
fn load_balancer_dual_stack_local() {
    let all = services();
    let lb = &all["shop/web-lb"];
    let port = only_port(&lb.value);
    assert_eq!(port.cluster_ips.len(), 2);
    assert_eq!(
        port.cluster_ip(IpFamily::V6),
        Some("fd00:10:96::5".parse().unwrap())
    );
    assert_eq!(
        port.external_ips,
        vec!["192.168.50.10".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(
        port.load_balancer_ips,
        vec!["192.168.60.1".parse::<IpAddr>().unwrap()],
        "ipMode Proxy skipped"
    );
    assert_eq!(port.load_balancer_source_ranges.len(), 2);
    assert!(port.external_policy_local);
    assert_eq!(port.health_check_node_port, Some(31999));
    assert_eq!(port.node_port, Some(31080));
    assert_eq!(
        lb.warnings,
        vec!["spec.externalIPs: \"not-an-ip\" is not valid; ignored"]
    );
}

#[test]
fn headless_external_name_and_v6() {
    let all = services();
    assert!(all["shop/db"].value.is_empty());
    assert!(all["shop/search"].value.is_empty());
    let v6 = only_port(&all["shop/v6only"].value);
    assert_eq!(v6.name.protocol, Protocol::Sctp);
    assert_eq!(v6.name.to_string(), "shop/v6only");
    assert!(v6.internal_policy_local);
}

#[test]
fn endpoint_slices_convert_with_conditions_and_hints() {
    let slices: Vec<ApiEndpointSlice> = items("EndpointSlice")
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
    let web = endpoint_slice(&slices[0]).unwrap();
    let slice = web.value.unwrap();
    assert_eq!(slice.service.to_string(), "shop/web-lb");
    assert_eq!(slice.name.to_string(), "shop/web-lb-abcde");
    assert_eq!(
        slice.ports,
        vec![SlicePort {
            name: "http".into(),
            port: 8080,
            protocol: Protocol::Tcp
        }]
    );
    let states: Vec<_> = slice
        .endpoints
        .iter()
        .map(|e| (e.ip.to_string(), e.ready, e.serving, e.terminating))
        .collect();
    assert_eq!(
        states,
        vec![
            ("10.244.1.5".into(), true, true, false),
            ("10.244.2.6".into(), false, true, true),
            ("10.244.2.7".into(), true, true, false),
        ]
    );
    assert_eq!(
        slice.endpoints[0].zone_hints.iter().collect::<Vec<_>>(),
        vec!["zone-a"]
    );
    assert_eq!(slice.endpoints[0].node_name.as_deref(), Some("node-a"));
    // A node's name is stored once, whichever slice names it.
    let again = endpoint_slice(&slices[0]).unwrap().value.unwrap();
    let (first, second) = (&slice.endpoints[0].node_name, &again.endpoints[0].node_name);
    assert!(std::sync::Arc::ptr_eq(
        first.as_ref().unwrap(),
        second.as_ref().unwrap()
    ));
    assert_eq!(
        web.warnings,
        vec!["endpoints[3].addresses: \"bad-address\" is not an IPv4 address; ignored"]
    );
    assert_eq!(
        endpoint_slice(&slices[1]).unwrap().value,
        None,
        "FQDN slices are ignored"
    );
}

#[test]
fn malformed_objects_are_refused_with_reasons() {
    let cases = [
        (
            "metadata: {namespace: a}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}",
            "metadata.name is missing",
        ),
        (
            "metadata: {name: a}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}",
            "metadata.namespace is missing",
        ),
        ("metadata: {name: a, namespace: b}", "spec is missing"),
        (
            "metadata: {name: a, namespace: b}\nspec: {clusterIP: 10.0.0.300, ports: [{port: 80}]}",
            "spec.clusterIPs: \"10.0.0.300\" is not an IP address",
        ),
        (
            "metadata: {name: a, namespace: b}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 0}]}",
            "spec.ports[0].port: 0 is not a port",
        ),
        (
            "metadata: {name: a, namespace: b}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 70000}]}",
            "spec.ports[0].port: 70000",
        ),
        (
            "metadata: {name: a, namespace: b}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80, protocol: ICMP}]}",
            "spec.ports[0].protocol: \"ICMP\"",
        ),
        (
            "metadata: {name: a, namespace: b}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80, nodePort: -5}]}",
            "spec.ports[0].nodePort: -5",
        ),
        (
            "metadata: {name: a, namespace: b}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}, {port: 80}]}",
            "spec.ports[1]: port b/a (TCP) is listed twice",
        ),
        (
            "metadata: {name: a, namespace: b}\nspec: {clusterIP: 10.0.0.1, sessionAffinity: ClientIP, sessionAffinityConfig: {clientIP: {timeoutSeconds: 0}}, ports: [{port: 80}]}",
            "timeoutSeconds: 0 is not between 1 and 86400",
        ),
        (
            "metadata: {name: a, namespace: b}\nspec: {clusterIP: 10.0.0.1, sessionAffinity: Sticky, ports: [{port: 80}]}",
            "spec.sessionAffinity: \"Sticky\"",
        ),
    ];
    for (text, want) in cases {
        let err = service_ports(&yaml_service(text)).unwrap_err();
        assert!(err.reason.contains(want), "{text}: got {err}, want {want}");
    }
}

#[test]
fn malformed_slices_are_refused_or_trimmed() {
    let slice = |text: &str| -> ApiEndpointSlice { serde_yaml_ng::from_str(text).unwrap() };
    let no_label = slice("addressType: IPv4\nmetadata: {name: s, namespace: n}\nendpoints: []");
    assert!(
        endpoint_slice(&no_label)
            .unwrap_err()
            .reason
            .contains("kubernetes.io/service-name is missing")
    );
    let bad_type = slice(
        "addressType: IPX\nmetadata: {name: s, namespace: n, labels: {kubernetes.io/service-name: x}}\nendpoints: []",
    );
    assert!(
        endpoint_slice(&bad_type)
            .unwrap_err()
            .reason
            .contains("addressType: \"IPX\"")
    );
    let bad_ports = slice(
        "addressType: IPv6\nmetadata: {name: s, namespace: n, labels: {kubernetes.io/service-name: x}}\n\
         endpoints: [{addresses: ['fd00::1']}, {addresses: [10.0.0.1]}]\n\
         ports: [{port: 0}, {port: 80, protocol: GRE}, {port: 81, protocol: UDP}]",
    );
    let converted = endpoint_slice(&bad_ports).unwrap();
    let value = converted.value.unwrap();
    assert_eq!(value.ports.len(), 1);
    assert_eq!(value.endpoints.len(), 1);
    assert_eq!(converted.warnings.len(), 3, "{:?}", converted.warnings);
}

#[test]
fn node_info_reads_addresses_labels_and_cidrs() {
    let node: Node = serde_yaml_ng::from_str(
        "metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}\n\
         spec: {podCIDR: 10.244.1.0/24, podCIDRs: [10.244.1.0/24, 'fd00:10:244:1::/64']}\n\
         status: {addresses: [{type: Hostname, address: node-a}, {type: ExternalIP, address: 203.0.113.9}, {type: InternalIP, address: 192.168.1.10}, {type: InternalIP, address: 'fd00::10'}]}",
    )
    .unwrap();
    let info = node_info(&node).value;
    assert_eq!(info.zone(), Some("zone-a"));
    let addresses: Vec<String> = info.addresses.iter().map(ToString::to_string).collect();
    assert_eq!(addresses, vec!["192.168.1.10", "fd00::10", "203.0.113.9"]);
    assert_eq!(info.pod_cidrs.len(), 2);
}

#[test]
fn names_that_could_reach_rule_text_are_checked() {
    let cases = [
        (
            "metadata: {name: a, namespace: b}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80, name: \"x\\\" -j ACCEPT $(id)\"}]}",
            "spec.ports[0].name: \"x\\\" -j ACCEPT $(id)\" is not a valid name",
        ),
        (
            "metadata: {name: a, namespace: b}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80, name: \"p\\n-A KUBE-SERVICES -j DROP\"}]}",
            "spec.ports[0].name: \"p\\n-A KUBE-SERVICES -j DROP\" is not a valid name",
        ),
        (
            "metadata: {name: \"a b\", namespace: b}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}",
            "metadata.name: \"a b\" is not a valid name",
        ),
        (
            "metadata: {name: a, namespace: \"B\\\"\"}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}",
            "metadata.namespace: \"B\\\"\" is not a valid name",
        ),
    ];
    for (text, want) in cases {
        let err = service_ports(&yaml_service(text)).unwrap_err();
        assert!(err.reason.contains(want), "{text}: {}", err.reason);
    }
    let slice = |text: &str| -> ApiEndpointSlice { serde_yaml_ng::from_str(text).unwrap() };
    let bad_label = slice(
        "addressType: IPv4\nmetadata: {name: s, namespace: n, labels: {kubernetes.io/service-name: \"x\\ny\"}}\nendpoints: []",
    );
    assert!(
        endpoint_slice(&bad_label)
            .unwrap_err()
            .reason
            .contains("is not a valid name")
    );
    let bad_port = slice(
        "addressType: IPv4\nmetadata: {name: s, namespace: n, labels: {kubernetes.io/service-name: x}}\n\
         ports: [{name: \"a\\\"b\", port: 80}, {name: ok, port: 81}]\nendpoints: []",
    );
    let converted = endpoint_slice(&bad_port).unwrap();
    assert_eq!(converted.value.unwrap().ports.len(), 1);
    assert_eq!(converted.warnings.len(), 1, "{:?}", converted.warnings);
}

#[test]
fn addresses_with_leading_zeros_are_read_as_upstream_reads_them() {
    let svc = yaml_service(
        "metadata: {name: a, namespace: b}\nspec: {type: LoadBalancer, clusterIP: 172.30.0.041, \
         loadBalancerSourceRanges: [203.0.113.000/025], ports: [{port: 80, nodePort: 30080}]}\n\
         status: {loadBalancer: {ingress: [{ip: 192.168.010.001}]}}",
    );
    let converted = service_ports(&svc).unwrap();
    let port = only_port(&converted.value);
    assert_eq!(
        port.cluster_ips,
        vec!["172.30.0.41".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(
        port.load_balancer_ips,
        vec!["192.168.10.1".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(
        port.load_balancer_source_ranges,
        vec!["203.0.113.0/25".parse::<ipnet::IpNet>().unwrap()]
    );
    assert!(converted.warnings.is_empty(), "{:?}", converted.warnings);
}

#[test]
fn source_ranges_that_cannot_be_read_never_widen_access() {
    let lb = |ranges: &str| {
        service_ports(&yaml_service(&format!(
            "metadata: {{name: a, namespace: b}}\nspec: {{type: LoadBalancer, clusterIP: 10.0.0.1, \
             loadBalancerSourceRanges: {ranges}, ports: [{{port: 80, nodePort: 30080}}]}}\n\
             status: {{loadBalancer: {{ingress: [{{ip: 192.168.10.1}}]}}}}"
        )))
        .unwrap()
    };
    let none_readable = lb("[\"bogus\", \"10.0.0.0/99\"]");
    let port = only_port(&none_readable.value);
    assert!(port.load_balancer_source_ranges.is_empty());
    assert!(port.source_ranges_closed && port.has_source_ranges());
    assert_eq!(
        none_readable.warnings.len(),
        3,
        "{:?}",
        none_readable.warnings
    );
    let one_readable = lb("[\"bogus\", \"10.0.0.0/8\"]");
    let port = only_port(&one_readable.value);
    assert_eq!(
        port.load_balancer_source_ranges.len(),
        1,
        "the readable one only"
    );
    assert!(!port.source_ranges_closed);
    let unrestricted = lb("[]");
    assert!(!only_port(&unrestricted.value).has_source_ranges());
}
