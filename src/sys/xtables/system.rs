//! The real iptables tools: restores fed on stdin, and reads of only our chains (over netlink
//! on the nft back end, from one `iptables-legacy-save` of the table on legacy).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::ReadRule;
use super::text::{declared_among, declared_chains, failed_line, input_context, rules_of};
use super::*;
use crate::sys::ipset::netlink::IpsetNetlink;

/// The tool for a family, back end and job: `iptables-nft-restore`, `ip6tables-legacy-save`, `iptables-nft`.
pub fn tool(family: IpFamily, backend: Backend, job: &str) -> String {
    let base = if family == IpFamily::V4 {
        "iptables"
    } else {
        "ip6tables"
    };
    if job.is_empty() {
        format!("{base}-{}", backend.as_str())
    } else {
        format!("{base}-{}-{job}", backend.as_str())
    }
}

/// One pass over a saved table (tens of megabytes at 10,000 services): `each(at, rule)` for
/// every `-A <chain> <rule>` line of a chain of `chains`, `at` its position there.
fn each_rule_of(saved: &str, chains: &[&str], mut each: impl FnMut(usize, &str)) {
    let index: BTreeMap<&str, usize> = chains.iter().enumerate().map(|(i, c)| (*c, i)).collect();
    for line in saved.lines() {
        let Some(rest) = line.strip_prefix("-A ") else {
            continue;
        };
        let (chain, rule) = rest.split_once(' ').unwrap_or((rest, ""));
        if let Some(&at) = index.get(chain) {
            each(at, rule.trim_end());
        }
    }
}

/// The real tools.
#[derive(Clone, Debug)]
pub struct SystemIptables {
    pub backend: Backend,
    /// Legacy tables as read since the last restore or [`Iptables::forget_reads`]: a sync reads
    /// each at most once (names, our chains' rules and the built-in chains all come from it).
    /// Shared, not copied: a table of 10,000 services is tens of megabytes of text.
    saved: BTreeMap<(IpFamily, String), Arc<str>>,
}

impl SystemIptables {
    /// Uses the given back end.
    pub fn new(backend: Backend) -> Self {
        SystemIptables {
            backend,
            saved: BTreeMap::new(),
        }
    }

    /// `iptables-legacy-save -t <table>`: the legacy kernel interface hands out a table only as
    /// a whole (iptables-legacy-restore reads it the same way on every sync).
    fn legacy_save(&mut self, family: IpFamily, table: &str) -> Result<Arc<str>, IptablesError> {
        let key = (family, table.to_string());
        if let Some(saved) = self.saved.get(&key) {
            return Ok(saved.clone());
        }
        let out = Tool::new(&tool(family, Backend::Legacy, "save"), &["-t", table])
            .limit(READ_LIMIT)
            .run()?;
        let saved: Arc<str> = String::from_utf8_lossy(&out).into();
        self.saved.insert(key, saved.clone());
        Ok(saved)
    }
}

impl Iptables for SystemIptables {
    fn forget_reads(&mut self) {
        self.saved.clear();
    }

    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError> {
        self.saved.clear();
        let command = tool(family, self.backend, "restore");
        Tool::new(&command, &["-w", "5", "--noflush", "--counters"])
            .input(input.as_bytes())
            .limit(restore_limit(input))
            .run()
            .map(drop)
            .map_err(|failure| {
                let line = failure.stderr().and_then(failed_line);
                IptablesError::Restore {
                    reason: failure.to_string(),
                    line,
                    context: line.map(|l| input_context(input, l)).unwrap_or_default(),
                }
            })
    }

    fn chain_names(
        &mut self,
        family: IpFamily,
        table: &str,
    ) -> Result<BTreeSet<String>, IptablesError> {
        match self.backend {
            Backend::Nft => {
                nf_tables::chain_names(family, table).map_err(|source| IptablesError::Netlink {
                    table: table.to_string(),
                    family: family.name(),
                    source,
                })
            }
            Backend::Legacy => Ok(declared_chains(&self.legacy_save(family, table)?)),
        }
    }

    fn existing_chains(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &[&str],
    ) -> Result<BTreeSet<String>, IptablesError> {
        match self.backend {
            Backend::Legacy => Ok(declared_among(&self.legacy_save(family, table)?, chains)),
            Backend::Nft => each_looked_up(self, family, table, chains),
        }
    }

    fn chain_rules(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &[&str],
    ) -> Result<ChainRules, IptablesError> {
        let mut rules = ChainRules::new();
        match self.backend {
            Backend::Legacy => {
                let saved = self.legacy_save(family, table)?;
                for chain in chains {
                    rules.insert(chain.to_string(), rules_of(&saved, chain));
                }
            }
            // `-S <chain>` makes iptables-nft fetch that chain alone.
            Backend::Nft => {
                for chain in chains {
                    let listed = Tool::new(
                        &tool(family, Backend::Nft, ""),
                        &["-w", "5", "-t", table, "-S", chain],
                    )
                    .limit(READ_LIMIT)
                    .run();
                    let text = match listed {
                        Ok(out) => String::from_utf8_lossy(&out).into_owned(),
                        Err(ToolError::Failed {
                            ended: Ended::Exited(1),
                            ..
                        }) => String::new(),
                        Err(err) => return Err(err.into()),
                    };
                    rules.insert(chain.to_string(), rules_of(&text, chain));
                }
            }
        }
        Ok(rules)
    }

