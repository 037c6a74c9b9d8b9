//! The README's first command, run as a newcomer runs it: scripts/sandbox.sh shows real traffic
//! through the daemon, follows a scale-down and a delete, and leaves nothing behind, also when
//! interrupted; without root it says so.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use support::netns::require_netns;

/// The runs share the machine's process table checks: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/sandbox.sh")
}

/// Namespaces and processes a run left behind (none, after cleanup).
fn leftovers(prefix: &str) -> Vec<String> {
    let namespaces = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let mut left: Vec<String> = String::from_utf8_lossy(&namespaces.stdout)
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect();
    for pattern in ["busybox httpd -f -p 8080", "test-apiserver --listen"] {
        let found = Command::new("pgrep")
            .args(["-f", pattern])
            .output()
            .unwrap();
        left.extend(
            String::from_utf8_lossy(&found.stdout)
                .lines()
                .map(|pid| format!("{pattern} ({pid})")),
        );
    }
    left
}

fn prefix_of(output: &str) -> String {
    let start = output.find("kprs-sandbox-").expect("names its namespaces");
    let rest = &output[start..];
    let pid: String = rest["kprs-sandbox-".len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    format!("kprs-sandbox-{pid}-")
}

#[test]
fn sandbox_shows_traffic_follows_changes_and_cleans_up() {
    let rules = sandbox_run(None);
    assert!(
        rules.contains("-j KUBE-SVC-XRY76EGRC3BSCIIJ"),
        "upstream's chain for demo/web:http: {rules}"
    );
}

#[test]
fn the_sandbox_runs_nftables_mode_too() {
    let rules = sandbox_run(Some("nftables"));
    assert!(
        rules.contains("chain service-") && rules.contains("demo/web/tcp/http"),
        "upstream's chains for demo/web:http: {rules}"
    );
}

/// Runs the sandbox (in `mode`, or its default), checks what every mode shows, and returns the
/// section listing what was programmed.
fn sandbox_run(mode: Option<&str>) -> String {
    require_netns();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut command = Command::new("bash");
    command.arg(script());
    if let Some(mode) = mode {
        command.env("SANDBOX_MODE", mode);
    }
    let output = command.output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    if let Some(mode) = mode {
        assert!(text.contains(&format!("Using {mode} Proxier")), "{text}");
    }
    let section = |from: &str, to: &str| -> String {
        let start = text
            .find(from)
            .unwrap_or_else(|| panic!("{from:?} in:\n{text}"));
        let end = text[start..].find(to).map_or(text.len(), |e| start + e);
        text[start..end].to_string()
    };
    let pods_in = |part: &str, target: &str| -> std::collections::BTreeSet<String> {
        part.lines()
            .filter(|l| l.contains(target) && l.contains("-> "))
            .map(|l| l.rsplit("-> ").next().unwrap().to_string())
            .collect()
    };
    let before = section("which pod answered", "== what kube-proxy-rs programmed");
    let cluster_ip = pods_in(&before, "10.96.0.10:80");
    let node_port = pods_in(&before, "192.168.100.2:30080");
    assert!(
        cluster_ip.len() >= 2 && cluster_ip.iter().all(|p| p.starts_with("pod-")),
        "connections spread over the pods: {before}"
    );
    assert!(
        !node_port.is_empty() && node_port.iter().all(|p| p.starts_with("pod-")),
        "{before}"
    );
    let rules = section("== what kube-proxy-rs programmed", "== scaling");
    let scaled = section("== scaling", "== deleting");
    assert_eq!(
        pods_in(&scaled, "10.96.0.10:80"),
        ["pod-1".to_string()].into()
    );
    assert_eq!(
        pods_in(&scaled, "192.168.100.2:30080"),
        ["pod-1".to_string()].into()
    );
    let deleted = section("== deleting", "== done");
    assert!(
        deleted.contains("(no answer)") && deleted.contains("rules left for demo/web: 0"),
        "{deleted}"
    );
    assert!(text.contains("== cleaned up"), "{text}");
    assert_eq!(leftovers(&prefix_of(&text)), Vec::<String>::new());
    rules
}

#[test]
fn ctrl_c_cleans_up_too() {
    require_netns();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut child = Command::new("bash")
        .arg(script())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("== kube-proxy-rs is serving") {
            break;
        }
    }
    assert!(seen.contains("is serving"), "{seen}");
    let prefix = prefix_of(&seen);
    assert!(!leftovers(&prefix).is_empty(), "it is running");
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    for line in lines {
        seen.push_str(&line.unwrap());
        seen.push('\n');
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{seen}");
    assert!(seen.contains("== cleaned up"), "{seen}");
    assert_eq!(leftovers(&prefix), Vec::<String>::new());
}

#[test]
fn without_root_it_says_so() {
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "bash"])
        .arg(script())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(errors.contains("must run as root"), "{errors}");
}
