//! Upstream's flags (kube-proxy 1.35's own, the logging flags component-base registers,
//! cobra's, verflag's and cadvisor's), and the retired ones distributions still pass.

use super::*;

/// Upstream's own flags, logging flags and the rest, in upstream's order.
pub const UPSTREAM: &[Spec] = &[
    spec(
        "config",
        Kind::Text,
        Role::Control,
        "The path to the configuration file (a KubeProxyConfiguration).",
    ),
    spec(
        "write-config-to",
        Kind::Text,
        Role::Control,
        "If set, write the default configuration values to this file and exit.",
    ),
    spec(
        "cleanup",
        Kind::Bool,
        Role::Control,
        "If true cleanup iptables, ipvs and nftables rules and exit.",
    ),
    spec(
        "feature-gates",
        Kind::BoolMap,
        Role::Config(|c, v, _| {
            if let Value::BoolMap(pairs) = v {
                c.feature_gates.extend(pairs.iter().cloned());
            }
        }),
        "A set of key=value pairs that describe feature gates (ignored with --config).",
    ),
    spec(
        "kubeconfig",
        Kind::Text,
        Role::Config(|c, v, _| c.client_connection.kubeconfig = text(v)),
        "Path to kubeconfig file with authorization information (the master location can be overridden by --master).",
    ),
    spec(
        "master",
        Kind::Text,
        Role::Control,
        "The address of the Kubernetes API server (overrides any value in kubeconfig).",
    ),
    spec(
        "kube-api-content-type",
        Kind::Text,
        Role::Config(|c, v, _| c.client_connection.content_type = text(v)),
        "Content type of requests sent to apiserver.",
    ),
    spec(
        "kube-api-burst",
        Kind::Int32,
        Role::Config(|c, v, _| c.client_connection.burst = int(v)),
        "Burst to use while talking with kubernetes apiserver.",
    ),
    spec(
        "kube-api-qps",
        Kind::Float32,
        Role::Config(|c, v, _| {
            if let Value::Float(q) = v {
                c.client_connection.qps = *q;
            }
        }),
        "QPS to use while talking with kubernetes apiserver.",
    ),
    spec(
        "hostname-override",
        Kind::Text,
        Role::Control,
        "If non-empty, will be used as the name of the Node that kube-proxy is running on.",
    ),
    spec(
        "bind-address",
        Kind::Ip,
        Role::Config(|c, v, _| c.bind_address = text(v)),
        "Overrides kube-proxy's idea of what its node's primary IP is.",
    ),
    spec(
        "healthz-bind-address",
        Kind::IpPort,
        Role::Config(|c, v, _| c.healthz_bind_address = text(v)),
        "The IP address and port for the health check server to serve on (default 0.0.0.0:10256).",
    ),
    spec(
        "metrics-bind-address",
        Kind::IpPort,
        Role::Config(|c, v, _| c.metrics_bind_address = text(v)),
        "The IP address and port for the metrics server to serve on (default 127.0.0.1:10249).",
    ),
    spec(
        "bind-address-hard-fail",
        Kind::Bool,
        Role::Config(|c, v, _| c.bind_address_hard_fail = flag_bool(v)),
        "If true kube-proxy will treat failure to bind to a port as fatal and exit.",
    ),
    spec(
        "profiling",
        Kind::Bool,
        Role::Config(|c, v, _| c.enable_profiling = flag_bool(v)),
        "If true enables profiling via web interface on /debug/pprof handler (not served by kube-proxy-rs).",
    ),
    spec(
        "show-hidden-metrics-for-version",
        Kind::Text,
        Role::Config(|c, v, _| c.show_hidden_metrics_for_version = text(v)),
        "The previous version for which you want to show hidden metrics.",
    ),
    spec(
        "init-only",
        Kind::Bool,
        Role::Control,
        "If true, perform any initialization steps that must be done with full root privileges, and then exit.",
    ),
    spec(
        "proxy-mode",
        Kind::Text,
        Role::Config(|c, v, _| c.mode = text(v)),
        "Which proxy mode to use: 'iptables', 'ipvs' or 'nftables' (default iptables).",
    ),
    spec(
        "iptables-masquerade-bit",
        Kind::Int32,
        Role::Config(|c, v, _| c.iptables.masquerade_bit = Some(int(v))),
        "The bit of the fwmark space to mark packets requiring SNAT with (0-31).",
    ),
    spec(
        "masquerade-all",
        Kind::Bool,
        Role::Config(|c, v, mode| {
            if mode == "nftables" {
                c.nftables.masquerade_all = flag_bool(v);
            } else {
                c.iptables.masquerade_all = flag_bool(v);
            }
        }),
        "SNAT all traffic sent via Service cluster IPs.",
    ),
    spec(
        "iptables-localhost-nodeports",
        Kind::Bool,
        Role::Config(|c, v, _| c.iptables.localhost_node_ports = Some(flag_bool(v))),
        "If false, kube-proxy will disable the legacy behavior of allowing NodePort services to be accessed via localhost.",
    ),
    spec(
        "iptables-sync-period",
        Kind::Duration,
        Role::Config(|c, v, mode| match mode {
            "ipvs" => {}
            "nftables" => c.nftables.sync_period = duration(v),
            _ => c.iptables.sync_period = duration(v),
        }),
        "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed.",
    ),
    spec(
        "iptables-min-sync-period",
        Kind::Duration,
        Role::Config(|c, v, mode| match mode {
            "ipvs" => {}
            "nftables" => c.nftables.min_sync_period = duration(v),
            _ => c.iptables.min_sync_period = duration(v),
        }),
        "The minimum period between iptables rule resyncs.",
    ),
    spec(
        "ipvs-sync-period",
        Kind::Duration,
        Role::Config(|c, v, mode| {
            if mode == "ipvs" {
                c.ipvs.sync_period = duration(v);
            }
        }),
        "An interval indicating how frequently IPVS re-synchronizing and cleanup operations are performed.",
    ),
    spec(
        "ipvs-min-sync-period",
        Kind::Duration,
        Role::Config(|c, v, mode| {
            if mode == "ipvs" {
                c.ipvs.min_sync_period = duration(v);
            }
        }),
        "The minimum period between IPVS rule resyncs.",
    ),
    spec(
        "ipvs-scheduler",
        Kind::Text,
        Role::Config(|c, v, _| c.ipvs.scheduler = text(v)),
        "The ipvs scheduler type when proxy mode is ipvs.",
    ),
    spec(
        "ipvs-exclude-cidrs",
        Kind::List,
        Role::Config(|c, v, _| c.ipvs.exclude_cidrs.extend(list(v))),
        "A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules.",
    ),
    spec(
        "ipvs-strict-arp",
        Kind::Bool,
        Role::Config(|c, v, _| c.ipvs.strict_arp = flag_bool(v)),
        "Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2.",
    ),
    spec(
        "ipvs-tcp-timeout",
        Kind::Duration,
        Role::Config(|c, v, _| c.ipvs.tcp_timeout = duration(v)),
        "The timeout for idle IPVS TCP connections, 0 to leave as-is.",
    ),
    spec(
        "ipvs-tcpfin-timeout",
        Kind::Duration,
        Role::Config(|c, v, _| c.ipvs.tcp_fin_timeout = duration(v)),
        "The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is.",
    ),
    spec(
        "ipvs-udp-timeout",
        Kind::Duration,
        Role::Config(|c, v, _| c.ipvs.udp_timeout = duration(v)),
        "The timeout for IPVS UDP packets, 0 to leave as-is.",
    ),
    spec(
        "detect-local-mode",
        Kind::Text,
        Role::Config(|c, v, _| c.detect_local_mode = text(v)),
        "Mode to use to detect local traffic: ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix.",
    ),
    spec(
        "pod-bridge-interface",
        Kind::Text,
        Role::Config(|c, v, _| c.detect_local.bridge_interface = text(v)),
        "A bridge interface name (with --detect-local-mode=BridgeInterface).",
    ),
    spec(
        "pod-interface-name-prefix",
        Kind::Text,
        Role::Config(|c, v, _| c.detect_local.interface_name_prefix = text(v)),
        "An interface name prefix (with --detect-local-mode=InterfaceNamePrefix).",
    ),
    spec(
        "cluster-cidr",
        Kind::Text,
        Role::Config(|c, v, _| c.cluster_cidr = text(v)),
        "The CIDR range(s) of the pods in the cluster (comma-separated dual-stack pair allowed).",
    ),
    spec(
        "nodeport-addresses",
        Kind::List,
        Role::Config(|c, v, _| c.node_port_addresses.extend(list(v))),
        "A list of CIDR ranges that contain valid node IPs, and any of the keywords 'primary', 'localhost' and 'all', in any combination. Connections to NodePort services are only accepted on node IPs in one of them: 'primary' is the node's primary IP(s) according to the Node object, 'localhost' its loopback addresses, 'all' every address.",
    ),
    spec(
        "oom-score-adj",
        Kind::Int32,
        Role::Config(|c, v, _| c.oom_score_adj = Some(int(v))),
        "The oom-score-adj value for kube-proxy process (-1000 to 1000).",
    ),
    spec(
        "conntrack-max-per-core",
        Kind::Int32,
        Role::Config(|c, v, _| c.conntrack.max_per_core = Some(int(v))),
        "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).",
    ),
    spec(
        "conntrack-min",
        Kind::Int32,
        Role::Config(|c, v, _| c.conntrack.min = Some(int(v))),
        "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core.",
    ),
    spec(
        "conntrack-tcp-timeout-established",
        Kind::Duration,
        Role::Config(|c, v, _| c.conntrack.tcp_established_timeout = Some(duration(v))),
        "Idle timeout for established TCP connections (0 to leave as-is).",
    ),
    spec(
        "conntrack-tcp-timeout-close-wait",
        Kind::Duration,
        Role::Config(|c, v, _| c.conntrack.tcp_close_wait_timeout = Some(duration(v))),
        "NAT timeout for TCP connections in the CLOSE_WAIT state.",
    ),
    spec(
        "conntrack-tcp-be-liberal",
        Kind::Bool,
        Role::Config(|c, v, _| c.conntrack.tcp_be_liberal = flag_bool(v)),
        "Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1.",
    ),
    spec(
        "conntrack-udp-timeout",
        Kind::Duration,
        Role::Config(|c, v, _| c.conntrack.udp_timeout = duration(v)),
        "Idle timeout for UNREPLIED UDP connections (0 to leave as-is).",
    ),
    spec(
        "conntrack-udp-timeout-stream",
        Kind::Duration,
        Role::Config(|c, v, _| c.conntrack.udp_stream_timeout = duration(v)),
        "Idle timeout for ASSURED UDP connections (0 to leave as-is).",
    ),
    spec(
        "config-sync-period",
        Kind::Duration,
        Role::Config(|c, v, _| c.config_sync_period = duration(v)),
        "How often configuration from the apiserver is refreshed.",
    ),
    spec(
        "healthz-port",
        Kind::Int32,
        Role::Deprecated(
            "This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.",
        ),
        "The port to bind the health check server. Use 0 to disable.",
    ),
    spec(
        "metrics-port",
        Kind::Int32,
        Role::Deprecated(
            "This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.",
        ),
        "The port to bind the metrics server. Use 0 to disable.",
    ),
    // Logging (component-base), which apply over --config too.
    spec(
        "logging-format",
        Kind::Text,
        Role::Logging(|c, v, _| c.logging.format = text(v)),
        "Sets the log format. Permitted formats: \"json\", \"text\".",
    ),
    spec(
        "log-flush-frequency",
        Kind::Duration,
        Role::Logging(|c, v, _| {
            c.logging.flush_frequency = serde_json::Value::String(duration(v).to_string())
        }),
        "Maximum number of seconds between log flushes (lines are written at once here).",
    ),
    spec(
        "v",
        Kind::Level,
        Role::Logging(|c, v, _| {
            if let Value::Level(level) = v {
                c.logging.verbosity = *level;
            }
        }),
        "number for the log level verbosity",
    ),
    spec(
        "vmodule",
        Kind::Text,
        Role::Logging(|c, v, _| c.logging.vmodule = serde_json::Value::String(text(v))),
        "comma-separated list of pattern=N settings for file-filtered logging (only for text log format; read, not applied per file here).",
    ),
    spec(
        "log-text-split-stream",
        Kind::Bool,
        Role::NoEffect("every line goes to stderr"),
        "[Alpha] In text format, write error messages to stderr and info messages to stdout.",
    ),
    spec(
        "log-text-info-buffer-size",
        Kind::Quantity,
        Role::NoEffect("lines are not buffered"),
        "[Alpha] In text format with split output streams, the info messages can be buffered for a while.",
    ),
    spec(
        "log-json-split-stream",
        Kind::Bool,
        Role::NoEffect("every line goes to stderr"),
        "[Alpha] In JSON format, write error messages to stderr and info messages to stdout.",
    ),
    spec(
        "log-json-info-buffer-size",
        Kind::Quantity,
        Role::NoEffect("lines are not buffered"),
        "[Alpha] In JSON format with split output streams, the info messages can be buffered for a while.",
    ),
    // cadvisor's, which upstream's binary carries.
    spec(
        "boot-id-file",
        Kind::Text,
        Role::NoEffect("it only concerns cAdvisor"),
        "Comma-separated list of files to check for boot-id.",
    ),
    spec(
        "machine-id-file",
        Kind::Text,
        Role::NoEffect("it only concerns cAdvisor"),
        "Comma-separated list of files to check for machine-id.",
    ),
    spec(
        "version",
        Kind::Version,
        Role::Control,
        "--version, --version=raw prints version information and quits; --version=vX.Y.Z... sets the reported version",
    ),
    spec("help", Kind::Bool, Role::Control, "help for kube-proxy"),
];

