//! The binary as kubeadm's DaemonSet starts it, against the test API server: it logs what it
//! would program, follows changes, and refuses bad configs with one clear line.

mod support;

use std::process::Stdio;
use std::sync::{Arc, Mutex};

use support::{Cluster, WAIT, eventually, seed_web, service, slice};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");

struct Daemon {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    /// Where its metrics server listens, when the test chose it (flags, not a config file).
    metrics: Option<String>,
}

impl Daemon {
    fn spawn(args: &[&str]) -> Daemon {
        // The host's namespace: servers on free loopback ports, so parallel tests do not fight
        // over 10256 (flags count only without --config; config files get them from the test).
        let metrics = (!args.iter().any(|a| a.starts_with("--config")))
            .then(|| format!("127.0.0.1:{}", free_port()));
        let servers: Vec<String> = match &metrics {
            None => vec![],
            Some(metrics) => vec![
                format!("--healthz-bind-address=127.0.0.1:{}", free_port()),
                format!("--metrics-bind-address={metrics}"),
            ],
        };
        // --dry-run: these tests run in the host's network namespace, which must never be programmed.
        let mut child = Command::new(BIN)
            .arg("--dry-run")
            .args(args)
            .args(&servers)
            .env_remove("RUST_LOG")
            .env_remove("NODE_NAME")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn daemon");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let stderr = child.stderr.take().expect("stderr");
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                sink.lock().unwrap().push(line);
            }
        });
        Daemon {
            child,
            lines,
            metrics,
        }
    }

    /// Its /metrics page.
    fn metrics(&self) -> String {
        use std::io::{Read, Write};
        let address = self
            .metrics
            .as_deref()
            .expect("a metrics address of the test's");
        let mut stream = std::net::TcpStream::connect(address).expect("metrics server");
        write!(stream, "GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").unwrap();
        let mut page = String::new();
        stream.read_to_string(&mut page).unwrap();
        page
    }

    fn count(&self, needle: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    async fn wait_for(&self, needle: &str) {
        let found = eventually(WAIT, || self.count(needle) > 0).await;
        assert!(
            found,
            "no log line with {needle:?}; got:\n{}",
            self.lines.lock().unwrap().join("\n")
        );
    }

    fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_the_cluster_and_stops_on_sigterm() {
    let cluster = Cluster::start().await;
    let s = &cluster.server;
    seed_web(s);
    let config = cluster.write_file(
        "config.conf",
        &loopback_servers(&include_str!("testdata/kubeadm-config.conf").replace(
            "/var/lib/kube-proxy/kubeconfig.conf",
            cluster.kubeconfig.to_str().unwrap(),
        )),
    );
    let config_arg = format!("--config={}", config.display());
    let d = Daemon::spawn(&[&config_arg, "--hostname-override=node-a", "--v=2"]);
    d.wait_for("\"Using iptables proxy\"").await;
    // The mode was left to its default: the coming change of default is named.
    d.wait_for("The default becomes nftables in Kubernetes 1.40")
        .await;
    d.wait_for("\"Caches are synced\"").await;
    d.wait_for("endpoints=\"10.244.1.5:8080,10.244.1.6:8080\"")
        .await;
    d.wait_for("\"Synced proxy rules\"").await;
    assert!(
        d.log().contains("service_port=\"default/web:p80\""),
        "{}",
        d.log()
    );

    // A scale-up is followed; only the changed service is logged again.
    s.apply(service("default", "other", "10.96.0.11", &[81]))
        .unwrap();
    s.apply(slice(
        "default",
        "web",
        "1",
        80,
        &["10.244.1.5", "10.244.1.6", "10.244.1.7"],
    ))
    .unwrap();
    d.wait_for("endpoints=\"10.244.1.5:8080,10.244.1.6:8080,10.244.1.7:8080\"")
        .await;
    d.wait_for("service_port=\"default/other:p81\"").await;
    // Deletion is followed too.
    s.delete(test_apiserver::Resource::Services, "default", "other")
        .unwrap();
    d.wait_for("\"Service removed; would delete its rules\" service=\"default/other\"")
        .await;

    let pid = d.child.id().expect("pid") as i32;
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    let mut child = d.child;
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("exits after SIGTERM")
        .expect("wait");
    assert!(status.success(), "{status:?}");
    assert!(
        d.lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("rules stay in place"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_warn_and_api_outage_keeps_running() {
    let cluster = Cluster::start().await;
    cluster
        .server
        .apply(service("default", "web", "10.96.0.10", &[80]))
        .unwrap();
    let config = cluster.write_file(
        "config.conf",
        &loopback_servers(
            "kind: KubeProxyConfiguration\nmode: ipvs\nmysteryField: 1\n\
             healthzBindAddress: 127.0.0.1:0\nmetricsBindAddress: 127.0.0.1:0\n",
        ),
    );
    let config_arg = format!("--config={}", config.display());
    let kubeconfig_arg = format!("--kubeconfig={}", cluster.kubeconfig.display());
    let d = Daemon::spawn(&[
        &config_arg,
        &kubeconfig_arg,
        "--hostname-override=node-a",
        "--proxy-mode=iptables",
    ]);
    d.wait_for("fields=\"mysteryField\"").await;
    d.wait_for("\"Flags ignored because --config was given\" flags=\"--proxy-mode\"")
        .await;
    d.wait_for("\"Caches are synced\"").await;
    d.wait_for("service_port=\"default/web:p80\"").await;
    cluster.server.stop().await;
    d.wait_for("Failed to ").await;
    cluster.server.resume().await.expect("resume");
    cluster
        .server
        .apply(service("default", "back", "10.96.0.12", &[80]))
        .unwrap();
    d.wait_for("service_port=\"default/back:p80\"").await;
    assert_eq!(
        d.count("service_port=\"default/web:p80\""),
        1,
        "web was never forgotten and re-added:\n{}",
        d.log()
    );
}

/// While the API server is away the log says so without claiming recovery at every retry, and
/// once it is back the changes made meanwhile arrive after one short backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_is_logged_honestly_and_recovered_from_quickly() {
    let cluster = Cluster::start().await;
    seed_web(&cluster.server);
    let kubeconfig_arg = format!("--kubeconfig={}", cluster.kubeconfig.display());
    let d = Daemon::spawn(&[&kubeconfig_arg, "--hostname-override=node-a"]);
    d.wait_for("\"Caches are synced\"").await;
    cluster.server.stop().await;
    // Several retries of every watch while it is away (the backoff caps at 4 s).
    tokio::time::sleep(std::time::Duration::from_secs(9)).await;
    let failures = d.count("Failed to list") + d.count("Failed to watch");
    assert!(failures >= 3, "{}", d.log());
    assert_eq!(
        d.count("is working again"),
        0,
        "no watch works while the server is away:\n{}",
        d.log()
    );
    cluster
        .server
        .apply(service("default", "meanwhile", "10.96.0.13", &[80]))
        .unwrap();
    cluster.server.resume().await.expect("resume");
    let back = std::time::Instant::now();
    d.wait_for("service_port=\"default/meanwhile:p80\"").await;
    eprintln!(
        "reflected {:?} after the API server returned",
        back.elapsed()
    );
    let after_outage = d.count("is working again");
    assert!(after_outage <= 3, "once per watch:\n{}", d.log());

    // An API server that answers, but fails every list: the watches must relist (their history
    // is gone), and each attempt fails. No attempt is taken for a recovery. (500: the client
    // itself retries 503s.)
    cluster.server.fail_next_lists(15, 500);
    cluster.server.compact();
    cluster.server.close_watches();
    let lists_failed = d.count("Failed to list");
    assert!(
        eventually(WAIT, || d.count("Failed to list") >= lists_failed + 6).await,
        "{}",
        d.log()
    );
    assert_eq!(
        d.count("is working again"),
        after_outage,
        "a relist that has not succeeded is not a recovery:\n{}",
        d.log()
    );
    cluster
        .server
        .apply(service("default", "after-errors", "10.96.0.14", &[80]))
        .unwrap();
    d.wait_for("service_port=\"default/after-errors:p80\"")
        .await;
    assert!(
        d.count("is working again") <= after_outage + 3,
        "{}",
        d.log()
    );
    assert!(
        d.lines.lock().unwrap().iter().all(|l| l.len() < 2000),
        "no line dumps a whole response"
    );
}

/// An API server that does not serve ServiceCIDRs (before 1.33), or whose RBAC forbids them:
/// nftables mode programs every Service, says once what is missing and what to do, retries
/// slowly, shows the refusal in a metric, and takes the ServiceCIDRs when they come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_resource_is_logged_once_shown_in_a_metric_and_taken_when_served() {
    let cases = [
        (
            404,
            "The API server does not serve ServiceCIDRs",
            "not_found",
        ),
        (
            403,
            "grant get, list and watch on servicecidrs.networking.k8s.io",
            "forbidden",
        ),
    ];
    for (code, said, reason) in cases {
        let cluster = Cluster::start().await;
        seed_web(&cluster.server);
        cluster
            .server
            .refuse(test_apiserver::Resource::ServiceCidrs, Some(code));
        let kubeconfig_arg = format!("--kubeconfig={}", cluster.kubeconfig.display());
        let d = Daemon::spawn(&[
            &kubeconfig_arg,
            "--hostname-override=node-a",
            "--proxy-mode=nftables",
        ]);
        d.wait_for("service_port=\"default/web:p80\"").await;
        // Said once the refusal has lasted 10 s, then not again for minutes.
        d.wait_for(said).await;
        tokio::time::sleep(std::time::Duration::from_secs(8)).await;
        assert_eq!(d.count(said), 1, "{code}: said once:\n{}", d.log());
        let refused =
            format!("kubeproxy_rs_watch_refused{{kind=\"ServiceCIDR\",reason=\"{reason}\"}} 1");
        assert!(d.metrics().contains(&refused), "{code}: {refused}");
        cluster
            .server
            .refuse(test_apiserver::Resource::ServiceCidrs, None);
        d.wait_for("Watch of ServiceCIDR is working again").await;
        let ended =
            format!("kubeproxy_rs_watch_refused{{kind=\"ServiceCIDR\",reason=\"{reason}\"}} 0");
        assert!(d.metrics().contains(&ended), "{code}: {ended}");
        assert_eq!(d.count(said), 1, "{code}:\n{}", d.log());
    }
}

/// A ConfigMap edit reaching the pod (the --config file changes) makes the daemon log it and exit,
/// so the DaemonSet restarts it with the new configuration; --exit-on-config-change=false keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exits_when_the_config_file_changes() {
    let cluster = Cluster::start().await;
    seed_web(&cluster.server);
    let text = loopback_servers(&format!(
        "kind: KubeProxyConfiguration\nclientConnection:\n  kubeconfig: {}\n\
         healthzBindAddress: 127.0.0.1:0\nmetricsBindAddress: 127.0.0.1:0\n",
        cluster.kubeconfig.display()
    ));
    let config = cluster.write_file("config.conf", &text);
    let config_arg = format!("--config={}", config.display());
    let staying = Daemon::spawn(&[
        &config_arg,
        "--hostname-override=node-a",
        "--exit-on-config-change=false",
        "--v=2",
    ]);
    let d = Daemon::spawn(&[&config_arg, "--hostname-override=node-a", "--v=2"]);
    d.wait_for("\"Synced proxy rules\"").await;
    staying.wait_for("\"Synced proxy rules\"").await;
    std::fs::write(&config, format!("{text}mode: ipvs\n")).unwrap();
    d.wait_for("\"Config file changed, exiting so that it is read again")
        .await;
    let mut child = d.child;
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("exits")
        .unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "a restart is wanted: non-zero, as upstream"
    );
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let mut staying_child = staying.child;
    assert!(
        staying_child.try_wait().unwrap().is_none(),
        "the flag keeps it running"
    );
}

