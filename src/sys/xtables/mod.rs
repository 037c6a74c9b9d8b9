//! iptables through its tools: one `iptables-restore --noflush --counters` per sync and family,
//! fed on stdin, never a process per rule; reads of only what is ours (chain names, and the rules
//! of a few named chains), never a whole table. The back end (legacy or nft) is chosen as
//! kube-proxy's image does, from marker chains that kubelet and kube-proxy leave.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

pub use self::rules::RuleFingerprint;

/// Tells the fingerprint of a rule's text as a back end holds it (see
/// [`Iptables::rule_fingerprinter`]).
pub type RuleFingerprinter = fn(IpFamily, &str) -> Option<RuleFingerprint>;
use super::host::process::{Ended, Tool, ToolError};
use super::netlink::NetlinkError;
use super::nf_tables::read as nf_tables;

pub mod fake;
pub mod rules;
use crate::model::IpFamily;

/// A restore may take a minute, plus a second per 100,000 bytes of input (a cold start at
/// 10,000 services, 470,000 lines, takes about 20 s), before it is killed: a restore that another
/// writer keeps retrying (iptables-nft-restore retries when the ruleset changed under it) must
/// end, be logged and be retried, not hold the sync loop forever.
fn restore_limit(input: &str) -> Duration {
    Duration::from_secs(60 + (input.len() / 100_000) as u64)
}
/// Reading chains, or a chain's rules, may take this long.
const READ_LIMIT: Duration = Duration::from_secs(120);
/// How many chains one nf_tables transaction of a large restore holds (see
/// [`Iptables::chains_per_transaction`]).
///
/// iptables-nft-restore keeps the chains a transaction names in a sorted linked list, so its own
/// cost per transaction grows with the square of its size; and at each commit the kernel checks
/// every chain that a built-in chain reaches. Into chains nothing reaches yet (a cold start),
/// small transactions win: 1,000 chains. Measured at 10,000 services x 10 endpoints (120,000
/// chains): 20 s, against 607 s in one transaction. Where traffic already reaches them (a
/// restart, a forced full sync), each commit re-checks them all, so fewer and larger
/// transactions win; balancing the two costs gives about 25 x sqrt(chains): at 120,000 chains,
/// 8,000 per transaction took 49 s where 1,000 took 95 s.
pub fn nft_chains_per_transaction(chains: usize, reachable: bool) -> usize {
    if !reachable {
        return 1000;
    }
    let balanced = 25.0 * (chains as f64).sqrt();
    (balanced as usize).clamp(1000, 20_000)
}
/// The built-in chains of each table.
pub fn builtin_chains(table: &str) -> &'static [&'static str] {
    match table {
        "filter" => &["INPUT", "FORWARD", "OUTPUT"],
        "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        "mangle" => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
        "raw" => &["PREROUTING", "OUTPUT"],
        _ => &[],
    }
}

/// Why an iptables operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    /// iptables-restore refused the input; `line` is the input line it named, if it did.
    #[error("{reason}{}", at_line(*.line, .context))]
    Restore {
        reason: String,
        line: Option<usize>,
        /// The failing line and its neighbours, numbered.
        context: String,
    },
    /// A tool that reads (or probes) failed.
    #[error(transparent)]
    Tool(#[from] ToolError),
    /// A thread reading the kernel's state ended in a panic.
    #[error("a thread reading the kernel's iptables state panicked")]
    ReaderPanicked,
    /// No thread could be started to read the kernel's state (a process limit reached).
    #[error("cannot start a thread to read the kernel's iptables state: {0}")]
    NoThread(String),
    /// The chain names or rules could not be read over netlink.
    #[error("reading the chains of table {table} ({family}) over netlink: {source}")]
    Netlink {
        table: String,
        family: &'static str,
        #[source]
        source: NetlinkError,
    },
}

fn at_line(line: Option<usize>, context: &str) -> String {
    match line {
        Some(line) if !context.is_empty() => format!(" (input line {line}: {context})"),
        Some(line) => format!(" (input line {line})"),
        None => String::new(),
    }
}

/// The rules of some chains, by chain: each rule as `iptables -S` prints it after `-A <chain> `.
pub type ChainRules = BTreeMap<String, Vec<String>>;

/// One read of a whole table, where the back end reads tables whole anyway (legacy): how many
/// rules each chain holds, and the rules of the chains asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub rule_counts: BTreeMap<String, usize>,
    pub rules: ChainRules,
}

