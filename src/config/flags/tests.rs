use super::*;
use crate::config::{NodeNameSources, ProxyMode, resolve};

fn parse(args: &[&str]) -> Flags {
    Flags::parse_from(args.iter().copied()).unwrap_or_else(|err| panic!("{args:?}: {err}"))
}

fn config_of(args: &[&str]) -> KubeProxyConfiguration {
    let sources = NodeNameSources {
        hostname: Some("node".into()),
        ..Default::default()
    };
    resolve(&parse(args), &sources)
        .unwrap_or_else(|err| panic!("{args:?}: {err}"))
        .config
}

#[test]
fn every_spelling_pflag_accepts() {
    for args in [
        &["--v=2"][..],
        &["--v", "2"],
        &["-v=2"],
        &["-v", "2"],
        &["-v2"],
    ] {
        assert_eq!(config_of(args).logging.verbosity, 2, "{args:?}");
    }
    // Underscores and dashes alike; values after = or as the next word.
    let config = config_of(&[
        "--cluster_cidr",
        "10.244.0.0/16",
        "--masquerade-all",
        "--iptables-sync-period=1m",
        "--conntrack-max-per-core=0",
        "--oom-score-adj=-998",
    ]);
    assert_eq!(config.cluster_cidr, "10.244.0.0/16");
    assert!(config.iptables.masquerade_all);
    assert_eq!(config.iptables.sync_period.0.as_secs(), 60);
    assert_eq!(config.conntrack.max_per_core, Some(0));
    assert_eq!(config.oom_score_adj, Some(-998));
    // Booleans take =false; a bare word after one is an argument, which is refused.
    assert!(
        !config_of(&["--masquerade-all=false"])
            .iptables
            .masquerade_all
    );
    assert_eq!(
        Flags::parse_from(["--masquerade-all", "false"]),
        Err(FlagError::Arguments(vec!["false".into()]))
    );
}

#[test]
fn errors_say_what_upstream_says() {
    assert_eq!(
        Flags::parse_from(["--no-such-flag"]),
        Err(FlagError::Unknown("no-such-flag".into()))
    );
    assert_eq!(
        Flags::parse_from(["-config=x"]),
        Err(FlagError::UnknownShorthand('c', "-config=x".into()))
    );
    assert_eq!(
        Flags::parse_from(["--cluster-cidr"]),
        Err(FlagError::NeedsValue("cluster-cidr".into()))
    );
    let err = Flags::parse_from(["--iptables-sync-period=300"]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid argument \"300\" for \"--iptables-sync-period\" flag:"),
        "{err}"
    );
    assert!(Flags::parse_from(["--feature-gates=A"]).is_err());
    assert!(Flags::parse_from(["--bind-address=nope"]).is_err());
}

#[test]
fn sync_periods_and_masquerade_go_to_the_asked_modes_section() {
    let ipvs = config_of(&[
        "--proxy-mode=ipvs",
        "--iptables-sync-period=1m",
        "--ipvs-sync-period=2m",
        "--ipvs-min-sync-period=10s",
    ]);
    assert_eq!(ipvs.ipvs.sync_period.0.as_secs(), 120);
    assert_eq!(ipvs.ipvs.min_sync_period.0.as_secs(), 10);
    assert_eq!(ipvs.iptables.sync_period.0.as_secs(), 30, "not for ipvs");
    let nft = config_of(&[
        "--proxy-mode=nftables",
        "--iptables-sync-period=1m",
        "--masquerade-all",
    ]);
    assert_eq!(nft.nftables.sync_period.0.as_secs(), 60);
    assert!(nft.nftables.masquerade_all);
    let iptables = config_of(&["--ipvs-sync-period=2m", "--iptables-min-sync-period=10s"]);
    assert_eq!(
        iptables.ipvs.sync_period.0.as_secs(),
        30,
        "not for iptables"
    );
    assert_eq!(iptables.iptables.min_sync_period.0.as_secs(), 10);
}

