use std::io::Write;

use super::*;

const KUBEADM: &str = include_str!("../../tests/testdata/kubeadm-config.conf");

fn decoded(text: &str) -> KubeProxyConfiguration {
    let mut config = decode_config(text, "test.conf").unwrap().config;
    config.apply_defaults();
    config
}

fn errors_of(text: &str) -> Vec<String> {
    validate(&decoded(text))
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn secs(d: GoDuration) -> u64 {
    d.0.as_secs()
}

#[test]
fn empty_config_gets_upstream_defaults() {
    let config = decoded("kind: KubeProxyConfiguration\n");
    assert_eq!(config.bind_address, "0.0.0.0");
    assert_eq!(config.healthz_bind_address, "0.0.0.0:10256");
    assert_eq!(config.metrics_bind_address, "127.0.0.1:10249");
    assert_eq!(config.oom_score_adj, Some(-999));
    assert_eq!(config.iptables.masquerade_bit, Some(14));
    assert_eq!(config.iptables.localhost_node_ports, Some(true));
    assert_eq!(secs(config.iptables.sync_period), 30);
    assert_eq!(secs(config.iptables.min_sync_period), 1);
    assert_eq!(secs(config.ipvs.sync_period), 30);
    assert_eq!(secs(config.ipvs.min_sync_period), 0);
    assert_eq!(secs(config.nftables.sync_period), 30);
    assert_eq!(secs(config.config_sync_period), 900);
    assert_eq!(config.client_connection.qps, 5.0);
    assert_eq!(config.client_connection.burst, 10);
    assert_eq!(config.conntrack.max_per_core, Some(32768));
    assert_eq!(config.conntrack.min, Some(131072));
    assert_eq!(
        config.conntrack.tcp_established_timeout,
        Some(GoDuration::from_secs(86400))
    );
    assert_eq!(
        config.conntrack.tcp_close_wait_timeout,
        Some(GoDuration::from_secs(3600))
    );
    assert_eq!(config.logging.format, "text");
    assert_eq!(config.proxy_mode(), Some(ProxyMode::Iptables));
    assert_eq!(config.detect_local(), Some(DetectLocalMode::ClusterCidr));
    assert_eq!(config.masquerade_mark(), 0x4000);
    assert!(validate(&config).is_empty());
}

#[test]
fn kubeadm_config_conf_decodes_strictly_and_defaults() {
    let decoded_file = decode_config(KUBEADM, "config.conf").unwrap();
    assert!(
        decoded_file.unknown_fields.is_empty(),
        "{:?}",
        decoded_file.unknown_fields
    );
    let mut config = decoded_file.config;
    config.apply_defaults();
    assert!(validate(&config).is_empty(), "{:?}", validate(&config));
    assert_eq!(
        config.client_connection.kubeconfig,
        "/var/lib/kube-proxy/kubeconfig.conf"
    );
    assert_eq!(config.cluster_cidr, "10.244.0.0/16");
    assert_eq!(secs(config.iptables.sync_period), 30);
    assert_eq!(config.iptables.masquerade_bit, Some(14));
    assert_eq!(config.healthz_bind_address, "0.0.0.0:10256");
    assert!(config.node_port_addresses.is_empty());
    assert_eq!(config.proxy_mode(), Some(ProxyMode::Iptables));
}

#[test]
fn every_field_is_read() {
    let text = r#"
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
featureGates: {SomeGate: true}
clientConnection: {kubeconfig: /k, acceptContentTypes: a, contentType: application/json, qps: 7, burst: 20}
hostnameOverride: Node-A
bindAddress: 10.0.0.1
healthzBindAddress: 10.0.0.1:1111
metricsBindAddress: 10.0.0.1:2222
bindAddressHardFail: true
enableProfiling: true
showHiddenMetricsForVersion: "1.30"
mode: ipvs
iptables: {masqueradeBit: 0, masqueradeAll: true, localhostNodePorts: false, syncPeriod: 1m, minSyncPeriod: 5s}
ipvs: {syncPeriod: 45s, minSyncPeriod: 2s, scheduler: wrr, excludeCIDRs: [10.9.0.0/16], strictARP: true,
       tcpTimeout: 900s, tcpFinTimeout: 120s, udpTimeout: 300s}
nftables: {masqueradeBit: 3, masqueradeAll: true, syncPeriod: 20s, minSyncPeriod: 2s}
detectLocalMode: InterfaceNamePrefix
detectLocal: {bridgeInterface: br0, interfaceNamePrefix: veth}
clusterCIDR: 10.244.0.0/16,fd00:10:244::/48
nodePortAddresses: [192.168.0.0/16, "fd00::/8"]
oomScoreAdj: -500
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 2h, tcpCloseWaitTimeout: 30m, tcpBeLiberal: true,
            udpTimeout: 30s, udpStreamTimeout: 2m}
configSyncPeriod: 1h
portRange: ""
logging: {format: json, verbosity: 4}
"#;
    let decoded_file = decode_config(text, "t").unwrap();
    assert!(
        decoded_file.unknown_fields.is_empty(),
        "{:?}",
        decoded_file.unknown_fields
    );
    let mut c = decoded_file.config;
    c.apply_defaults();
    assert_eq!(validate(&c), vec![]);
    assert_eq!(c.feature_gates.get("SomeGate"), Some(&true));
    assert_eq!(c.client_connection.qps, 7.0);
    assert_eq!(c.client_connection.burst, 20);
    assert_eq!(c.client_connection.content_type, "application/json");
    assert_eq!(c.hostname_override, "Node-A");
    assert_eq!(c.healthz_bind_address, "10.0.0.1:1111");
    assert_eq!(c.metrics_bind_address, "10.0.0.1:2222");
    assert!(c.bind_address_hard_fail && c.enable_profiling);
    assert_eq!(c.proxy_mode(), Some(ProxyMode::Ipvs));
    assert_eq!(c.iptables.masquerade_bit, Some(0));
    assert_eq!(c.masquerade_mark(), 1);
    assert!(c.iptables.masquerade_all);
    assert_eq!(c.iptables.localhost_node_ports, Some(false));
    assert_eq!(secs(c.iptables.sync_period), 60);
    assert_eq!(secs(c.iptables.min_sync_period), 5);
    assert_eq!(c.ipvs.scheduler, "wrr");
    assert_eq!(c.ipvs.exclude_cidrs, vec!["10.9.0.0/16"]);
    assert!(c.ipvs.strict_arp);
    assert_eq!(
        (
            secs(c.ipvs.tcp_timeout),
            secs(c.ipvs.tcp_fin_timeout),
            secs(c.ipvs.udp_timeout)
        ),
        (900, 120, 300)
    );
    assert_eq!(c.nftables.masquerade_bit, Some(3));
    assert_eq!(c.detect_local(), Some(DetectLocalMode::InterfaceNamePrefix));
    assert_eq!(c.detect_local.interface_name_prefix, "veth");
    assert_eq!(c.node_port_addresses, vec!["192.168.0.0/16", "fd00::/8"]);
    assert_eq!(c.oom_score_adj, Some(-500));
    assert_eq!(
        c.conntrack.max_per_core,
        Some(0),
        "0 means leave the kernel's value, not the default"
    );
    assert_eq!(
        c.conntrack.tcp_established_timeout,
        Some(GoDuration::from_secs(7200))
    );
    assert!(c.conntrack.tcp_be_liberal);
    assert_eq!(secs(c.conntrack.udp_stream_timeout), 120);
    assert_eq!(secs(c.config_sync_period), 3600);
    assert_eq!(c.logging.format, "json");
    assert_eq!(c.logging.verbosity, 4);
}

