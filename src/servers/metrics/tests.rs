use super::*;
use crate::config::ProxyMode;
use crate::proxier::profile::profile;

/// A GET to the API server answered 200 in 3 ms.
fn one_api_request(metrics: &Metrics) {
    metrics.api_request(&crate::k8s::RequestRecord {
        method: "GET".into(),
        host: "10.0.0.1:6443".into(),
        code: "200".into(),
        duration: Duration::from_millis(3),
    });
}

#[test]
fn syncs_move_the_counters() {
    let metrics = Metrics::new().unwrap();
    metrics.queued();
    metrics.pending(1, 3);
    let both = [IpFamily::V4, IpFamily::V6];
    let report = SyncReport {
        full: true,
        rules: vec![
            (IpFamily::V4, "nat", 42),
            (IpFamily::V4, "filter", 7),
            (IpFamily::V6, "nat", 5),
        ],
        rules_written: vec![(IpFamily::V6, "filter", 3)],
        no_local_endpoints: vec![(IpFamily::V4, (1, 2))],
        ..SyncReport::default()
    };
    let trigger = SystemTime::now() - Duration::from_secs(2);
    metrics.synced(
        &both,
        &report,
        Duration::from_millis(30),
        (1, 3),
        &[trigger],
    );
    metrics.failed(&both[..1], profile(ProxyMode::Iptables).failures, true);
    metrics.failed(&both[..1], profile(ProxyMode::Nftables).failures, false);
    metrics.nftables_cleanup_failures(IpFamily::V6);
    metrics.health_answered(false, 200);
    metrics.health_answered(true, 503);
    one_api_request(&metrics);
    let text = metrics.encode();
    for want in [
        "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 1",
        "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 1",
        "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv6\"} 1",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} ",
        "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"} ",
        "kubeproxy_sync_proxy_rules_service_changes_total 1",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total 3",
        "kubeproxy_sync_proxy_rules_endpoint_changes_pending 0",
        "kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"} 42",
        "kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv6\",table=\"nat\"} 5",
        "kubeproxy_sync_proxy_rules_iptables_last{ip_family=\"IPv6\",table=\"filter\"} 3",
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"} 1",
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv6\"} 0",
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"} 1",
        "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family=\"IPv4\"} 0",
        "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family=\"IPv6\"} 1",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"external\"} 2",
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv6\",traffic_policy=\"external\"} 0",
        "kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv4\",le=\"2\"} 0",
        "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv6\"} 1",
        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family=\"IPv4\"} 1",
        "kubeproxy_proxy_healthz_total{code=\"200\"} 1",
        "kubeproxy_proxy_livez_total{code=\"503\"} 1",
        "rest_client_requests_total{code=\"200\",host=\"10.0.0.1:6443\",method=\"GET\"} 1",
        "rest_client_request_duration_seconds_bucket{host=\"10.0.0.1:6443\",verb=\"GET\",le=\"0.005\"} 1",
        "process_resident_memory_bytes ",
        "process_cpu_seconds_total ",
        "kubernetes_build_info{",
        // The release named once, in config, for both numbers and the version.
        "git_version=\"v1.37.0\"",
        "major=\"1\",minor=\"37\"",
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
}

#[test]
fn help_texts_lead_with_upstreams_stability_levels() {
    let metrics = Metrics::new().unwrap();
    let mut gates = std::collections::BTreeMap::new();
    gates.insert("KubeProxyIPVS".to_string(), true);
    metrics.feature_gates(&gates).unwrap();
    one_api_request(&metrics);
    let text = metrics.encode();
    for want in [
        "# HELP kubeproxy_sync_proxy_rules_service_changes_total [ALPHA] Cumulative proxy rules Service changes\n",
        "# HELP rest_client_requests_total [ALPHA] Number of HTTP requests, partitioned by status code, method, and host.\n",
        "# HELP kubernetes_build_info [BETA] A metric with a constant '1' value",
        "# HELP kubernetes_feature_enabled [BETA] This metric records",
        "# HELP process_resident_memory_bytes Resident memory size in bytes.\n",
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
    let unmarked: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("# HELP "))
        .filter(|line| !line.contains(" process_") && !line.contains(" go_"))
        .filter(|line| !line.contains(" [ALPHA] ") && !line.contains(" [BETA] "))
        .collect();
    assert!(unmarked.is_empty(), "no stability level: {unmarked:?}");
}