/// The operations the proxiers need. None reads a whole table: on a node with 10,000 services
/// `iptables-nft-save` runs for minutes and then crashes, and other programs' rules can be huge.
pub trait Iptables: Send {
    /// Forgets what was read (a back end that reads whole tables keeps them for one sync).
    fn forget_reads(&mut self) {}
    /// Applies restore input without flushing tables (`--noflush --counters`). Each `COMMIT`
    /// ends one transaction: an input of several sections of a table may be applied in part.
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError>;
    /// The names of one table's chains (no rules).
    fn chain_names(
        &mut self,
        family: IpFamily,
        table: &str,
    ) -> Result<BTreeSet<String>, IptablesError>;
    /// The rules of a few chains of one table; a chain that does not exist has none.
    fn chain_rules(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &[&str],
    ) -> Result<ChainRules, IptablesError>;
    /// Which of `chains` exist in `table`: each looked up by name where the back end reads
    /// chains one by one (nft: listing one table's chains walks every table's), else from the
    /// table's names.
    fn existing_chains(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &[&str],
    ) -> Result<BTreeSet<String>, IptablesError> {
        if !self.reads_each_chain() {
            return Ok(among(&self.chain_names(family, table)?, chains));
        }
        let mut found = BTreeSet::new();
        for chain in chains {
            if self.chain_exists(family, table, chain)? {
                found.insert(chain.to_string());
            }
        }
        Ok(found)
    }
    /// Whether a chain exists (for the canary check).
    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<bool, IptablesError>;
    /// A [`Snapshot`] of one table where that costs no more than the back end's own restores
    /// (legacy), `None` where it would mean reading every rule (nft: its change events say what
    /// changed instead).
    fn snapshot(
        &mut self,
        family: IpFamily,
        table: &str,
        rules_of: &[&str],
    ) -> Result<Option<Snapshot>, IptablesError>;
    /// How each of `chains` in `table` holds its rules, as fingerprints comparable with
    /// [`Iptables::rule_fingerprinter`]'s: nft reads the chains one at a time over netlink,
    /// legacy the table whole (once a sync: it hands out nothing else); `None` where the back
    /// end cannot tell. One entry per chain of `chains`, in that order. A chain that does not
    /// exist holds no rules: the caller knows the names.
    fn chain_fingerprints(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &[&str],
    ) -> Result<Option<Vec<Vec<RuleFingerprint>>>, IptablesError>;
    /// What tells the fingerprint of a rule (`spec`, the text after `-A <chain>`) as this back
    /// end holds it, `None` where [`Iptables::chain_fingerprints`] reads nothing. The function
    /// answers `None` for a rule whose kernel form it cannot tell: that rule never looks
    /// already right. A plain function, so that it runs beside the reads.
    fn rule_fingerprinter(&self) -> Option<RuleFingerprinter>;
    /// Whether [`Iptables::chain_fingerprints`] costs a kernel request per chain (nft; legacy
    /// reads each table once either way). Where it does, a full sync keeps the endpoint chains
    /// of services whose other chains are right by name, and checks them in later syncs, and
    /// [`Iptables::existing_chains`] looks each chain up.
    fn reads_each_chain(&self) -> bool {
        false
    }
    /// At most how many chains a restore that writes `chains` chains should put in one
    /// transaction (`COMMIT`), or `None` for one transaction per table; `reachable` says whether
    /// built-in chains already jump to them. nft: see [`nft_chains_per_transaction`]; legacy
    /// iptables swaps the whole table at each COMMIT, so there one transaction is cheapest.
    fn chains_per_transaction(&self, chains: usize, reachable: bool) -> Option<usize>;
}

/// Which kernel interface the iptables tools use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Legacy,
    Nft,
}

