//! What explain reads off one of our iptables rules: its comment and the Service it names, its
//! random share, its affinity check, where it DNATs, and its match in iptables' own words.

use crate::model::{Protocol, ServicePortName};
use std::net::SocketAddr;

use crate::proxier::xtables::text::rule_text;
use crate::sys::xtables::rules::{MatchOptions, RuleOptions, Target};

/// recent's `--rcheck`.
const RECENT_CHECK: u8 = 1;

pub(super) use crate::proxier::xtables::text::comment_of;

/// The `ns/svc:port` a comment starts with (`"default/web:http cluster IP"`).
pub(super) fn service_of(comment: &str, protocol: Protocol) -> Option<ServicePortName> {
    let first = comment.split_whitespace().next()?;
    first
        .contains(':')
        .then(|| ServicePortName::parse(first, protocol))
        .flatten()
}

/// The chance a `statistic --mode random` rule matches.
pub(super) fn probability(rule: &RuleOptions) -> Option<f64> {
    rule.matches.iter().find_map(|m| match m {
        MatchOptions::Statistic {
            probability,
            inverted: false,
        } => Some(f64::from(*probability) / 2_147_483_648.0),
        _ => None,
    })
}

/// A session affinity check (`recent --rcheck`): its list's name and how long it remembers.
pub(super) fn affinity_check(rule: &RuleOptions) -> Option<(&str, u32)> {
    rule.matches.iter().find_map(|m| match m {
        MatchOptions::Recent {
            name,
            check_set,
            seconds,
            ..
        } if check_set & RECENT_CHECK != 0 => Some((name.as_str(), *seconds)),
        _ => None,
    })
}

/// Where the rule DNATs a packet bound for `destination` (its port, when the rule names none).
pub(super) fn dnat_target(rule: &RuleOptions, destination: SocketAddr) -> Option<SocketAddr> {
    match rule.target {
        Some(Target::Dnat(Some((address, port)))) => {
            Some(SocketAddr::new(address, port.unwrap_or(destination.port())))
        }
        _ => None,
    }
}

/// The chain the rule jumps or goes to.
pub(super) fn jump_of(rule: &RuleOptions) -> Option<(i32, &str)> {
    match &rule.target {
        Some(Target::Jump(chain, code)) => Some((*code, chain.as_str())),
        _ => None,
    }
}

/// The rule's match as iptables prints it (no comment, no target): `! -s 10.244.0.0/16`.
pub(super) fn match_text(ipv6: bool, rule: &RuleOptions) -> String {
    rule_text(ipv6, rule, false)
}

/// Whether the rule matches only some packets.
pub(super) fn is_conditional(ipv6: bool, rule: &RuleOptions) -> bool {
    !match_text(ipv6, rule).is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::xtables::rules::read_rule;

    #[test]
    fn a_rule_is_read_for_what_explain_says() {
        let rule = read_rule(
            false,
            "-m comment --comment \"default/web:http cluster IP\" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-A",
        )
        .unwrap();
        assert_eq!(
            service_of(comment_of(&rule).unwrap(), Protocol::Tcp).map(|s| s.to_string()),
            Some("default/web:http".to_string())
        );
        assert_eq!(jump_of(&rule).map(|(_, c)| c), Some("KUBE-SVC-A"));
        assert_eq!(
            match_text(false, &rule),
            "-d 10.96.0.10/32 -p tcp -m tcp --dport 80"
        );
        let pick = read_rule(
            false,
            "-m statistic --mode random --probability 0.25000000000 -j KUBE-SEP-B",
        )
        .unwrap();
        assert_eq!(probability(&pick), Some(0.25));
        let sticky = read_rule(
            false,
            "-m recent --name KUBE-SEP-B --rcheck --seconds 10800 --reap -j KUBE-SEP-B",
        )
        .unwrap();
        assert_eq!(affinity_check(&sticky), Some(("KUBE-SEP-B", 10800)));
        let dnat = read_rule(
            false,
            "-p tcp -m tcp -j DNAT --to-destination 10.244.1.5:8080",
        )
        .unwrap();
        assert_eq!(
            dnat_target(&dnat, "10.96.0.10:80".parse().unwrap()),
            Some("10.244.1.5:8080".parse().unwrap())
        );
    }
}