    fn rule_options(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &[&str],
    ) -> Result<Vec<Vec<ReadRule>>, IptablesError> {
        if self.backend == Backend::Legacy {
            let saved = self.legacy_save(family, table)?;
            let mut read: Vec<Vec<ReadRule>> = chains.iter().map(|_| Vec::new()).collect();
            let ipv6 = family == IpFamily::V6;
            each_rule_of(&saved, chains, |at, rule| {
                read[at].push(rules::read_rule(ipv6, rule))
            });
            return Ok(read);
        }
        let read = nf_tables::chain_rules(family, table, chains).map_err(|source| {
            IptablesError::Netlink {
                table: table.to_string(),
                family: family.name(),
                source,
            }
        })?;
        let ipv6 = family == IpFamily::V6;
        let mut options: Vec<Vec<ReadRule>> = read
            .iter()
            .map(|chain| {
                chain
                    .iter()
                    .map(|rule| rules::rule_options(ipv6, rule))
                    .collect()
            })
            .collect();
        // Opened only when a rule matches a set (IPVS mode's rules).
        let mut ipset: Option<IpsetNetlink> = None;
        rules::name_sets(&mut options, |index| {
            let socket = match &mut ipset {
                Some(socket) => socket,
                None => ipset.insert(IpsetNetlink::open().map_err(|err| err.to_string())?),
            };
            match socket.name_of(index) {
                Ok(Some(name)) => Ok(name),
                Ok(None) => Err("the kernel holds no set there".into()),
                Err(err) => Err(err.to_string()),
            }
        });
        Ok(options)
    }

    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<bool, IptablesError> {
        if self.backend == Backend::Nft {
            return nf_tables::chain_exists(family, table, chain).map_err(|source| {
                IptablesError::Netlink {
                    table: table.to_string(),
                    family: family.name(),
                    source,
                }
            });
        }
        let probe = Tool::new(
            &tool(family, self.backend, ""),
            &["-w", "5", "-t", table, "-S", chain],
        )
        .limit(READ_LIMIT)
        .run();
        match probe {
            Ok(_) => Ok(true),
            // Exit status 1 is iptables' "no such chain"; others (2 usage, 4 lock) are errors.
            Err(ToolError::Failed {
                ended: Ended::Exited(1),
                ..
            }) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    fn snapshot(
        &mut self,
        family: IpFamily,
        table: &str,
        rules_of: &[&str],
    ) -> Result<Option<Snapshot>, IptablesError> {
        if self.backend == Backend::Nft {
            return Ok(None);
        }
        let saved = self.legacy_save(family, table)?;
        let mut rule_counts: BTreeMap<String, usize> = declared_chains(&saved)
            .into_iter()
            .map(|chain| (chain, 0))
            .collect();
        for line in saved.lines() {
            if let Some(chain) = line
                .strip_prefix("-A ")
                .and_then(|r| r.split_whitespace().next())
            {
                *rule_counts.entry(chain.to_string()).or_default() += 1;
            }
        }
        let rules = rules_of
            .iter()
            .map(|chain| (chain.to_string(), self::rules_of(&saved, chain)))
            .collect();
        Ok(Some(Snapshot { rule_counts, rules }))
    }

    fn chain_fingerprints(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &[&str],
    ) -> Result<Option<Vec<Vec<RuleFingerprint>>>, IptablesError> {
        if self.backend == Backend::Legacy {
            let saved = self.legacy_save(family, table)?;
            let mut held = vec![Vec::new(); chains.len()];
            each_rule_of(&saved, chains, |at, rule| {
                held[at].push(rules::text_fingerprint(rule))
            });
            return Ok(Some(held));
        }
        rules::chain_fingerprints(family, table, chains)
            .map(Some)
            .map_err(|source| IptablesError::Netlink {
                table: table.to_string(),
                family: family.name(),
                source,
            })
    }

    fn rule_fingerprinter(&self) -> Option<RuleFingerprinter> {
        match self.backend {
            Backend::Nft => Some(|family, spec| rules::expected_fingerprint(family, spec).ok()),
            Backend::Legacy => Some(|family, spec| {
                rules::save_text(family == IpFamily::V6, spec)
                    .ok()
                    .map(|text| rules::text_fingerprint(&text))
            }),
        }
    }

    fn reads_each_chain(&self) -> bool {
        self.backend == Backend::Nft
    }

    fn chains_per_transaction(&self, chains: usize, reachable: bool) -> Option<usize> {
        match self.backend {
            Backend::Nft => Some(nft_chains_per_transaction(chains, reachable)),
            Backend::Legacy => None,
        }
    }
}
