//! Comparing what is programmed in two namespaces: iptables-save of our tables, normalised. Tests
//! only: the product itself never reads a whole table.
#![allow(dead_code)]

use std::collections::BTreeMap;

use kube_proxy_rs::sys::xtables::Backend;

use super::netns::Netns;

/// iptables-save of our tables with counters and comments dropped, and the shared chains' rules
/// sorted (their order carries no meaning except the KUBE-NODEPORTS jump, kept last).
pub fn normalized_save(ns: &Netns, backend: Backend, family: &str) -> String {
    let mut out = Vec::new();
    for table in ["filter", "nat", "mangle"] {
        let save = ns.output(&[&format!("{family}-{}-save", backend.as_str()), "-t", table]);
        let mut chains: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut declared = Vec::new();
        for line in save.lines() {
            if let Some(decl) = line.strip_prefix(':') {
                declared.push(decl.split_whitespace().next().unwrap_or("").to_string());
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let (chain, spec) = rule.split_once(' ').unwrap_or((rule, ""));
                chains
                    .entry(chain.to_string())
                    .or_default()
                    .push(spec.to_string());
            }
        }
        declared.sort();
        out.push(format!("*{table} {declared:?}"));
        for (chain, mut rules) in chains {
            if chain == "KUBE-SERVICES" && table == "nat" {
                let last = rules.pop();
                assert!(
                    last.as_deref()
                        .is_some_and(|r| r.contains("-j KUBE-NODEPORTS")),
                    "NodePort jump last"
                );
                rules.sort();
                rules.extend(last);
            } else if !chain.starts_with("KUBE-SVC-")
                && !chain.starts_with("KUBE-SVL-")
                && !chain.starts_with("KUBE-EXT-")
                && !chain.starts_with("KUBE-FW-")
            {
                rules.sort();
            }
            for rule in rules {
                out.push(format!("{table} {chain} {rule}"));
            }
        }
    }
    out.join("\n")
}