#[test]
fn ipv6_bind_address_defaults_servers_to_ipv6() {
    let c = decoded("bindAddress: '::'\nhealthzBindAddress: '::1'\n");
    assert_eq!(c.healthz_bind_address, "[::1]:10256");
    assert_eq!(c.metrics_bind_address, "[::1]:10249");
    let c = decoded("healthzBindAddress: 10.1.1.1\n");
    assert_eq!(c.healthz_bind_address, "10.1.1.1:10256");
}

#[test]
fn unknown_fields_are_named_and_the_rest_still_applies() {
    let text = "mode: ipvs\nbogus: 1\niptables:\n  syncPeriod: 10s\n  extra: true\n";
    let d = decode_config(text, "t").unwrap();
    assert_eq!(d.unknown_fields, vec!["bogus", "iptables.extra"]);
    assert_eq!(d.config.mode, "ipvs");
    assert_eq!(secs(d.config.iptables.sync_period), 10);
}

#[test]
fn decode_errors_name_the_field_and_value() {
    let cases = [
        (
            "iptables:\n  syncPeriod: 3x\n",
            "field iptables.syncPeriod: invalid duration \"3x\"",
        ),
        (
            "iptables:\n  syncPeriod: -5s\n",
            "field iptables.syncPeriod: duration \"-5s\" is negative",
        ),
        (
            "iptables:\n  masqueradeBit: lots\n",
            "field iptables.masqueradeBit: invalid type: string \"lots\"",
        ),
        (
            "nodePortAddresses: 10.0.0.0/8\n",
            "field nodePortAddresses: invalid type: string \"10.0.0.0/8\"",
        ),
        ("apiVersion: v1\n", "apiVersion \"v1\" is not supported"),
        (
            "kind: KubeletConfiguration\n",
            "kind \"KubeletConfiguration\" is not supported",
        ),
        (
            "- a\n- b\n",
            "does not hold a KubeProxyConfiguration object",
        ),
        ("", "does not hold a KubeProxyConfiguration object"),
        ("mode: [\n", "is not valid YAML"),
    ];
    for (text, want) in cases {
        let err = decode_config(text, "c.conf").unwrap_err().to_string();
        assert!(err.contains(want), "{text:?}: got {err:?}, want {want:?}");
        assert!(!err.contains('\n'), "one line: {err:?}");
    }
}