impl Backend {
    /// As the tools' names spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Legacy => "legacy",
            Backend::Nft => "nft",
        }
    }

    /// Chooses as kube-proxy's image does (iptables-wrapper), from chain names only: kubelet's
    /// KUBE-IPTABLES-HINT chain wins, then kubelet's KUBE-KUBELET-CANARY, then the canary an
    /// earlier kube-proxy left; a node without any of them uses legacy only if legacy tables
    /// hold rules and nf_tables holds no iptables table, else nft.
    pub fn detect() -> Backend {
        for marker in [
            "KUBE-IPTABLES-HINT",
            "KUBE-KUBELET-CANARY",
            "KUBE-PROXY-CANARY",
        ] {
            for backend in [Backend::Legacy, Backend::Nft] {
                let mut iptables = SystemIptables::new(backend);
                let marked = [IpFamily::V4, IpFamily::V6].into_iter().any(|family| {
                    iptables
                        .chain_exists(family, "mangle", marker)
                        .unwrap_or(false)
                });
                if marked {
                    return backend;
                }
            }
        }
        let legacy_rules = Tool::new(&tool(IpFamily::V4, Backend::Legacy, "save"), &[])
            .run()
            .is_ok_and(|out| out.split(|b| *b == b'\n').any(|l| l.starts_with(b"-A ")));
        let nft_tables = ["filter", "nat", "mangle"].into_iter().any(|table| {
            nf_tables::chain_names(IpFamily::V4, table).is_ok_and(|names| !names.is_empty())
        });
        if legacy_rules && !nft_tables {
            Backend::Legacy
        } else {
            Backend::Nft
        }
    }
}

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
            let index: BTreeMap<&str, usize> =
                chains.iter().enumerate().map(|(i, c)| (*c, i)).collect();
            let mut held = vec![Vec::new(); chains.len()];
            // One pass over the table: each `-A <chain> <rule>` line to its chain, if asked for.
            for line in saved.lines() {
                let Some(rest) = line.strip_prefix("-A ") else {
                    continue;
                };
                let (chain, rule) = rest.split_once(' ').unwrap_or((rest, ""));
                if let Some(&at) = index.get(chain) {
                    held[at].push(rules::text_fingerprint(rule.trim_end()));
                }
            }
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

/// Those of `chains` that `names` holds.
fn among(names: &BTreeSet<String>, chains: &[&str]) -> BTreeSet<String> {
    chains
        .iter()
        .filter(|chain| names.contains(**chain))
        .map(|chain| chain.to_string())
        .collect()
}

/// One table's part of an iptables-save of several tables (empty if absent).
pub fn table_section<'a>(save: &'a str, table: &str) -> &'a str {
    let header = format!("*{table}\n");
    let Some(start) = save.find(&header) else {
        return "";
    };
    let rest = &save[start..];
    match rest.find("\nCOMMIT") {
        Some(end) => &rest[..end],
        None => rest,
    }
}

