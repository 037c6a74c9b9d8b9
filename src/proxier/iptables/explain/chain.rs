//! A chain as explain read it, its rules indexed by destination when it holds many: nat's
//! KUBE-SERVICES has a rule per service address and port, and a flow can meet only those of its
//! own destination and those that name none (`explain --all` walks it once per service port).

use std::collections::HashMap;

use crate::sys::xtables::ReadRule;

/// From how many rules a chain is indexed.
const INDEXED_FROM: usize = 64;

/// The positions of the rules of each exact destination address, and of the rules that name
/// none, each in order.
type DestinationIndex = (HashMap<Vec<u8>, Vec<usize>>, Vec<usize>);

pub(super) struct ReadChain {
    pub rules: Vec<ReadRule>,
    index: Option<DestinationIndex>,
}

impl ReadChain {
    pub fn new(rules: Vec<ReadRule>) -> ReadChain {
        let index = (rules.len() >= INDEXED_FROM).then(|| {
            let mut exact: HashMap<Vec<u8>, Vec<usize>> = HashMap::new();
            let mut others = Vec::new();
            for (at, rule) in rules.iter().enumerate() {
                let destination = rule.as_ref().ok().and_then(|r| r.destination.as_ref());
                match destination {
                    Some(d) if !d.inverted && d.mask.iter().all(|b| *b == 0xff) => {
                        exact.entry(d.address.clone()).or_default().push(at);
                    }
                    _ => others.push(at),
                }
            }
            (exact, others)
        });
        ReadChain { rules, index }
    }

    /// The positions of the rules a packet to `destination` (its address's bytes) may match,
    /// in the chain's order.
    pub fn candidates(&self, destination: &[u8]) -> Vec<usize> {
        let Some((exact, others)) = &self.index else {
            return (0..self.rules.len()).collect();
        };
        let mut all: Vec<usize> = exact
            .get(destination)
            .into_iter()
            .flatten()
            .chain(others)
            .copied()
            .collect();
        all.sort_unstable();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::xtables::rules::read_rule;

    #[test]
    fn a_flow_meets_its_destination_rules_and_those_of_none_in_order() {
        let mut rules: Vec<ReadRule> = (0..100)
            .map(|i| read_rule(false, &format!("-d 10.96.0.{i}/32 -p tcp -j KUBE-SVC-{i}")))
            .collect();
        rules.insert(50, read_rule(false, "-d 10.96.0.0/16 -j KUBE-MARK-MASQ"));
        rules.push(read_rule(
            false,
            "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS",
        ));
        let chain = ReadChain::new(rules);
        assert_eq!(chain.candidates(&[10, 96, 0, 7]), [7, 50, 101]);
        assert_eq!(chain.candidates(&[10, 96, 0, 70]), [50, 71, 101]);
        assert_eq!(chain.candidates(&[10, 97, 0, 1]), [50, 101]);
        let small = ReadChain::new(vec![read_rule(false, "-j KUBE-SVC-A")]);
        assert_eq!(small.candidates(&[10, 96, 0, 7]), [0]);
    }
}