#[test]
fn validation_names_field_and_value() {
    let cases = [
        (
            "mode: userspace",
            "mode: invalid value \"userspace\": must be one of",
        ),
        (
            "iptables: {masqueradeBit: 32}",
            "iptables.masqueradeBit: invalid value \"32\": must be between 0 and 31",
        ),
        (
            "iptables: {masqueradeBit: -1}",
            "iptables.masqueradeBit: invalid value \"-1\"",
        ),
        (
            "iptables: {syncPeriod: 5s, minSyncPeriod: 10s}",
            "iptables.minSyncPeriod: invalid value \"10s\": must be less than or equal to iptables.syncPeriod (5s)",
        ),
        (
            "mode: ipvs\nipvs: {scheduler: fastest}",
            "ipvs.scheduler: invalid value \"fastest\": must be one of rr, wrr",
        ),
        (
            "mode: ipvs\nipvs: {excludeCIDRs: [nope]}",
            "ipvs.excludeCIDRs[0]: invalid value \"nope\"",
        ),
        (
            "mode: ipvs\nipvs: {syncPeriod: 5s, minSyncPeriod: 6s}",
            "ipvs.minSyncPeriod: invalid value \"6s\"",
        ),
        (
            "mode: nftables\nnftables: {masqueradeBit: 40}",
            "nftables.masqueradeBit: invalid value \"40\"",
        ),
        (
            "clusterCIDR: 10.0.0.0/33",
            "clusterCIDR: invalid value \"10.0.0.0/33\"",
        ),
        (
            "clusterCIDR: 10.0.0.0/8,10.1.0.0/16",
            "two CIDRs must be one IPv4 and one IPv6",
        ),
        (
            "clusterCIDR: 10.0.0.0/8,fd00::/8,fd01::/8",
            "at most two CIDRs",
        ),
        (
            "bindAddress: localhost",
            "bindAddress: invalid value \"localhost\": must be an IP address",
        ),
        (
            "healthzBindAddress: 'host:80'",
            "healthzBindAddress: invalid value \"host:80\"",
        ),
        (
            "metricsBindAddress: '127.0.0.1:99999'",
            "metricsBindAddress: invalid value \"127.0.0.1:99999\"",
        ),
        (
            "metricsBindAddress: '127.0.0.1:0'",
            "port must be between 1 and 65535",
        ),
        (
            "nodePortAddresses: [primary, everything]",
            "nodePortAddresses[1]: invalid value \"everything\": must be a CIDR (like 192.168.0.0/16) or one of the keywords",
        ),
        (
            "nodePortAddresses: [10.0.0.1]",
            "nodePortAddresses[0]: invalid value \"10.0.0.1\": must be a CIDR",
        ),
        ("oomScoreAdj: 2000", "oomScoreAdj: invalid value \"2000\""),
        (
            "mode: ipvs\nfeatureGates: {KubeProxyIPVS: false}",
            "mode: invalid value \"ipvs\": ipvs mode needs the KubeProxyIPVS feature gate",
        ),
        (
            "conntrack: {maxPerCore: -1}",
            "conntrack.maxPerCore: invalid value \"-1\"",
        ),
        (
            "detectLocalMode: Magic",
            "detectLocalMode: invalid value \"Magic\"",
        ),
        (
            "detectLocalMode: BridgeInterface",
            "detectLocal.bridgeInterface: invalid value \"\": must be set",
        ),
        (
            "detectLocalMode: InterfaceNamePrefix",
            "detectLocal.interfaceNamePrefix: invalid value \"\"",
        ),
        (
            "logging: {format: xml}",
            "logging.format: invalid value \"xml\"",
        ),
        (
            "clientConnection: {burst: -3}",
            "clientConnection.burst: invalid value \"-3\"",
        ),
    ];
    for (text, want) in cases {
        let errors = errors_of(text);
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "{text:?}: got {errors:?}, want {want:?}"
        );
    }
    // IPVS settings are only checked in IPVS mode, as upstream.
    assert!(errors_of("ipvs: {scheduler: fastest}").is_empty());
    assert!(errors_of("nodePortAddresses: [primary]").is_empty());
    // Upstream 1.37: keywords mixed with each other and with CIDRs.
    assert!(errors_of("nodePortAddresses: [primary, localhost, 10.0.0.0/8, all]").is_empty());
    assert!(errors_of("mode: ipvs\nfeatureGates: {KubeProxyIPVS: true}").is_empty());
}

