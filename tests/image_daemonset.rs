//! The container image as a node runs it. `scripts/build-image.sh` builds it from the Dockerfile
//! (once per run of this file), then each test starts it the way deploy/daemonset.yaml says a
//! kubelet would: privileged, in the node's network namespace (a namespace standing for the
//! host's), the DaemonSet's command line and environment, its hostPath mounts, the ConfigMap
//! (deploy/configmap.yaml, `mode` and `server` set by the test) and a service account token
//! mounted where kubelet puts them. Real traffic goes from a client namespace through a
//! ClusterIP and a NodePort to pods in their own namespaces. Root, podman and Debian's mirror
//! (for the base images) are needed; the build script installs its tools.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Instant;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec};
use support::cluster::{Cluster, Daemon, NODE_IP, addr, seed};
use support::netns::{Netns, http_get, require_netns, tcp_request};
use support::{WAIT, eventually};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Where the build script keeps the image store (its default unless `WORK` says otherwise).
fn work() -> PathBuf {
    std::env::var_os("WORK")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/kube-proxy-rs-image"))
}

/// podman with the build script's private store and settings.
fn podman() -> std::process::Command {
    let work = work();
    let mut command = std::process::Command::new("podman");
    command
        .env("CONTAINERS_CONF", work.join("containers.conf"))
        .env("CONTAINERS_STORAGE_CONF", work.join("storage.conf"))
        .env("CONTAINERS_REGISTRIES_CONF", work.join("registries.conf"));
    command
}

/// Builds the image once for every test in this file; the seconds it took.
fn built_image() -> u64 {
    static BUILT: OnceLock<u64> = OnceLock::new();
    *BUILT.get_or_init(|| {
        let started = Instant::now();
        let status = std::process::Command::new("bash")
            .arg(repo("scripts/build-image.sh"))
            .env("WORK", work())
            .status()
            .expect("run scripts/build-image.sh");
        assert!(status.success(), "scripts/build-image.sh: {status}");
        started.elapsed().as_secs()
    })
}