/// A loopback port nobody listens on right now (the config validation, as upstream's, wants a
/// real port, not 0).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The config's server addresses replaced by free loopback ones (tests run in the host's namespace).
fn loopback_servers(config: &str) -> String {
    config
        .replace(
            "healthzBindAddress: \"\"",
            &format!("healthzBindAddress: 127.0.0.1:{}", free_port()),
        )
        .replace(
            "metricsBindAddress: \"\"",
            &format!("metricsBindAddress: 127.0.0.1:{}", free_port()),
        )
        .replacen("127.0.0.1:0", &format!("127.0.0.1:{}", free_port()), 1)
        .replacen("127.0.0.1:0", &format!("127.0.0.1:{}", free_port()), 1)
}

/// Runs the binary to completion with a config file; returns (exit code, stderr).
async fn run_with_config(text: &str, extra: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(&path, text).unwrap();
    let config_arg = format!("--config={}", path.display());
    let mut args = vec!["--dry-run", config_arg.as_str(), "--hostname-override=n"];
    args.extend_from_slice(extra);
    let output = tokio::time::timeout(WAIT, Command::new(BIN).args(&args).output())
        .await
        .unwrap()
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn bad_configs_exit_with_one_clear_line() {
    let cases = [
        ("mode: userspace\n", "mode: invalid value \"userspace\""),
        (
            "iptables: {syncPeriod: 3x}\n",
            "field iptables.syncPeriod: invalid duration \"3x\"",
        ),
        (
            "iptables: {masqueradeBit: 99}\n",
            "iptables.masqueradeBit: invalid value \"99\"",
        ),
        (
            "clusterCIDR: 10.0.0.0/40\n",
            "clusterCIDR: invalid value \"10.0.0.0/40\"",
        ),
        (
            "mode: ipvs\nipvs: {scheduler: best}\n",
            "ipvs.scheduler: invalid value \"best\"",
        ),
        ("kind: Pod\n", "kind \"Pod\" is not supported"),
        ("mode: [oops\n", "is not valid YAML"),
    ];
    for (text, want) in cases {
        let (code, stderr) = run_with_config(text, &[]).await;
        assert_eq!(code, 64, "{text}: {stderr}");
        assert_eq!(
            stderr.lines().count(),
            1,
            "{text}: one line, got {stderr:?}"
        );
        assert!(
            stderr.contains(want),
            "{text}: want {want:?}, got {stderr:?}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let output = Command::new(BIN)
        .args(["--config=/does/not/exist"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("failed to read config file /does/not/exist")
    );
}

#[tokio::test]
async fn print_config_shows_defaults_and_a_missing_kubeconfig_exits_1() {
    let (code, stderr) = run_with_config(
        "mode: nftables\nclientConnection: {kubeconfig: /nonexistent}\n",
        &[],
    )
    .await;
    assert_eq!(code, 1);
    assert!(stderr.contains("/nonexistent"), "{stderr}");
    let output = Command::new(BIN)
        .args(["--hostname-override=n", "print-config"])
        .output()
        .await
        .unwrap();
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("syncPeriod: 30s"), "{text}");
    assert!(
        text.contains("metricsBindAddress: 127.0.0.1:10249"),
        "{text}"
    );
    let version = Command::new(BIN).arg("--version").output().await.unwrap();
    assert!(
        String::from_utf8_lossy(&version.stdout).starts_with("Kubernetes v1.37.0 (kube-proxy-rs ")
    );
}