/// The chains `:NAME ...` lines declare in iptables-save output.
pub fn declared_chains(save: &str) -> BTreeSet<String> {
    save.lines()
        .filter_map(|line| line.strip_prefix(':'))
        .filter_map(|decl| decl.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The rules of `chain` in iptables-save or `iptables -S` output, without `-A <chain> `.
pub fn rules_of(listing: &str, chain: &str) -> Vec<String> {
    let prefix = format!("-A {chain} ");
    listing
        .lines()
        .filter_map(|line| {
            line.strip_prefix(&prefix)
                .or_else(|| (line == prefix.trim_end()).then_some(""))
        })
        .map(|spec| spec.trim_end().to_string())
        .collect()
}

/// iptables-restore says `line N failed` (a line it could not parse) or `line N: CHAIN_DEL
/// failed (...)` (a command the kernel refused, nft back end).
fn failed_line(stderr: &str) -> Option<usize> {
    let words: Vec<&str> = stderr.split_whitespace().collect();
    words
        .windows(2)
        .find(|w| w[0] == "line" && w[1].trim_end_matches(':').parse::<usize>().is_ok())
        .and_then(|w| w[1].trim_end_matches(':').parse().ok())
}

/// Input line `line` (1-based) with the lines around it, numbered, on one line.
pub fn input_context(input: &str, line: usize) -> String {
    let first = line.saturating_sub(1).max(1);
    input
        .lines()
        .enumerate()
        .skip(first - 1)
        .take(line + 1 - first + 1)
        .map(|(index, text)| {
            let mark = if index + 1 == line { ">" } else { "" };
            format!("{mark}{}: {text:?}", index + 1)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Splits a restore line into words, honouring double quotes (which are dropped: `"a b"` is
/// the word `a b`, `""` an empty word).
pub fn tokenize(line: &str) -> Result<Vec<String>, String> {
    let mut tokens = Vec::new();
    let mut chars = line.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let (mut end, mut quoted, mut has_quote) = (start, false, false);
        while let Some(&(at, c)) = chars.peek() {
            if c.is_whitespace() && !quoted {
                break;
            }
            if c == '"' {
                quoted = !quoted;
                has_quote = true;
            }
            end = at + c.len_utf8();
            chars.next();
        }
        if quoted {
            return Err("unterminated quote".into());
        }
        let word = &line[start..end];
        tokens.push(if has_quote {
            word.replace('"', "")
        } else {
            word.to_string()
        });
    }
    Ok(tokens)
}

/// The chain or target a rule jumps to.
pub fn jump_target(spec: &str) -> Option<&str> {
    let mut words = spec.split_whitespace();
    while let Some(word) = words.next() {
        if word == "-j" || word == "-g" {
            return words.next();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names() {
        assert_eq!(
            tool(IpFamily::V4, Backend::Nft, "restore"),
            "iptables-nft-restore"
        );
        assert_eq!(
            tool(IpFamily::V6, Backend::Legacy, "save"),
            "ip6tables-legacy-save"
        );
        assert_eq!(tool(IpFamily::V4, Backend::Nft, ""), "iptables-nft");
        assert_eq!(failed_line("iptables-restore: line 7 failed"), Some(7));
        assert_eq!(failed_line("something else"), None);
        assert_eq!(
            failed_line(
                "iptables-nft-restore v1.8.9 (nf_tables): | line 8: CHAIN_DEL failed (Device or resource busy): chain KUBE-SVC-AAAA"
            ),
            Some(8)
        );
        let save =
            "# Generated\n*mangle\n:A - [0:0]\nCOMMIT\n*nat\n:B - [0:0]\n-A B -j RETURN\nCOMMIT\n";
        assert_eq!(
            table_section(save, "nat"),
            "*nat\n:B - [0:0]\n-A B -j RETURN"
        );
        assert_eq!(table_section(save, "filter"), "");
        assert_eq!(
            declared_chains(save),
            BTreeSet::from(["A".to_string(), "B".to_string()])
        );
    }

    #[test]
    fn words_are_split_as_restore_splits_them() {
        let words = |line: &str| tokenize(line).unwrap();
        assert_eq!(
            words("-A X -m comment --comment \"ns/svc:p cluster IP\" -j Y"),
            [
                "-A",
                "X",
                "-m",
                "comment",
                "--comment",
                "ns/svc:p cluster IP",
                "-j",
                "Y"
            ]
        );
        assert_eq!(words("  a\tb  "), ["a", "b"]);
        assert_eq!(words("x\"y z\"w \"\""), ["xy zw", ""]);
        assert_eq!(words("a\u{a0}b"), ["a", "b"], "any whitespace splits");
        assert!(words("").is_empty());
        assert!(tokenize("--comment \"open").is_err());
    }

    #[test]
    fn listings_give_one_chains_rules() {
        let listing = "-P PREROUTING ACCEPT\n-A PREROUTING -m comment --comment \"a b\" -j KUBE-SERVICES\n\
                       -A PREROUTING-X -j ACCEPT\n-A PREROUTING\n-A OUTPUT -j KUBE-SERVICES\n";
        assert_eq!(
            rules_of(listing, "PREROUTING"),
            vec!["-m comment --comment \"a b\" -j KUBE-SERVICES", ""]
        );
        assert!(rules_of(listing, "INPUT").is_empty());
    }

    #[test]
    fn a_failed_restore_names_the_line_and_its_neighbours() {
        let input = "*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j BAD\nCOMMIT\n";
        assert_eq!(
            input_context(input, 3),
            "2: \":KUBE-A - [0:0]\", >3: \"-A KUBE-A -j BAD\", 4: \"COMMIT\""
        );
        assert_eq!(
            input_context(input, 1),
            ">1: \"*nat\", 2: \":KUBE-A - [0:0]\""
        );
        let error = IptablesError::Restore {
            reason: "iptables-nft-restore exited with status 2: stderr: line 3 failed".into(),
            line: Some(3),
            context: input_context(input, 3),
        };
        assert!(
            error.to_string().ends_with(
                "(input line 3: 2: \":KUBE-A - [0:0]\", >3: \"-A KUBE-A -j BAD\", 4: \"COMMIT\")"
            ),
            "{error}"
        );
    }
}