/// Flags upstream no longer has (klog's, removed in 1.26, and older kube-proxy ones), which
/// distributions still pass: accepted with a warning instead of a crash loop (upstream 1.35
/// refuses them). `(name, takes a value unless given with =, why)`.
pub const RETIRED: &[(&str, Kind, &str)] = &[
    (
        "add-dir-header",
        Kind::Bool,
        "a klog flag, removed from kube-proxy in 1.26",
    ),
    (
        "alsologtostderr",
        Kind::Bool,
        "a klog flag, removed from kube-proxy in 1.26; logs go to stderr",
    ),
    (
        "log-backtrace-at",
        Kind::Text,
        "a klog flag, removed from kube-proxy in 1.26",
    ),
    (
        "log-dir",
        Kind::Text,
        "a klog flag, removed from kube-proxy in 1.26; logs go to stderr",
    ),
    (
        "log-file",
        Kind::Text,
        "a klog flag, removed from kube-proxy in 1.26; logs go to stderr",
    ),
    (
        "log-file-max-size",
        Kind::Text,
        "a klog flag, removed from kube-proxy in 1.26",
    ),
    (
        "logtostderr",
        Kind::Bool,
        "a klog flag, removed from kube-proxy in 1.26; logs go to stderr",
    ),
    (
        "one-output",
        Kind::Bool,
        "a klog flag, removed from kube-proxy in 1.26",
    ),
    (
        "skip-headers",
        Kind::Bool,
        "a klog flag, removed from kube-proxy in 1.26",
    ),
    (
        "skip-log-headers",
        Kind::Bool,
        "a klog flag, removed from kube-proxy in 1.26",
    ),
    (
        "stderrthreshold",
        Kind::Text,
        "a klog flag, removed from kube-proxy in 1.26",
    ),
    (
        "proxy-port-range",
        Kind::Text,
        "removed from kube-proxy in 1.31 (it had no effect)",
    ),
    (
        "udp-timeout",
        Kind::Duration,
        "removed from kube-proxy with the userspace proxier",
    ),
    (
        "resource-container",
        Kind::Text,
        "removed from kube-proxy in 1.16",
    ),
    (
        "conntrack-max",
        Kind::Int32,
        "removed from kube-proxy in 1.16; use --conntrack-max-per-core",
    ),
];
