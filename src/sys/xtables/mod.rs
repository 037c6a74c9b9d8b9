//! iptables through its tools: one `iptables-restore --noflush --counters` per sync and family,
//! fed on stdin, never a process per rule; reads of only what is ours (chain names, and the rules
//! of a few named chains), never a whole table. The back end (legacy or nft) is chosen as
//! kube-proxy's image does, from marker chains that kubelet and kube-proxy leave.

use std::collections::{BTreeMap, BTreeSet};
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
mod system;
mod text;

use crate::model::IpFamily;
pub use system::{SystemIptables, tool};
pub use text::{declared_chains, input_context, jump_target, rules_of, table_section, tokenize};

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

/// A rule read into its options, or why it could not be.
pub type ReadRule = Result<rules::RuleOptions, rules::Untranslatable>;

/// The options of the rules of `chains` (in that order) from their text.
fn options_of_text(family: IpFamily, rules: &ChainRules, chains: &[&str]) -> Vec<Vec<ReadRule>> {
    let ipv6 = family == IpFamily::V6;
    chains
        .iter()
        .map(|chain| {
            rules
                .get(*chain)
                .map(|specs| specs.iter().map(|s| rules::read_rule(ipv6, s)).collect())
                .unwrap_or_default()
        })
        .collect()
}

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
        each_looked_up(self, family, table, chains)
    }
    /// The rules of `chains` of `table`, each read into its options (`kube-proxy-rs
    /// explain`), one list per chain of `chains`, in that order: nft decodes them from netlink
    /// one chain at a time, legacy reads them from the table it saves once. A rule that cannot
    /// be read says why.
    fn rule_options(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &[&str],
    ) -> Result<Vec<Vec<ReadRule>>, IptablesError> {
        let rules = self.chain_rules(family, table, chains)?;
        Ok(options_of_text(family, &rules, chains))
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

    /// The back end whose `table` holds `chain` in either family (`explain`: where our rules
    /// are, whatever marks the node): nft when nf_tables holds it (one netlink request per
    /// family), else legacy, which hands out whole tables only and so is not asked.
    /// When nf_tables cannot be asked, the daemon's choice ([`Backend::detect`]).
    pub fn holding(table: &str, chain: &str) -> Backend {
        let asked = [IpFamily::V4, IpFamily::V6].map(|f| nf_tables::chain_exists(f, table, chain));
        if asked.iter().any(|held| matches!(held, Ok(true))) {
            Backend::Nft
        } else if asked.iter().any(Result::is_err) {
            Backend::detect()
        } else {
            Backend::Legacy
        }
    }

    /// Chooses as kube-proxy's image does (iptables-wrapper), from chain names only: kubelet's
    /// KUBE-IPTABLES-HINT chain wins, then kubelet's KUBE-KUBELET-CANARY, then the canary an
    /// earlier kube-proxy left; a node without any of them uses legacy only if legacy tables
    /// hold rules and nf_tables holds no iptables table, else nft.
    ///
    /// Each back end's mangle table is asked for all three names at once (legacy: one save of
    /// mangle per family, not a process per name).
    pub fn detect() -> Backend {
        const MARKERS: [&str; 3] = [
            "KUBE-IPTABLES-HINT",
            "KUBE-KUBELET-CANARY",
            "KUBE-PROXY-CANARY",
        ];
        let marked = |backend: Backend| -> BTreeSet<String> {
            let mut iptables = SystemIptables::new(backend);
            [IpFamily::V4, IpFamily::V6]
                .into_iter()
                .flat_map(|family| {
                    iptables
                        .existing_chains(family, "mangle", &MARKERS)
                        .unwrap_or_default()
                })
                .collect()
        };
        let (legacy, nft) = (marked(Backend::Legacy), marked(Backend::Nft));
        for marker in MARKERS {
            if legacy.contains(marker) {
                return Backend::Legacy;
            }
            if nft.contains(marker) {
                return Backend::Nft;
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

/// Those of `chains` that exist, each looked up by name.
fn each_looked_up<I: Iptables + ?Sized>(
    iptables: &mut I,
    family: IpFamily,
    table: &str,
    chains: &[&str],
) -> Result<BTreeSet<String>, IptablesError> {
    let mut found = BTreeSet::new();
    for chain in chains {
        if iptables.chain_exists(family, table, chain)? {
            found.insert(chain.to_string());
        }
    }
    Ok(found)
}

/// Those of `chains` that `names` holds.
fn among(names: &BTreeSet<String>, chains: &[&str]) -> BTreeSet<String> {
    chains
        .iter()
        .filter(|chain| names.contains(**chain))
        .map(|chain| chain.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::text::failed_line;
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
