//! A stateful fake of the iptables tools that enforces what the kernel would: a rule may only
//! jump to a chain that exists, `-D` must name an existing rule, `-X` only removes an empty,
//! unreferenced chain, and each `COMMIT` applies its section whole or not at all (a failed
//! section leaves the ones before it applied, as the real tools do). It records every read, so
//! tests can tell what a proxier looked at.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    ChainRules, Iptables, IptablesError, RuleFingerprint, RuleFingerprinter, Snapshot,
    builtin_chains, jump_target, tokenize,
};
use crate::model::IpFamily;

/// Targets that are not chains.
const BUILTIN_TARGETS: [&str; 9] = [
    "ACCEPT",
    "DROP",
    "REJECT",
    "RETURN",
    "MARK",
    "MASQUERADE",
    "DNAT",
    "SNAT",
    "LOG",
];

/// One table: chains in creation order, each with its rules (the text after `-A CHAIN`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    pub chains: Vec<(String, Vec<String>)>,
}

impl Table {
    fn with_builtins(name: &str) -> Self {
        Table {
            chains: builtin_chains(name)
                .iter()
                .map(|c| (c.to_string(), Vec::new()))
                .collect(),
        }
    }

    /// The rules of a chain, if it exists.
    pub fn chain(&self, name: &str) -> Option<&Vec<String>> {
        self.chains
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, rules)| rules)
    }

    fn chain_mut(&mut self, name: &str) -> Option<&mut Vec<String>> {
        self.chains
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, rules)| rules)
    }

    fn references(&self, target: &str) -> bool {
        self.chains
            .iter()
            .flat_map(|(_, rules)| rules)
            .any(|rule| jump_target(rule) == Some(target))
    }
}

/// A read a proxier made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Read {
    /// The chain names of a table.
    ChainNames { family: IpFamily, table: String },
    /// The rules of these chains of a table.
    ChainRules {
        family: IpFamily,
        table: String,
        chains: Vec<String>,
    },
    /// A whole table (what the legacy back end reads).
    Snapshot { family: IpFamily, table: String },
    /// The rules of these chains of a table, as fingerprints (what nft reads over netlink).
    ChainFingerprints {
        family: IpFamily,
        table: String,
        chains: Vec<String>,
    },
    /// Whether a chain exists.
    ChainExists {
        family: IpFamily,
        table: String,
        chain: String,
    },
}

/// Tables of both families, plus every restore input and read seen.
#[derive(Clone, Debug, Default)]
pub struct FakeIptables {
    tables: BTreeMap<(IpFamily, String), Table>,
    /// Every restore input, in order, with its family.
    pub restores: Vec<(IpFamily, String)>,
    /// Every read, in order.
    pub reads: Vec<Read>,
    /// When set, the next restore fails with this message (and changes nothing).
    pub fail_next_restore: Option<String>,
    /// What [`Iptables::chains_per_transaction`] answers (`None`: one transaction per table).
    pub chains_per_transaction: Option<usize>,
    /// Lines containing this text are refused, as a kernel lacking a feature refuses a rule.
    pub refuse_containing: Option<String>,
    /// What [`Iptables::reads_each_chain`] answers (nft's cost model when set).
    pub reads_each_chain: bool,
    /// When set, the fake cannot tell how it holds a rule (a back end that cannot be read):
    /// full syncs rewrite everything.
    pub cannot_read_rules: bool,
}

impl FakeIptables {
    /// A table as it is now (built-in chains only if never touched).
    pub fn table(&self, family: IpFamily, name: &str) -> Table {
        self.tables
            .get(&(family, name.to_string()))
            .cloned()
            .unwrap_or_else(|| Table::with_builtins(name))
    }

    /// Adds a rule as another program would (`iptables -A`), creating the chain if needed.
    pub fn add_foreign_rule(&mut self, family: IpFamily, table: &str, chain: &str, spec: &str) {
        let entry = self
            .tables
            .entry((family, table.to_string()))
            .or_insert_with(|| Table::with_builtins(table));
        if entry.chain(chain).is_none() {
            entry.chains.push((chain.to_string(), Vec::new()));
        }
        if let Some(rules) = entry.chain_mut(chain) {
            rules.push(spec.to_string());
        }
    }

