//! An iptables rule in words, for `explain` in both iptables-based modes: its comment, and the
//! rest as iptables-save prints it.

use crate::sys::xtables::rules::{MatchOptions, RuleOptions, saved_form};

/// The rule's comment.
pub fn comment_of(rule: &RuleOptions) -> Option<&str> {
    rule.matches.iter().find_map(|m| match m {
        MatchOptions::Comment(text) => Some(text.as_str()),
        _ => None,
    })
}

/// The rule as iptables-save prints it without its comment and counter (told apart), with or
/// without its target: `! -s 10.244.0.0/16 -j KUBE-MARK-MASQ`.
pub fn rule_text(ipv6: bool, rule: &RuleOptions, with_target: bool) -> String {
    let mut bare = rule.clone();
    if !with_target {
        bare.target = None;
    }
    bare.matches
        .retain(|m| !matches!(m, MatchOptions::Comment(_) | MatchOptions::Nfacct(_)));
    saved_form(ipv6, &bare).unwrap_or_default()
}