fn write_temp(text: &str) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file
}

fn flags(args: &[&str]) -> Flags {
    Flags::parse_from(args.iter().copied()).unwrap()
}

/// Leading zeros, as upstream's sloppy parsers read them (decimal), in a file.
#[test]
fn addresses_with_leading_zeros_start_as_upstream_reads_them() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    write!(
        file,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         bindAddress: 010.0.0.1\nhealthzBindAddress: 010.0.0.1:10256\nclusterCIDR: 010.244.0.0/16\n"
    )
    .unwrap();
    let path = file.path().display().to_string();
    let f = flags(&[&format!("--config={path}"), "--hostname-override=n"]);
    let s = resolve(&f, &NodeNameSources::default()).unwrap();
    assert_eq!(s.config.bind_address, "10.0.0.1");
    assert_eq!(s.config.healthz_bind_address, "10.0.0.1:10256");
    assert_eq!(s.config.cluster_cidr, "10.244.0.0/16");
}

#[test]
fn flags_alone_make_a_config() {
    let f = flags(&[
        "--proxy-mode=ipvs",
        "--cluster-cidr=10.244.0.0/16",
        "--masquerade-all",
        "--hostname-override=N1",
    ]);
    let s = resolve(&f, &NodeNameSources::default()).unwrap();
    assert_eq!(s.config.proxy_mode(), Some(ProxyMode::Ipvs));
    assert_eq!(s.config.cluster_cidr, "10.244.0.0/16");
    assert!(s.config.iptables.masquerade_all);
    assert_eq!(s.node_name, "n1");
    assert!(s.ignored_flags.is_empty());
    let bad = flags(&[
        "--ipvs-scheduler=nope",
        "--proxy-mode=ipvs",
        "--hostname-override=n",
    ]);
    let err = resolve(&bad, &NodeNameSources::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ipvs.scheduler: invalid value \"nope\""),
        "{err}"
    );
}

#[test]
fn config_file_wins_but_hostname_and_logging_flags_apply() {
    let file = write_temp(
        "mode: ipvs\nhostnameOverride: from-file\nclientConnection: {kubeconfig: /from/file}\n",
    );
    let path = file.path().to_str().unwrap().to_string();
    let f = flags(&[
        &format!("--config={path}"),
        "--proxy-mode=iptables",
        "--masquerade-all",
        "--hostname-override=From-Flag",
        "--v=3",
        "--kubeconfig=/from/flag",
        "--master=http://127.0.0.1:1",
    ]);
    let s = resolve(&f, &NodeNameSources::default()).unwrap();
    assert_eq!(s.config.proxy_mode(), Some(ProxyMode::Ipvs));
    assert!(!s.config.iptables.masquerade_all);
    assert_eq!(s.node_name, "from-flag");
    assert_eq!(s.config.logging.verbosity, 3);
    assert_eq!(s.kubeconfig.unwrap().to_str(), Some("/from/file"));
    assert_eq!(s.master.as_deref(), Some("http://127.0.0.1:1"));
    assert_eq!(s.ignored_flags, vec!["--proxy-mode", "--masquerade-all"]);
}

#[test]
fn node_name_falls_back_to_env_then_hostname() {
    let sources = NodeNameSources {
        env_node_name: Some("Env-Node".into()),
        hostname: Some("host".into()),
    };
    assert_eq!(
        resolve(&flags(&[]), &sources).unwrap().node_name,
        "env-node"
    );
    let sources = NodeNameSources {
        env_node_name: Some("  ".into()),
        hostname: Some("Host".into()),
    };
    assert_eq!(resolve(&flags(&[]), &sources).unwrap().node_name, "host");
    let err = resolve(&flags(&[]), &NodeNameSources::default()).unwrap_err();
    assert!(matches!(err, ConfigError::NoNodeName));
    let f = flags(&["--kubeconfig=/k"]);
    let s = resolve(
        &f,
        &NodeNameSources {
            hostname: Some("h".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(s.kubeconfig.unwrap().to_str(), Some("/k"));
}

#[test]
fn missing_file_is_a_clear_error() {
    let f = flags(&["--config=/no/such/file.conf"]);
    let err = resolve(&f, &NodeNameSources::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("failed to read config file /no/such/file.conf:"),
        "{err}"
    );
}