fn parse<T: serde::de::DeserializeOwned>(path: &str) -> T {
    let text = std::fs::read_to_string(repo(path)).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn pod_spec(daemonset: &DaemonSet) -> PodSpec {
    daemonset
        .spec
        .template
        .spec
        .clone()
        .expect("a pod template")
}

/// The ConfigMap's files as the DaemonSet mounts them: config.conf with `mode` set and
/// kubeconfig.conf pointing at the test API server (plain HTTP, so without the CA line).
fn write_config_map(dir: &Path, mode: &str, api_url: &str) {
    let config_map: ConfigMap = parse("deploy/configmap.yaml");
    for (key, text) in config_map.data.expect("data") {
        let text = match key.as_str() {
            "config.conf" => {
                assert!(text.contains("\nmode: iptables\n"), "{text}");
                text.replace("\nmode: iptables\n", &format!("\nmode: {mode}\n"))
            }
            "kubeconfig.conf" => text
                .lines()
                .filter(|l| !l.contains("certificate-authority:"))
                .map(|l| match l.trim_start().strip_prefix("server: ") {
                    Some(_) => format!("    server: {api_url}"),
                    None => l.to_string(),
                })
                .collect::<Vec<_>>()
                .join("\n"),
            other => panic!("a ConfigMap key the test does not know: {other}"),
        };
        std::fs::write(dir.join(key), text).unwrap();
    }
}

/// `$(NAME)` references expanded as kubelet expands them in command and args.
fn expand(text: &str, env: &[(String, String)]) -> String {
    env.iter().fold(text.to_string(), |text, (name, value)| {
        text.replace(&format!("$({name})"), value)
    })
}

/// The image running as the DaemonSet's pod on node-a, removed on drop.
struct Pod {
    name: String,
    daemon: Option<Daemon>,
    started: Instant,
    _files: tempfile::TempDir,
}

impl Pod {
    /// `podman run` of exactly what deploy/daemonset.yaml describes, in `node`.
    fn start(node: &Netns, mode: &str, api_url: &str) -> Pod {
        Pod::start_as(node, mode, api_url, true)
    }

    /// As [`Pod::start`]; `privileges: false` leaves the securityContext's privileges out.
    fn start_as(node: &Netns, mode: &str, api_url: &str, privileges: bool) -> Pod {
        built_image();
        let daemonset: DaemonSet = parse("deploy/daemonset.yaml");
        let spec = pod_spec(&daemonset);
        assert_eq!(
            spec.host_network,
            Some(true),
            "the node's network namespace"
        );
        let container: &Container = &spec.containers[0];
        let files = tempfile::tempdir().unwrap();
        let name = format!("{}-kube-proxy", node.name);
        let mut args: Vec<String> = ["run", "--rm", "--pull=never", "--name", &name]
            .map(String::from)
            .to_vec();
        args.push(format!("--network=ns:/run/netns/{}", node.name));
        let privileged = container
            .security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false);
        assert!(privileged, "the DaemonSet runs the container privileged");
        if privileges {
            args.push("--privileged".into());
        }
        let mut env = Vec::new();
        for var in container.env.iter().flatten() {
            let value = match (&var.value, &var.value_from) {
                (Some(value), _) => value.clone(),
                (None, Some(from)) => {
                    match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                        Some("spec.nodeName") => "node-a".to_string(),
                        other => panic!("{}: a field the test does not know: {other:?}", var.name),
                    }
                }
                (None, None) => String::new(),
            };
            args.push(format!("--env={}={value}", var.name));
            env.push((var.name.clone(), value));
        }
        for mount in container.volume_mounts.iter().flatten() {
            let volume = spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == mount.name)
                .unwrap_or_else(|| panic!("no volume {}", mount.name));
            let source = if let Some(host_path) = &volume.host_path {
                if host_path.type_.as_deref() == Some("FileOrCreate") {
                    // As kubelet does: an empty file where there is none.
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&host_path.path)
                        .unwrap();
                }
                if Path::new(&host_path.path).exists() {
                    PathBuf::from(&host_path.path)
                } else {
                    // No type: the runtime makes a missing source an empty directory (this host
                    // has no /lib/modules); an empty one of the test's stands for it.
                    assert_eq!(
                        host_path.type_.as_deref().unwrap_or(""),
                        "",
                        "{}",
                        host_path.path
                    );
                    let dir = files.path().join(&mount.name);
                    std::fs::create_dir(&dir).unwrap();
                    dir
                }
            } else if volume.config_map.is_some() {
                let dir = files.path().join(&mount.name);
                std::fs::create_dir(&dir).unwrap();
                write_config_map(&dir, mode, api_url);
                dir
            } else {
                panic!("volume {}: a kind the test does not know", mount.name);
            };
            let read_only = if mount.read_only == Some(true) {
                ":ro"
            } else {
                ""
            };
            args.push(format!(
                "--volume={}:{}{read_only}",
                source.display(),
                mount.mount_path
            ));
        }
        // The service account token kubelet projects (the kubeconfig's tokenFile).
        let account = files.path().join("serviceaccount");
        std::fs::create_dir(&account).unwrap();
        std::fs::write(account.join("token"), "a-test-token").unwrap();
        args.push(format!(
            "--volume={}:/var/run/secrets/kubernetes.io/serviceaccount:ro",
            account.display()
        ));
        let command = container.command.clone().expect("a command");
        args.push(format!("--entrypoint={}", command[0]));
        args.push(container.image.clone().expect("an image"));
        args.extend(command[1..].iter().map(|a| expand(a, &env)));
        args.extend(container.args.iter().flatten().map(|a| expand(a, &env)));
        let child = tokio::process::Command::from({
            let mut podman = podman();
            podman
                .args(&args)
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            podman
        })
        .kill_on_drop(true)
        .spawn()
        .expect("podman run");
        Pod {
            name,
            daemon: Some(Daemon::collecting(child)),
            started: Instant::now(),
            _files: files,
        }
    }

    /// Seconds from `podman run` until /healthz answers 200 (the first sync is in).
    async fn first_sync(&self, node: &Netns) -> f64 {
        let synced = eventually(WAIT, || {
            matches!(
                http_get(node, addr("127.0.0.1:10256"), "/healthz"),
                Ok((200, _))
            )
        })
        .await;
        assert!(synced, "never healthy:\n{}", self.log());
        self.started.elapsed().as_secs_f64()
    }

    /// `sh -c script` inside the running container (as `kubectl exec` would).
    fn exec(&self, script: &str) -> String {
        let output = podman()
            .args(["exec", &self.name, "sh", "-c", script])
            .output()
            .unwrap();
        assert!(output.status.success(), "{script}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("running")
    }

    fn log(&self) -> String {
        self.daemon().lines.lock().unwrap().join("\n")
    }

    /// SIGTERM through podman, as kubelet stops a pod: the daemon must exit 0.
    async fn stop(mut self) {
        if let Some(daemon) = self.daemon.take() {
            daemon.stop().await;
        }
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = podman()
            .args(["rm", "--force", "--time=0", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// ClusterIP from the node and NodePort from the client both reach the pods.
async fn traffic_flows(cluster: &Cluster, pod: &Pod) {
    let cluster_ip = eventually(WAIT, || {
        tcp_request(&cluster.node, addr("10.96.0.10:80")).is_ok()
    })
    .await;
    assert!(
        cluster_ip,
        "no answer through the ClusterIP:\n{}",
        pod.log()
    );
    let node_port = eventually(WAIT, || {
        tcp_request(&cluster.client, addr(&format!("{NODE_IP}:30080"))).is_ok()
    })
    .await;
    assert!(node_port, "no answer through the NodePort:\n{}", pod.log());
}

async fn run_mode(mode: &str, prepare: impl FnOnce(&Netns)) -> (Cluster, Pod) {
    require_netns();
    let cluster = Cluster::start().await;
    prepare(&cluster.node);
    seed(&cluster.api);
    let pod = Pod::start(&cluster.node, mode, &cluster.api.url());
    let seconds = pod.first_sync(&cluster.node).await;
    eprintln!(
        "image, mode {mode}: cold start to first sync {seconds:.1} s (image build {} s)",
        built_image()
    );
    traffic_flows(&cluster, &pod).await;
    (cluster, pod)
}

#[tokio::test(flavor = "multi_thread")]
async fn image_as_the_daemonset_runs_it_serves_iptables_mode_on_an_nft_node() {
    let (cluster, pod) = run_mode("iptables", |_| {}).await;
    pod.daemon().wait_for("\"Using iptables Proxier\"").await;
    pod.daemon()
        .wait_for("\"Using iptables back end\" backend=\"nft\"")
        .await;
    let rules = cluster.node.output(&["iptables-nft-save", "-t", "nat"]);
    assert!(rules.contains("-A KUBE-SERVICES"), "{rules}");
    assert!(
        !cluster
            .node
            .output(&["iptables-legacy-save", "-t", "nat"])
            .contains("KUBE-SERVICES")
    );
    let seen = pod.exec(
        "ip6tables -t nat -S >/dev/null; iptables-save -t nat; readlink /etc/alternatives/iptables",
    );
    assert!(seen.contains("-A KUBE-SERVICES"), "{seen}");
    assert!(seen.ends_with("/usr/sbin/iptables-nft\n"), "{seen}");
    pod.stop().await;
}

/// As upstream's image wrapper: a node whose kubelet wrote its rules with legacy iptables gets
/// legacy rules, chosen from kubelet's hint chain and said in the log.
#[tokio::test(flavor = "multi_thread")]
async fn image_uses_legacy_iptables_on_a_node_whose_kubelet_uses_legacy() {
    let (cluster, pod) = run_mode("iptables", |node| {
        node.exec(&[
            "iptables-legacy",
            "-t",
            "mangle",
            "-N",
            "KUBE-IPTABLES-HINT",
        ]);
    })
    .await;
    pod.daemon()
        .wait_for("\"Using iptables back end\" backend=\"legacy\"")
        .await;
    let rules = cluster.node.output(&["iptables-legacy-save", "-t", "nat"]);
    assert!(rules.contains("-A KUBE-SERVICES"), "{rules}");
    // The image's own iptables (its wrapper) follows the node too.
    let seen = pod.exec("iptables-save -t nat; readlink /etc/alternatives/iptables");
    assert!(seen.contains("-A KUBE-SERVICES"), "{seen}");
    assert!(seen.ends_with("/usr/sbin/iptables-legacy\n"), "{seen}");
    pod.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn image_serves_nftables_mode() {
    let (cluster, pod) = run_mode("nftables", |_| {}).await;
    pod.daemon().wait_for("\"Using nftables Proxier\"").await;
    let table = cluster
        .node
        .output(&["nft", "list", "chain", "ip", "kube-proxy", "services"]);
    assert!(table.contains("service-ips"), "{table}");
    pod.stop().await;
}

/// This kernel has no IPVS: mode ipvs falls back to iptables, for real, as upstream logs it.
#[tokio::test(flavor = "multi_thread")]
async fn image_falls_back_from_ipvs_to_iptables_on_a_kernel_without_ipvs() {
    let (_cluster, pod) = run_mode("ipvs", |_| {}).await;
    pod.daemon()
        .wait_for("\"Can't use ipvs proxier, trying iptables proxier\"")
        .await;
    pod.daemon().wait_for("\"Using iptables Proxier\"").await;
    pod.stop().await;
}

/// The control for the tests above: without the DaemonSet's privileges the same container
/// cannot program the node (read-only /proc/sys, no netfilter writes) and says so.
#[tokio::test(flavor = "multi_thread")]
async fn image_without_the_daemonsets_privileges_cannot_program_the_node() {
    require_netns();
    let cluster = Cluster::start().await;
    seed(&cluster.api);
    let pod = Pod::start_as(&cluster.node, "iptables", &cluster.api.url(), false);
    pod.daemon().wait_for("\"Failed to set sysctl\"").await;
    pod.daemon()
        .wait_for("\"Failed to sync proxy rules; retrying\"")
        .await;
    assert!(tcp_request(&cluster.node, addr("10.96.0.10:80")).is_err());
    assert!(matches!(
        http_get(&cluster.node, addr("127.0.0.1:10256"), "/healthz"),
        Ok((503, _))
    ));
}

#[test]
fn image_carries_every_tool_each_mode_needs() {
    built_image();
    let output = podman()
        .args([
            "run",
            "--rm",
            "--network=none",
            "--entrypoint=/usr/local/lib/kube-proxy-rs/check-runtime.sh",
            &image_reference(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    for tool in [
        "iptables-legacy-restore",
        "iptables-nft-restore",
        "nft",
        "ipset",
        "conntrack",
    ] {
        assert!(text.contains(&format!("ok      {tool}")), "{text}");
    }
    let inspect = podman()
        .args(["image", "inspect", "--format={{.Size}}", &image_reference()])
        .output()
        .unwrap();
    let bytes: f64 = String::from_utf8_lossy(&inspect.stdout)
        .trim()
        .parse()
        .unwrap();
    eprintln!("image size {:.1} MB", bytes / 1e6);
}

/// The DaemonSet's image, which the build script tags by default, at this crate's version.
fn image_reference() -> String {
    let daemonset: DaemonSet = parse("deploy/daemonset.yaml");
    let image = pod_spec(&daemonset).containers[0].image.clone().unwrap();
    assert_eq!(
        image,
        format!("kube-proxy-rs:{}", env!("CARGO_PKG_VERSION")),
        "the DaemonSet runs this version"
    );
    image
}
