//! Distributions start kube-proxy with their own command lines; each must start the real
//! daemon unchanged (root; in network namespaces): it syncs and serves the seeded ClusterIP.
//! Paths and addresses are this test's; every flag and its spelling is the distribution's. Also
//! `--write-config-to`, `--init-only`, `--version`, `--help` and a refused flag, through the
//! binary.

mod support;

use support::cluster::{BIN, Cluster, Daemon, addr, seed};
use support::netns::{require_netns, tcp_request};
use support::{WAIT, eventually};

/// The command lines (`{kubeconfig}`, `{config}`, `{master}`, `{dir}` filled in per test).
const COMMAND_LINES: &[(&str, &str)] = &[
    (
        "kubeadm DaemonSet",
        "--config={config} --hostname-override=node-a",
    ),
    (
        "kubeadm 1.37, IPVS mode's gate on",
        "--config={config} --hostname-override=node-a --feature-gates=KubeProxyIPVS=true,NFTablesNetlink=true",
    ),
    (
        "a 1.33 manifest, a gate 1.37 dropped",
        "--config={config} --hostname-override=node-a --feature-gates=ServiceTrafficDistribution=true",
    ),
    (
        "EKS DaemonSet",
        "--v=2 --config={config} --hostname-override=node-a",
    ),
    (
        "kops (nodeup)",
        "--cluster-cidr=10.244.0.0/16 --conntrack-max-per-core=131072 --kubeconfig={kubeconfig} \
         --master={master} --oom-score-adj=-998 --v=2",
    ),
    (
        "GKE (kube-up)",
        "--master={master} --kubeconfig={kubeconfig} --cluster-cidr=10.244.0.0/16 \
         --oom-score-adj=-998 --v=2 --feature-gates=RotateKubeletServerCertificate=true \
         --iptables-sync-period=1m --iptables-min-sync-period=10s --ipvs-sync-period=1m \
         --ipvs-min-sync-period=10s --detect-local-mode=NodeCIDR",
    ),
    (
        "k3s (embedded)",
        "--cluster-cidr=10.244.0.0/16 --conntrack-max-per-core=0 \
         --conntrack-tcp-timeout-close-wait=0s --conntrack-tcp-timeout-established=0s \
         --healthz-bind-address=127.0.0.1 --hostname-override=node-a \
         --kubeconfig={kubeconfig} --proxy-mode=iptables --log_file={dir}/kube-proxy.log \
         --alsologtostderr=true",
    ),
    (
        "AKS",
        "--cluster-cidr=10.244.0.0/16 --conntrack-max-per-core=0 \
         --detect-local-mode=InterfaceNamePrefix --pod-interface-name-prefix=veth \
         --metrics-bind-address=0.0.0.0:10249 --proxy-mode=iptables --v=3 \
         --kubeconfig={kubeconfig} --hostname-override=node-a",
    ),
];

