//! Tests that need a kernel with IPVS and dummy links re-run themselves inside the VM
//! (tests/vm/run-in-vm.sh boots Debian's kernel); the helpers they share.
#![allow(dead_code)]

use std::process::Command;

use kube_proxy_rs::model::Protocol;
use kube_proxy_rs::sys::ipvs::{RealServer, VirtualServer};

use super::netns::{Netns, require_netns};

/// On the host: runs test `name` in the VM, asserts it passed there, and returns its output.
pub fn run_in_vm(name: &str) -> String {
    require_netns();
    let exe = std::env::current_exe().expect("test binary");
    let harness = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vm/run-in-vm.sh");
    let output = Command::new(harness)
        .env("KPRS_IN_VM", "1")
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .output()
        .expect("run the VM harness");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && log.contains("1 passed"),
        "{name} failed in the VM:\n{log}"
    );
    log
}

/// In the VM: true. On the host: runs `name` in the VM, asserts it passed there, and returns false.
pub fn in_vm(name: &str) -> bool {
    if std::env::var_os("KPRS_IN_VM").is_some() {
        return true;
    }
    run_in_vm(name);
    false
}

pub fn vs(address: &str, protocol: Protocol, port: u16, scheduler: &str) -> VirtualServer {
    VirtualServer {
        address: address.parse().unwrap(),
        protocol,
        port,
        scheduler: scheduler.into(),
        flags: 0,
        timeout: 0,
    }
}

pub fn rs(address: &str, port: u16, weight: u32) -> RealServer {
    RealServer::new(address.parse().unwrap(), port, weight)
}

pub fn text(ns: &Netns, args: &[&str]) -> String {
    ns.output(args)
}

/// What a namespace's IPVS mode state is, sorted: virtual/real servers (`ipvsadm -Sn`), kube-ipvs0's
/// addresses and the sets' entries.
pub fn ipvs_state(ns: &Netns) -> Vec<String> {
    let mut lines: Vec<String> = text(ns, &["ipvsadm", "-Sn"])
        .lines()
        .chain(text(ns, &["ip", "-o", "addr", "show", "dev", "kube-ipvs0"]).lines())
        .map(|line| {
            // `ip -o addr` lines start with the link index, which differs between namespaces.
            line.split_once(": ")
                .map_or(line, |(_, rest)| rest)
                .to_string()
        })
        // Hash sets get a random initval each.
        .chain(
            text(ns, &["ipset", "save"])
                .lines()
                .map(|line| line.split(" initval ").next().unwrap_or(line).to_string()),
        )
        .filter(|line| !line.contains("valid_lft"))
        .collect();
    lines.sort();
    lines
}
