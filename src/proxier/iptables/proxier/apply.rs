//! Applying a family's restore input, thinly: a failure counts and makes memory of our chains
//! no longer exact; a refused restore is blamed on the service its failing line belongs to.

use super::*;

impl<I: Iptables> IptablesMode<I> {
    pub(super) fn restore(&mut self, family: IpFamily, text: &str) -> Result<(), IptablesError> {
        if self.record_transactions {
            self.last_transactions.push((family, text.to_string()));
        }
        self.iptables.restore(family, text).inspect_err(|_| {
            // Some of its transactions may be in: the kernel's chains are read again next time.
            self.known.remove(&family);
            self.sync_failures += 1;
        })
    }
}

/// A service's rules, as far as telling whose a chain is goes.
pub(super) trait OwnsChains {
    fn owns_chain(&self, chain: &str) -> bool;
}

impl OwnsChains for ServiceRules {
    fn owns_chain(&self, chain: &str) -> bool {
        self.chains.contains_key(chain)
    }
}

impl OwnsChains for ProgrammedService {
    fn owns_chain(&self, chain: &str) -> bool {
        self.chain(chain).is_some()
    }
}

/// A failed restore of `input`, whose services' rules are `services`.
pub(super) fn restore_failure<S: OwnsChains>(
    error: IptablesError,
    input: &str,
    services: &BTreeMap<NamespacedName, S>,
) -> Failure {
    let line = match &error {
        IptablesError::Restore { line, .. } => *line,
        _ => None,
    };
    Failure::at_line(error, input, line, "rules", |text| {
        owner_of_line(text, services)
    })
}

/// The service a line of restore input belongs to: one whose chain it names, or the one its
/// comment names.
pub(super) fn owner_of_line<S: OwnsChains>(
    line: &str,
    services: &BTreeMap<NamespacedName, S>,
) -> Option<NamespacedName> {
    let words = tokenize(line).ok()?;
    let by_chain = words.iter().find_map(|word| {
        let chain = word.trim_start_matches(':');
        is_service_chain(chain)
            .then(|| {
                services
                    .iter()
                    .find(|(_, rules)| rules.owns_chain(chain))
                    .map(|(key, _)| key.clone())
            })
            .flatten()
    });
    by_chain.or_else(|| {
        let comment = words
            .iter()
            .position(|w| w == "--comment")
            .and_then(|i| words.get(i + 1))?;
        service_in_comment(comment).filter(|service| services.contains_key(service))
    })
}
