//! How the kernel holds our iptables rules, so that a full sync can tell which of our chains
//! already hold exactly what it would write, and leave them alone.
//!
//! Both sides are reduced to one form per back end. On nft the kernel's rules are read back
//! over netlink, one chain at a time (`iptables-nft-save` needs minutes at 10,000 services,
//! then crashes), and decoded into their expressions; our rule text is translated into the
//! expressions iptables-nft 1.8.9 (Debian 12's, and our image's) writes for it (nft.rs). On
//! legacy the kernel hands out whole tables, read with `iptables-legacy-save`; our rule text is
//! rendered as that tool prints the rule the kernel holds (save.rs). Both read our text the
//! same way (parse.rs). Each rule becomes a keyed hash of its form, counters left out. A rule
//! whose text this module cannot read, or another iptables version's form, only makes a chain
//! look different: it is then rewritten, as before. Checked against the kernel by the
//! namespace tests (tests/iptables_rule_forms.rs, tests/iptables_adoption.rs).

mod decode;
mod nft;
mod parse;
mod save;
mod xt;

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::OnceLock;

use ahash::RandomState;

pub use decode::rule_options;
pub use nft::nft_expressions;
pub use parse::{AddressMatch, MatchOptions, RuleOptions, Target, Untranslatable, read_rule};
pub use save::{save_text, saved_form};

use crate::model::IpFamily;
use crate::sys::netlink::NetlinkError;
use crate::sys::nf_tables::expr::{Expr, rule_expressions};
use crate::sys::nf_tables::read::{chain_rules, rules_per_chain};

/// Names the sets of the set matches in `rules` that hold only the kernel's index of their set
/// (read from iptables-nft), each index asked of `name_of` once; a rule whose set cannot be
/// named becomes unreadable, saying why.
pub fn name_sets(
    rules: &mut [Vec<Result<RuleOptions, Untranslatable>>],
    mut name_of: impl FnMut(u16) -> Result<String, String>,
) {
    let mut named: std::collections::BTreeMap<u16, Result<String, String>> = Default::default();
    for rule in rules.iter_mut().flatten() {
        let Ok(options) = rule else { continue };
        let mut unnamed = None;
        for matched in &mut options.matches {
            if let MatchOptions::Set {
                name,
                index: Some(index),
                ..
            } = matched
                && name.is_empty()
            {
                match named.entry(*index).or_insert_with(|| name_of(*index)) {
                    Ok(found) => *name = found.clone(),
                    Err(why) => unnamed = Some(format!("the set of ipset index {index}: {why}")),
                }
            }
        }
        if let Some(why) = unnamed {
            *rule = Err(Untranslatable(why));
        }
    }
}

/// A rule reduced to a number: equal rules (in one process) have equal fingerprints.
pub type RuleFingerprint = u64;

/// The key of this process's fingerprints: random, so no one can craft rule text whose
/// fingerprint collides with another's (aHash: keyed, and fast on the half gigabyte of rules a
/// node of 10,000 services holds).
fn hasher() -> &'static RandomState {
    static KEY: OnceLock<RandomState> = OnceLock::new();
    KEY.get_or_init(RandomState::new)
}

/// The fingerprint of a rule's expressions.
pub fn fingerprint(expressions: &[Expr]) -> RuleFingerprint {
    let mut state = hasher().build_hasher();
    for expression in expressions {
        expression.hash(&mut state);
    }
    state.finish()
}

/// The fingerprint of a rule's text as iptables-legacy-save prints it (see [`save_text`]).
pub fn text_fingerprint(text: &str) -> RuleFingerprint {
    hasher().hash_one(text)
}

/// The fingerprint of the rule iptables-nft makes of `spec` (the text after `-A <chain>`).
pub fn expected_fingerprint(
    family: IpFamily,
    spec: &str,
) -> Result<RuleFingerprint, Untranslatable> {
    nft_expressions(family == IpFamily::V6, spec).map(|expressions| fingerprint(&expressions))
}

/// The fingerprints of the rules of each of `chains` (in that order) in iptables table
/// `table`, each chain's in order (a chain that does not exist holds none: the kernel does not
/// tell the two apart here).
pub fn chain_fingerprints(
    family: IpFamily,
    table: &str,
    chains: &[&str],
) -> Result<Vec<Vec<RuleFingerprint>>, NetlinkError> {
    rules_per_chain(family, table, chains, |rules: &mut Vec<_>, rule| {
        let mut state = hasher().build_hasher();
        rule_expressions(rule, |expression| expression.hash(&mut state));
        rules.push(state.finish());
    })
}

/// The expressions of each rule of `chain`, as the kernel holds them (for tests and diagnosis).
pub fn chain_expressions(
    family: IpFamily,
    table: &str,
    chain: &str,
) -> Result<Vec<Vec<Expr>>, NetlinkError> {
    let read = chain_rules(family, table, &[chain])?;
    Ok(read.into_iter().next().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_matches_are_named_from_their_index_or_say_why_not() {
        let unnamed = |index| MatchOptions::Set {
            name: String::new(),
            flags: "dst,dst".into(),
            inverted: false,
            index: Some(index),
        };
        let rule = |index| RuleOptions {
            matches: vec![unnamed(index)],
            ..RuleOptions::default()
        };
        let mut rules = vec![vec![Ok(rule(0)), Ok(rule(7)), Ok(rule(0))]];
        let mut asked = Vec::new();
        name_sets(&mut rules, |index| {
            asked.push(index);
            match index {
                0 => Ok("KUBE-CLUSTER-IP".into()),
                _ => Err("no set at that index".into()),
            }
        });
        assert_eq!(asked, [0, 7], "each index asked once");
        let named = |at: usize| match &rules[0][at] {
            Ok(RuleOptions { matches, .. }) => match &matches[0] {
                MatchOptions::Set { name, .. } => Ok(name.clone()),
                other => panic!("{other:?}"),
            },
            Err(why) => Err(why.to_string()),
        };
        assert_eq!(named(0), Ok("KUBE-CLUSTER-IP".into()));
        assert_eq!(named(2), Ok("KUBE-CLUSTER-IP".into()));
        assert_eq!(
            named(1),
            Err("the set of ipset index 7: no set at that index".into())
        );
    }
}
