//! A stateful fake of iptables-restore/-save that enforces what the kernel would: a rule may only
//! jump to a chain that exists, `-D` must name an existing rule, `-X` only removes an empty,
//! unreferenced chain of ours, and an input with any error changes nothing.

use std::collections::BTreeMap;

use super::iptables::{Iptables, IptablesError, jump_target};
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

/// The built-in chains of each table.
fn builtin_chains(table: &str) -> &'static [&'static str] {
    match table {
        "filter" => &["INPUT", "FORWARD", "OUTPUT"],
        "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        "mangle" => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
        "raw" => &["PREROUTING", "OUTPUT"],
        _ => &[],
    }
}

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

/// Tables of both families, plus every restore input seen.
#[derive(Clone, Debug, Default)]
pub struct FakeIptables {
    tables: BTreeMap<(IpFamily, String), Table>,
    /// Every restore input, in order, with its family.
    pub restores: Vec<(IpFamily, String)>,
    /// When set, the next restore fails with this message (and changes nothing).
    pub fail_next_restore: Option<String>,
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

    fn apply(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError> {
        let mut working = self.tables.clone();
        let mut current: Option<String> = None;
        for (index, raw) in input.lines().enumerate() {
            let line = raw.trim();
            let fail = |reason: String| IptablesError::Restore {
                line: index + 1,
                reason: format!("{reason}: {line}"),
            };
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('*') {
                working
                    .entry((family, name.to_string()))
                    .or_insert_with(|| Table::with_builtins(name));
                current = Some(name.to_string());
                continue;
            }
            let Some(table_name) = current.clone() else {
                return Err(fail("no table selected".into()));
            };
            if line == "COMMIT" {
                current = None;
                continue;
            }
            let table = working
                .entry((family, table_name.clone()))
                .or_insert_with(|| Table::with_builtins(&table_name));
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
                line: input.lines().count(),
                reason: "missing COMMIT".into(),
            });
        }
        self.tables = working;
        Ok(())
    }
}

impl Iptables for FakeIptables {
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError> {
        self.restores.push((family, input.to_string()));
        if let Some(reason) = self.fail_next_restore.take() {
            return Err(IptablesError::Restore { line: 1, reason });
        }
        self.apply(family, input)
    }

    fn save(&mut self, family: IpFamily, table: Option<&str>) -> Result<String, IptablesError> {
        match table {
            Some(table) => Ok(self.dump(family, table)),
            None => Ok(["raw", "mangle", "nat", "filter"]
                .iter()
                .map(|t| self.dump(family, t))
                .collect()),
        }
    }

    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<bool, IptablesError> {
        Ok(self.table(family, table).chain(chain).is_some())
    }
}

/// Splits a restore line into words, honouring double quotes.
pub fn tokenize(line: &str) -> Result<Vec<String>, String> {
    let mut tokens = Vec::new();
    let mut current = String::new();
    let mut in_quotes = false;
    let mut has_token = false;
    for c in line.chars() {
        match c {
            '"' => {
                in_quotes = !in_quotes;
                has_token = true;
            }
            c if c.is_whitespace() && !in_quotes => {
                if has_token {
                    tokens.push(std::mem::take(&mut current));
                    has_token = false;
                }
            }
            c => {
                current.push(c);
                has_token = true;
            }
        }
    }
    if in_quotes {
        return Err("unterminated quote".into());
    }
    if has_token {
        tokens.push(current);
    }
    Ok(tokens)
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