fn fill(template: &str, cluster: &Cluster, config: &std::path::Path) -> Vec<String> {
    let dir = cluster.dir.path();
    template
        .split_whitespace()
        .map(|word| {
            word.replace("{config}", &config.display().to_string())
                .replace(
                    "{kubeconfig}",
                    &dir.join("kubeconfig").display().to_string(),
                )
                .replace("{master}", &cluster.api.url())
                .replace("{dir}", &dir.display().to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributions_command_lines_start_the_daemon_unchanged() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let config = cluster.config("");
    for (distribution, template) in COMMAND_LINES {
        let args = fill(template, &cluster, &config);
        // kops and GKE leave the node name to the hostname; NODE_NAME stands for it here.
        let daemon = Daemon::spawn_args(&cluster.node, &args, &[("NODE_NAME", "node-a")]);
        // Some of these lines log at -v 0, where a sync is not logged: the traffic tells.
        daemon.wait_for("\"Caches are synced\"").await;
        assert!(
            eventually(WAIT, || tcp_request(&cluster.node, addr("10.96.0.10:80"))
                .is_ok())
            .await,
            "{distribution}: the ClusterIP answers"
        );
        assert_eq!(daemon.count("Failed to sync"), 0, "{distribution}");
        if distribution.starts_with("k3s") {
            assert!(daemon.count("Flag --alsologtostderr is accepted and ignored") > 0);
        }
        daemon.stop().await;
    }
}

fn binary(args: &[&str]) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run the binary")
}

#[test]
fn version_help_and_refused_flags() {
    let version = binary(&["--version"]);
    assert!(version.status.success());
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(text.starts_with("Kubernetes v1.37"), "{text}");
    let help = binary(&["--help"]);
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--conntrack-max-per-core"));
    let unknown = binary(&["--no-such-flag"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("Error: unknown flag: --no-such-flag")
    );
    let gate = binary(&[
        "--feature-gates=NoSuchGate=true",
        "--hostname-override=n",
        "--dry-run",
    ]);
    assert_ne!(gate.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&gate.stderr).contains("unrecognized feature gate: NoSuchGate")
    );
    // A gate 1.38 announces is accepted with a warning, not refused.
    let dir = tempfile::tempdir().unwrap();
    let written = dir.path().join("written.conf");
    let announced = binary(&[
        "--feature-gates=ManagedFieldsOptOut=true",
        "--hostname-override=n",
        &format!("--write-config-to={}", written.display()),
    ]);
    assert!(announced.status.success(), "{announced:?}");
    assert!(
        String::from_utf8_lossy(&announced.stderr)
            .contains("registered by upstream kube-proxy from 1.38"),
        "{announced:?}"
    );
    // Upstream 1.37 gates IPVS mode: turned off, ipvs mode refuses to start and says why.
    let ipvs_off = binary(&[
        "--proxy-mode=ipvs",
        "--feature-gates=KubeProxyIPVS=false",
        "--hostname-override=n",
        "--dry-run",
    ]);
    assert_eq!(ipvs_off.status.code(), Some(64), "an invalid configuration");
    let said = String::from_utf8_lossy(&ipvs_off.stderr);
    assert!(
        said.contains("mode") && said.contains("\"ipvs\"") && said.contains("KubeProxyIPVS"),
        "{said}"
    );
}

#[test]
fn write_config_to_writes_what_config_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("written.conf");
    let written = binary(&[
        &format!("--write-config-to={}", path.display()),
        "--cluster-cidr=10.244.0.0/16",
        "--proxy-mode=ipvs",
        "--ipvs-sync-period=45s",
        "--hostname-override=n",
    ]);
    assert!(written.status.success(), "{written:?}");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("mode: ipvs"), "{text}");
    assert!(text.contains("clusterCIDR: 10.244.0.0/16"), "{text}");
    assert!(text.contains("syncPeriod: 45s"), "{text}");
    // What was written is a configuration file this program (and upstream) reads strictly.
    let printed = binary(&[
        &format!("--config={}", path.display()),
        "--hostname-override=n",
        "print-config",
    ]);
    assert!(printed.status.success(), "{printed:?}");
    assert_eq!(String::from_utf8_lossy(&printed.stdout), text);
    assert!(
        !String::from_utf8_lossy(&printed.stderr).contains("lenient"),
        "no unknown field"
    );
}

#[test]
fn init_only_sets_up_the_node_and_exits() {
    require_netns();
    let ns = support::netns::Netns::new("init-only");
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name, BIN])
        .args([
            "--init-only",
            "--hostname-override=n",
            "--conntrack-tcp-timeout-close-wait=2h",
        ])
        .env_remove("RUST_LOG")
        .output()
        .expect("run");
    assert!(output.status.success(), "{output:?}");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(
        log.contains("System initialized and --init-only specified"),
        "{log}"
    );
    assert_eq!(
        ns.output(&[
            "sysctl",
            "-n",
            "net.netfilter.nf_conntrack_tcp_timeout_close_wait"
        ])
        .trim(),
        "7200"
    );
    assert_eq!(
        ns.output(&["sysctl", "-n", "net.ipv4.conf.all.route_localnet"])
            .trim(),
        "1"
    );
    assert!(
        !ns.output(&["iptables-nft-save"]).contains("KUBE-"),
        "--init-only programs no rule"
    );
}
