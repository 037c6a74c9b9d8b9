//! The command line, compatible with what kubeadm and users pass to upstream kube-proxy
//! (`--config=...`, `--hostname-override=$(NODE_NAME)`, `--v=2`, `-v 4`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// kube-proxy-rs: a drop-in replacement for Kubernetes' kube-proxy.
#[derive(Clone, Debug, Default, Parser)]
#[command(name = "kube-proxy-rs", version, about, long_about = None)]
pub struct Flags {
    /// The path to the configuration file (a KubeProxyConfiguration). When given, it wins over
    /// every other flag but --hostname-override, --master, --cleanup and the logging flags.
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,

    /// The name of this node, used to find its Node object and local endpoints.
    #[arg(long, value_name = "NAME", global = true)]
    pub hostname_override: Option<String>,

    /// Path to a kubeconfig file with the API server's address and credentials.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// The address of the API server (overrides the one in the kubeconfig).
    #[arg(long, value_name = "URL")]
    pub master: Option<String>,

    /// Which proxy mode to use: 'iptables' or 'ipvs' (empty means iptables).
    #[arg(long, value_name = "MODE", global = true)]
    pub proxy_mode: Option<String>,

    /// Remove every rule, chain, set, virtual server and link kube-proxy owns, then exit.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub cleanup: Option<bool>,

    /// The pod CIDR range(s) of the cluster (comma-separated dual-stack pair allowed); traffic from
    /// outside it to a ClusterIP is masqueraded.
    #[arg(long, value_name = "CIDRS")]
    pub cluster_cidr: Option<String>,

    /// The IP:port for the health server (default 0.0.0.0:10256).
    #[arg(long, value_name = "IP:PORT")]
    pub healthz_bind_address: Option<String>,

    /// The IP:port for the metrics server (default 127.0.0.1:10249).
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_bind_address: Option<String>,

    /// SNAT all traffic sent through service IPs.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub masquerade_all: Option<bool>,

    /// The IPVS scheduler (rr, wrr, lc, wlc, lblc, lblcr, sh, dh, sed, nq, mh); default rr.
    #[arg(long, value_name = "NAME")]
    pub ipvs_scheduler: Option<String>,

    /// Comma-separated CIDRs (or 'primary') whose local addresses accept NodePort traffic.
    #[arg(long, value_name = "CIDRS", value_delimiter = ',')]
    pub nodeport_addresses: Option<Vec<String>>,

    /// The IP address the servers bind to when their own flags do not say (default 0.0.0.0).
    #[arg(long, value_name = "IP")]
    pub bind_address: Option<String>,

    /// Log verbosity: 0 shows what operators need, 2 adds a line per sync, 4 and up debug detail.
    #[arg(short = 'v', long = "v", value_name = "LEVEL")]
    pub verbosity: Option<u32>,

    /// Log format: 'text' (klog-like lines) or 'json'.
    #[arg(long, value_name = "FORMAT")]
    pub logging_format: Option<String>,

    /// Program nothing: log the service ports and endpoints each sync would program (not upstream).
    #[arg(long)]
    pub dry_run: bool,

    /// In IPVS mode, when the node cannot run IPVS, use iptables instead of exiting (default true;
    /// `--ipvs-fallback=false` exits as upstream has since 1.26). Not an upstream flag.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub ipvs_fallback: Option<bool>,

    /// Exit when the --config file changes on disk (the ConfigMap edit reaching the pod), so the
    /// DaemonSet restarts us with it, as upstream does (default true). Not an upstream flag.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub exit_on_config_change: Option<bool>,

    /// Other commands (the daemon runs when none is given).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands beside the daemon.
#[derive(Clone, Debug, Subcommand)]
pub enum Command {
    /// Print the defaulted, validated configuration as YAML and exit.
    PrintConfig,
    /// Print what this node would program for Services, EndpointSlices (and its Node) read from
    /// YAML files, as `kubectl get svc,endpointslices,nodes -A -o yaml` prints them (`-` reads
    /// standard input). Needs no root and no cluster; uses --config, --proxy-mode and
    /// --hostname-override (--proxy-mode wins over the file's mode here).
    Render {
        /// YAML files: Lists or `---`-separated documents.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
}

impl Flags {
    /// The long names of the flags that were given but that a --config file overrides.
    pub fn overridden_by_config_file(&self) -> Vec<&'static str> {
        let mut given = Vec::new();
        let mut note = |set: bool, name| {
            if set {
                given.push(name)
            }
        };
        note(self.proxy_mode.is_some(), "--proxy-mode");
        note(self.cluster_cidr.is_some(), "--cluster-cidr");
        note(
            self.healthz_bind_address.is_some(),
            "--healthz-bind-address",
        );
        note(
            self.metrics_bind_address.is_some(),
            "--metrics-bind-address",
        );
        note(self.masquerade_all.is_some(), "--masquerade-all");
        note(self.ipvs_scheduler.is_some(), "--ipvs-scheduler");
        note(self.nodeport_addresses.is_some(), "--nodeport-addresses");
        note(self.bind_address.is_some(), "--bind-address");
        given
    }
}
