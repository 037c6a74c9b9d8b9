//! The container image without Docker: the Dockerfile's steps are scripts in scripts/image/,
//! run here as the image build runs them, and the Dockerfile is checked to call exactly those.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn run(command: &mut Command) -> Output {
    let output = command.output().expect("runs");
    assert!(
        output.status.success(),
        "{command:?}: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

#[test]
fn dockerfile_builds_with_the_scripts_and_runs_the_installed_binary() {
    let dockerfile = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    let stages: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(stages.len(), 2, "a builder and a runtime stage");
    assert!(stages[0].contains("rust:") && stages[0].ends_with(" AS build"));
    assert!(stages[1].contains("debian:bookworm-slim"));
    for script in [
        "scripts/image/install-binary.sh",
        "scripts/image/install-runtime-packages.sh",
        "scripts/image/check-runtime.sh",
        "scripts/image/iptables-wrapper.sh",
        "scripts/image/install-iptables-wrapper.sh",
    ] {
        assert!(dockerfile.contains(script), "{script} is used");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(repo(script)).unwrap().permissions(),
        );
        assert!(mode & 0o111 != 0, "{script} is executable");
    }
    assert!(dockerfile.contains("cargo build --release --locked --bin kube-proxy-rs"));
    assert!(dockerfile.contains("ENTRYPOINT [\"/usr/local/bin/kube-proxy-rs\"]"));
    assert!(
        dockerfile.contains("privileged"),
        "says why it runs privileged"
    );
}

#[test]
fn install_binary_puts_kube_proxy_rs_and_the_kube_proxy_link_in_place() {
    let root = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        // Twice: a rebuild over an existing tree works too.
        run(Command::new(repo("scripts/image/install-binary.sh"))
            .arg(BIN)
            .arg(root.path()));
    }
    let bin = root.path().join("usr/local/bin");
    assert_eq!(
        std::fs::read_link(bin.join("kube-proxy")).unwrap(),
        Path::new("kube-proxy-rs")
    );
    // kubeadm's command line runs us through the link.
    let version = run(Command::new(bin.join("kube-proxy")).arg("--version"));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!(
            "Kubernetes v1.37.0 (kube-proxy-rs {})",
            env!("CARGO_PKG_VERSION")
        )
    );
    let help = run(Command::new(bin.join("kube-proxy")).arg("--help"));
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--config") && help.contains("--hostname-override"));
    let usage = Command::new(repo("scripts/image/install-binary.sh"))
        .output()
        .unwrap();
    assert_eq!(
        usage.status.code(),
        Some(64),
        "usage error without arguments"
    );
}

#[test]
fn runtime_packages_are_installed_idempotently_and_every_tool_is_there() {
    // .ci/run installs the same packages first, so this run finds them all and changes nothing;
    // in the image build it installs them.
    let installed = run(&mut Command::new(repo(
        "scripts/image/install-runtime-packages.sh",
    )));
    assert!(
        String::from_utf8_lossy(&installed.stdout).contains("already installed"),
        "{}",
        String::from_utf8_lossy(&installed.stdout)
    );
    let checked = run(&mut Command::new(repo("scripts/image/check-runtime.sh")));
    let report = String::from_utf8_lossy(&checked.stdout);
    for tool in [
        "iptables-legacy-restore",
        "ip6tables-nft-save",
        "nft",
        "ipset",
        "conntrack",
        "modprobe",
    ] {
        assert!(report.contains(&format!("ok      {tool}")), "{report}");
    }
    // It fails when a tool is missing: run it with an empty PATH.
    let missing = Command::new("/bin/sh")
        .arg(repo("scripts/image/check-runtime.sh"))
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert!(!missing.status.success());
}