#[test]
fn deprecated_and_retired_flags_are_accepted_with_a_warning() {
    let flags = parse(&[
        "--healthz-port=0",
        "--metrics-bind-address=127.0.0.1",
        "--metrics-port=10300",
        "--alsologtostderr",
        "--log-file=/var/log/kube-proxy.log",
        "--logtostderr=false",
        "--log_dir",
        "/var/log",
        "--boot-id-file=/x",
    ]);
    let warnings = flags.warnings();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("--healthz-port has been deprecated"))
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("--alsologtostderr is accepted and ignored"))
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("--log-dir is accepted and ignored"))
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("--boot-id-file is accepted and has no effect"))
    );
    let config = config_of(&[
        "--healthz-port=0",
        "--metrics-bind-address=127.0.0.1",
        "--metrics-port=10300",
    ]);
    assert_eq!(
        config.healthz_bind_address, "",
        "port 0 turns the server off"
    );
    assert_eq!(config.metrics_bind_address, "127.0.0.1:10300");
    // An address with its own port keeps it.
    let config = config_of(&["--metrics-bind-address=0.0.0.0:10249", "--metrics-port=1"]);
    assert_eq!(config.metrics_bind_address, "0.0.0.0:10249");
}

#[test]
fn feature_gates_are_checked_whether_from_flags_or_file() {
    let config = config_of(&["--feature-gates=LoggingAlphaOptions=true,AllBeta=false"]);
    assert_eq!(config.feature_gates.get("LoggingAlphaOptions"), Some(&true));
    let err = resolve(
        &parse(&[
            "--feature-gates=DynamicKubeletConfig=false",
            "--hostname-override=n",
        ]),
        &NodeNameSources::default(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "unrecognized feature gate: DynamicKubeletConfig"
    );
}

#[test]
fn the_special_flags() {
    let flags = parse(&[
        "--version=raw",
        "--write-config-to=/tmp/x",
        "--init-only",
        "--cleanup",
    ]);
    assert_eq!(flags.version, VersionRequest::Raw);
    assert_eq!(flags.write_config_to(), Some(PathBuf::from("/tmp/x")));
    assert!(flags.init_only() && flags.cleanup());
    assert_eq!(parse(&["--version"]).version, VersionRequest::Print);
    assert_eq!(
        parse(&["--version=v1.35.2"]).version,
        VersionRequest::Set("v1.35.2".into())
    );
    assert_eq!(parse(&["--version=false"]).version, VersionRequest::None);
    assert!(parse(&["-h"]).help);
    // A subcommand's name stops the reading: what follows is the subcommand's.
    assert_eq!(parse(&["render", "--to", "-"]).subcommand_at, Some(0));
    let before = parse(&[
        "--dry-run",
        "--hostname-override",
        "render",
        "print-config",
        "--x",
    ]);
    assert_eq!(before.subcommand_at, Some(3));
    assert_eq!(parse(&["--dry-run"]).subcommand_at, None);
    assert_eq!(
        Flags::parse_from(["extra"]),
        Err(FlagError::Arguments(vec!["extra".into()]))
    );
    assert!(usage().contains("--conntrack-max-per-core int32"));
    assert!(
        !usage().contains("--healthz-port"),
        "deprecated flags are hidden"
    );
}

#[test]
fn hostname_override_is_trimmed_lower_cased_and_never_blank() {
    let sources = NodeNameSources::default();
    let s = resolve(&parse(&["--hostname-override= Node-A "]), &sources).unwrap();
    assert_eq!(s.node_name, "node-a");
    let err = resolve(&parse(&["--hostname-override=  "]), &sources).unwrap_err();
    assert_eq!(err.to_string(), "empty hostname-override is invalid");
    assert_eq!(
        config_of(&["--proxy-mode=ipvs"]).proxy_mode(),
        Some(ProxyMode::Ipvs)
    );
}

#[test]
fn the_offload_threshold_is_a_packet_count_and_off_by_default() {
    assert_eq!(parse(&[]).offload_packet_threshold, None);
    assert_eq!(
        parse(&["--offload-packet-threshold=20"]).offload_packet_threshold,
        Some(20)
    );
    assert_eq!(
        parse(&["--offload-packet-threshold", "0"]).offload_packet_threshold,
        Some(0)
    );
    for bad in ["-1", "twenty"] {
        let err = Flags::parse_from(["--offload-packet-threshold", bad]).unwrap_err();
        let said = err.to_string();
        assert!(
            said.contains("--offload-packet-threshold") && said.contains(bad),
            "{said}"
        );
    }
}