    /// The rules of a chain, to change as another program would (`None` if it does not exist).
    pub fn rules_mut(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Option<&mut Vec<String>> {
        self.tables
            .get_mut(&(family, table.to_string()))?
            .chain_mut(chain)
    }

    /// Empties every table of a family, as `iptables -F; iptables -X` on each table would.
    pub fn flush_all(&mut self, family: IpFamily) {
        let names: Vec<String> = self
            .tables
            .keys()
            .filter(|(f, _)| *f == family)
            .map(|(_, t)| t.clone())
            .collect();
        for name in names {
            self.tables
                .insert((family, name.clone()), Table::with_builtins(&name));
        }
    }

    /// An iptables-save-like dump of one table: chain lines, then each chain's rules in order.
    pub fn dump(&self, family: IpFamily, name: &str) -> String {
        let table = self.table(family, name);
        let mut out = format!("*{name}\n");
        for (chain, _) in &table.chains {
            out.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for (chain, rules) in &table.chains {
            for rule in rules {
                out.push_str(&format!("-A {chain} {rule}\n"));
            }
        }
        out.push_str("COMMIT\n");
        out
    }

    /// Applies restore input section by section: each COMMIT keeps what its section did.
    fn apply(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError> {
        // The table being edited, and its name, between `*table` and `COMMIT`.
        let mut current: Option<(String, Table)> = None;
        for (index, raw) in input.lines().enumerate() {
            let line = raw.trim();
            let fail = |reason: String| IptablesError::Restore {
                reason: format!("fake iptables-restore: {reason}"),
                line: Some(index + 1),
                context: format!("{line:?}"),
            };
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if self
                .refuse_containing
                .as_deref()
                .is_some_and(|refused| line.contains(refused))
            {
                return Err(fail("the kernel refused this rule".into()));
            }
            if let Some(name) = line.strip_prefix('*') {
                current = Some((name.to_string(), self.table(family, name)));
                continue;
            }
            if line == "COMMIT" {
                let (name, table) = current
                    .take()
                    .ok_or_else(|| fail("no table selected".into()))?;
                self.tables.insert((family, name), table);
                continue;
            }
            let Some((table_name, table)) = current.as_mut() else {
                return Err(fail("no table selected".into()));
            };
            let table_name = table_name.clone();
            if let Some(decl) = line.strip_prefix(':') {
                let chain = decl
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let builtin = builtin_chains(&table_name).contains(&chain.as_str());
                match table.chain_mut(&chain) {
                    Some(rules) if !builtin => rules.clear(),
                    Some(_) => {}
                    None => table.chains.push((chain, Vec::new())),
                }
                continue;
            }
            let tokens = tokenize(line).map_err(&fail)?;
            let (op, chain, rest) = match tokens.as_slice() {
                [op, chain, rest @ ..] => (op.as_str(), chain.clone(), rest),
                _ => return Err(fail("incomplete command".into())),
            };
            match op {
                "-A" | "-I" => {
                    let (position, spec_tokens) = match (op, rest.first()) {
                        ("-I", Some(n)) if n.parse::<usize>().is_ok() => {
                            (n.parse::<usize>().unwrap_or(1), &rest[1..])
                        }
                        ("-I", _) => (1, rest),
                        _ => (usize::MAX, rest),
                    };
                    let spec = join(spec_tokens);
                    if let Some(target) = jump_target(&spec)
                        && !BUILTIN_TARGETS.contains(&target)
                        && table.chain(target).is_none()
                    {
                        return Err(fail(format!("jump to missing chain {target}")));
                    }
                    let rules = table
                        .chain_mut(&chain)
                        .ok_or_else(|| fail(format!("no chain {chain}")))?;
                    let at = position.saturating_sub(1).min(rules.len());
                    rules.insert(at, spec);
                }
                "-D" => {
                    let spec = join(rest);
                    let rules = table
                        .chain_mut(&chain)
                        .ok_or_else(|| fail(format!("no chain {chain}")))?;
                    let at = rules
                        .iter()
                        .position(|r| *r == spec)
                        .ok_or_else(|| fail("no such rule".into()))?;
                    rules.remove(at);
                }
                "-X" => {
                    if builtin_chains(&table_name).contains(&chain.as_str()) {
                        return Err(fail("cannot delete a built-in chain".into()));
                    }
                    match table.chain(&chain) {
                        None => return Err(fail(format!("no chain {chain}"))),
                        Some(rules) if !rules.is_empty() => {
                            return Err(fail("chain is not empty".into()));
                        }
                        Some(_) if table.references(&chain) => {
                            return Err(fail("chain is referenced".into()));
                        }
                        Some(_) => table.chains.retain(|(name, _)| *name != chain),
                    }
                }
                "-F" => table
                    .chain_mut(&chain)
                    .ok_or_else(|| fail(format!("no chain {chain}")))?
                    .clear(),
                "-N" => {
                    if table.chain(&chain).is_some() {
                        return Err(fail("chain exists".into()));
                    }
                    table.chains.push((chain, Vec::new()));
                }
                other => return Err(fail(format!("unknown command {other}"))),
            }
        }
        if current.is_some() {
            return Err(IptablesError::Restore {
                reason: "fake iptables-restore: missing COMMIT".into(),
                line: Some(input.lines().count()),
                context: String::new(),
            });
        }
        Ok(())
    }
}

impl Iptables for FakeIptables {
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError> {
        self.restores.push((family, input.to_string()));
        if let Some(reason) = self.fail_next_restore.take() {
            return Err(IptablesError::Restore {
                reason,
                line: None,
                context: String::new(),
            });
        }
        self.apply(family, input)
    }

    fn chain_names(
        &mut self,
        family: IpFamily,
        table: &str,
    ) -> Result<BTreeSet<String>, IptablesError> {
        self.reads.push(Read::ChainNames {
            family,
            table: table.to_string(),
        });
        Ok(self
            .table(family, table)
            .chains
            .into_iter()
            .map(|(name, _)| name)
            .collect())
    }

    fn chain_rules(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &[&str],
    ) -> Result<ChainRules, IptablesError> {
        self.reads.push(Read::ChainRules {
            family,
            table: table.to_string(),
            chains: chains.iter().map(|c| c.to_string()).collect(),
        });
        let current = self.table(family, table);
        Ok(chains
            .iter()
            .map(|chain| {
                let rules = current.chain(chain).cloned().unwrap_or_default();
                (chain.to_string(), rules)
            })
            .collect())
    }

    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<bool, IptablesError> {
        self.reads.push(Read::ChainExists {
            family,
            table: table.to_string(),
            chain: chain.to_string(),
        });
        Ok(self.table(family, table).chain(chain).is_some())
    }

    fn snapshot(
        &mut self,
        family: IpFamily,
        table: &str,
        rules_of: &[&str],
    ) -> Result<Option<Snapshot>, IptablesError> {
        self.reads.push(Read::Snapshot {
            family,
            table: table.to_string(),
        });
        let current = self.table(family, table);
        let rules = rules_of
            .iter()
            .map(|chain| {
                (
                    chain.to_string(),
                    current.chain(chain).cloned().unwrap_or_default(),
                )
            })
            .collect();
        let rule_counts = current
            .chains
            .into_iter()
            .map(|(chain, rules)| (chain, rules.len()))
            .collect();
        Ok(Some(Snapshot { rule_counts, rules }))
    }

    fn chain_fingerprints(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &[&str],
    ) -> Result<Option<Vec<Vec<RuleFingerprint>>>, IptablesError> {
        self.reads.push(Read::ChainFingerprints {
            family,
            table: table.to_string(),
            chains: chains.iter().map(|c| c.to_string()).collect(),
        });
        if self.cannot_read_rules {
            return Ok(None);
        }
        let held = self.table(family, table);
        Ok(Some(
            chains
                .iter()
                .map(|chain| {
                    let rules = held.chain(chain).map(Vec::as_slice).unwrap_or_default();
                    rules.iter().map(|r| text_fingerprint(r)).collect()
                })
                .collect(),
        ))
    }

    fn rule_fingerprinter(&self) -> Option<RuleFingerprinter> {
        // Held as the restore wrote it: its words, quoted where they need it.
        (!self.cannot_read_rules).then_some(|_, spec| {
            tokenize(spec)
                .ok()
                .map(|words| text_fingerprint(&join(&words)))
        })
    }

    fn reads_each_chain(&self) -> bool {
        self.reads_each_chain
    }

    fn chains_per_transaction(&self, _chains: usize, _reachable: bool) -> Option<usize> {
        self.chains_per_transaction
    }
}

/// A handle to a fake that a proxier owns boxed, for a test to read after the syncs: clones
/// share one fake.
#[derive(Clone, Debug, Default)]
pub struct SharedIptables(pub std::sync::Arc<std::sync::Mutex<FakeIptables>>);

impl SharedIptables {
    /// The fake, as the syncs left it.
    pub fn fake(&self) -> FakeIptables {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeIptables> {
        // A test that panicked while holding it has failed already.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Iptables for SharedIptables {
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError> {
        self.lock().restore(family, input)
    }

    fn chain_names(
        &mut self,
        family: IpFamily,
        table: &str,
    ) -> Result<BTreeSet<String>, IptablesError> {
        self.lock().chain_names(family, table)
    }

    fn chain_rules(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &[&str],
    ) -> Result<ChainRules, IptablesError> {
        self.lock().chain_rules(family, table, chains)
    }

    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<bool, IptablesError> {
        self.lock().chain_exists(family, table, chain)
    }

    fn snapshot(
        &mut self,
        family: IpFamily,
        table: &str,
        rules_of: &[&str],
    ) -> Result<Option<Snapshot>, IptablesError> {
        self.lock().snapshot(family, table, rules_of)
    }

    fn chain_fingerprints(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &[&str],
    ) -> Result<Option<Vec<Vec<RuleFingerprint>>>, IptablesError> {
        self.lock().chain_fingerprints(family, table, chains)
    }

    fn rule_fingerprinter(&self) -> Option<RuleFingerprinter> {
        self.lock().rule_fingerprinter()
    }

    fn reads_each_chain(&self) -> bool {
        self.lock().reads_each_chain()
    }

    fn chains_per_transaction(&self, chains: usize, reachable: bool) -> Option<usize> {
        self.lock().chains_per_transaction(chains, reachable)
    }
}

/// The fake's fingerprint of a rule: its text's.
fn text_fingerprint(text: &str) -> RuleFingerprint {
    use std::hash::{Hash, Hasher};
    let mut state = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut state);
    state.finish()
}

/// Joins words back, quoting those with spaces, as the renderer writes them.
fn join(tokens: &[String]) -> String {
    tokens
        .iter()
        .map(|t| {
            if t.contains(' ') || t.is_empty() {
                format!("\"{t}\"")
            } else {
                t.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: IpFamily = IpFamily::V4;

    #[test]
    fn enforces_kernel_rules_and_is_atomic() {
        let mut ipt = FakeIptables::default();
        ipt.restore(V4, "*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A KUBE-A -m comment --comment \"x y\" -j KUBE-B\nCOMMIT\n").unwrap();
        assert_eq!(
            ipt.table(V4, "nat").chain("KUBE-A").unwrap(),
            &vec!["-m comment --comment \"x y\" -j KUBE-B".to_string()]
        );
        let before = ipt.dump(V4, "nat");
        for bad in [
            "*nat\n-A KUBE-A -j KUBE-MISSING\nCOMMIT\n",
            "*nat\n-X KUBE-B\nCOMMIT\n",
            "*nat\n-D KUBE-A -j KUBE-C\nCOMMIT\n",
            "*nat\n-X PREROUTING\nCOMMIT\n",
            "*nat\n-A KUBE-A -j ACCEPT\n",
        ] {
            assert!(ipt.restore(V4, bad).is_err(), "{bad}");
            assert_eq!(ipt.dump(V4, "nat"), before, "nothing changed by {bad}");
        }
        ipt.restore(V4, "*nat\n-D KUBE-A -m comment --comment \"x y\" -j KUBE-B\n-X KUBE-B\n-I KUBE-A 1 -j ACCEPT\n-I KUBE-A 1 -j DROP\nCOMMIT\n").unwrap();
        assert_eq!(
            ipt.table(V4, "nat").chain("KUBE-A").unwrap(),
            &vec!["-j DROP".to_string(), "-j ACCEPT".to_string()]
        );
        assert!(ipt.table(V4, "nat").chain("KUBE-B").is_none());
        // Declaring a chain again flushes it; built-in chains keep their rules.
        ipt.add_foreign_rule(V4, "nat", "PREROUTING", "-j ACCEPT");
        ipt.restore(
            V4,
            "*nat\n:KUBE-A - [0:0]\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n",
        )
        .unwrap();
        assert!(ipt.table(V4, "nat").chain("KUBE-A").unwrap().is_empty());
        assert_eq!(ipt.table(V4, "nat").chain("PREROUTING").unwrap().len(), 1);
    }

    #[test]
    fn tokenizer_handles_quotes() {
        assert_eq!(
            tokenize("-A X -m comment --comment \"a b\" -j Y").unwrap(),
            vec!["-A", "X", "-m", "comment", "--comment", "a b", "-j", "Y"]
        );
        assert!(tokenize("\"open").is_err());
        assert_eq!(
            jump_target("-m comment --comment x -j KUBE-SVC-1"),
            Some("KUBE-SVC-1")
        );
    }
}
