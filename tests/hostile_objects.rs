//! Hostile and odd API objects through the real daemon, with real packets: port names carrying
//! quotes, `$(...)` and a line of rule text are refused (no rule of theirs reaches the kernel) and
//! everything else keeps working; an object with a wrongly typed field is skipped; a ClusterIP
//! written with leading zeros works as upstream reads it; a LoadBalancer whose source ranges
//! cannot be read accepts no one, while one without source ranges accepts everyone.

mod support;

use serde_json::json;
use support::cluster::{CLIENT_IP, Cluster, addr, seed, service, slice};
use support::netns::{require_netns, tcp_request};
use support::{WAIT, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_objects_are_refused_and_the_rest_works() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let api = &cluster.api;
    let backend = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    let hostile = [
        ("quoted", "p\" -j ACCEPT $(id) x"),
        ("injected", "p\n-A KUBE-SERVICES -j DROP"),
    ];
    for (index, (name, port_name)) in hostile.iter().enumerate() {
        let ip = format!("10.96.0.{}", 60 + index);
        let ports = json!([{"name": port_name, "port": 80, "protocol": "TCP"}]);
        api.apply(service(name, &ip, ports, json!({}))).unwrap();
        let mut endpoints = slice(name, backend.clone(), &["pod-a1"]);
        endpoints["ports"][0]["name"] = json!(port_name);
        api.apply(endpoints).unwrap();
    }
    let mut ill_typed = service(
        "ill-typed",
        "10.96.0.62",
        json!([{"name": "http", "port": 80, "protocol": "TCP"}]),
        json!({}),
    );
    ill_typed["spec"]["ports"][0]["port"] = json!("eighty");
    api.apply(ill_typed).unwrap();
    let http = json!([{"name": "http", "port": 80, "protocol": "TCP"}]);
    api.apply(service("zeros", "10.96.0.041", http.clone(), json!({})))
        .unwrap();
    api.apply(slice("zeros", backend.clone(), &["pod-a2"]))
        .unwrap();
    for (name, lb, ranges) in [
        ("closed", "192.168.200.1", json!(["bogus", "10.0.0.0/99"])),
        ("open", "192.168.200.2", json!([])),
    ] {
        let mut lb_service = service(
            name,
            if name == "closed" {
                "10.96.0.63"
            } else {
                "10.96.0.64"
            },
            http.clone(),
            json!({"type": "LoadBalancer", "loadBalancerSourceRanges": ranges}),
        );
        lb_service["status"] = json!({"loadBalancer": {"ingress": [{"ip": lb}]}});
        api.apply(lb_service).unwrap();
        api.apply(slice(name, backend.clone(), &["pod-a1"]))
            .unwrap();
    }

    let daemon = cluster.daemon(&cluster.config(""));
    daemon.wait_for("\"Synced proxy rules\"").await;
    let node = &cluster.node;
    let client = &cluster.client;
    assert!(
        tcp_request(node, addr("10.96.0.10:80")).is_ok(),
        "web works"
    );
    for (name, _) in hostile {
        daemon
            .wait_for(&format!(
                "\"Skipping malformed Service\" kind=\"Service\" object=\"default/{name}\""
            ))
            .await;
    }
    daemon
        .wait_for("object=\"default/ill-typed\" reason=\"does not decode: spec.ports[0].port")
        .await;
    let nat = cluster.ipt(&["-t", "nat", "-S"]);
    let filter = cluster.ipt(&["-S"]);
    for text in [&nat, &filter] {
        assert!(!text.contains("$(id)") && !text.contains("-j DROP\n-A KUBE-SERVICES -j DROP"));
        assert!(!text.contains("default/quoted") && !text.contains("default/injected"));
    }
    assert!(
        !filter.lines().any(|l| l == "-A KUBE-SERVICES -j DROP"),
        "no rule of the object's own"
    );

    assert_eq!(
        tcp_request(node, addr("10.96.0.41:80")).map(|a| a.starts_with("pod-a2")),
        Ok(true),
        "10.96.0.041 is 10.96.0.41"
    );
    assert!(
        eventually(WAIT, || tcp_request(client, addr("192.168.200.2:80"))
            .is_ok())
        .await,
        "a LoadBalancer without source ranges is open from {CLIENT_IP}"
    );
    assert!(
        tcp_request(client, addr("192.168.200.1:80")).is_err(),
        "unreadable source ranges let no one in"
    );
    daemon.wait_for("no range could be read").await;
    daemon.stop().await;
}
