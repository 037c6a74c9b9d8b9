//! nftables: transactions in nft's command language, each applied atomically (all of it or
//! nothing) over netlink, or by one `nft -f -` where asked; the names of our own table's chains
//! and sets, and what the proxier reads back of them, read over netlink. Nothing here lists a rule,
//! an element or another table: `nft list` reads (and older nft binaries crash on) whatever
//! other programs keep in the ruleset.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use self::elements::KeyLayout;
use super::host::process::{Tool, ToolError};
use super::netlink::{Connection, NetlinkError};
use super::xtables::input_context;

pub mod elements;
pub mod events;
pub mod expr;
pub mod fake;
pub mod lookups;
pub mod read;
pub mod trace;
pub mod wire;
pub mod write;
use crate::model::IpFamily;
use netlink_sys::protocols::NETLINK_NETFILTER;
use tracing::debug;

/// The `nft` binary.
pub const NFT: &str = "nft";
/// Reading names and probing may take this long.
const READ_LIMIT: Duration = Duration::from_secs(60);

/// Why an nftables operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// nft refused the transaction; `line` is the input line it named, if it did.
    #[error("{reason}{}", at_line(*.line, .context))]
    Transaction {
        reason: String,
        line: Option<usize>,
        /// The failing line and its neighbours, numbered.
        context: String,
    },
    /// nft could not run, or a probe failed.
    #[error(transparent)]
    Tool(#[from] ToolError),
    /// The table's chains or sets could not be read over netlink.
    #[error("reading the {what} of table {family} {table} over netlink: {source}")]
    Netlink {
        what: &'static str,
        table: String,
        family: &'static str,
        #[source]
        source: NetlinkError,
    },
    /// A set's elements could not be read as text.
    #[error("reading the elements of table {family} {table}: {source}")]
    Elements {
        table: String,
        family: &'static str,
        #[source]
        source: elements::ElementsError,
    },
}

fn at_line(line: Option<usize>, context: &str) -> String {
    match line {
        Some(line) if !context.is_empty() => format!(" (input line {line}: {context})"),
        Some(line) => format!(" (input line {line})"),
        None => String::new(),
    }
}

/// The names of one table's objects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableNames {
    pub chains: BTreeSet<String>,
    /// Named sets and maps.
    pub sets: BTreeSet<String>,
    /// Named counters.
    pub counters: BTreeSet<String>,
    /// Flowtables.
    pub flowtables: BTreeSet<String>,
}

/// The `nft` family keyword of an IP family.
pub fn family_keyword(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// The kernel's nftables, as this program uses it.
pub trait Nftables: Send {
    /// Applies `commands` (nft's command language, one command per line) as one transaction.
    fn apply(&mut self, commands: &str) -> Result<(), NftError>;
    /// The names of `table`'s chains and sets in `family` (none when there is no such table).
    fn names(&mut self, family: IpFamily, table: &str) -> Result<TableNames, NftError>;
    /// Whether `table` of `family` exists.
    fn table_exists(&mut self, family: IpFamily, table: &str) -> Result<bool, NftError>;
    /// The devices `flowtable` of `table` in `family` holds, if it exists.
    fn flowtable_devices(
        &mut self,
        family: IpFamily,
        table: &str,
        flowtable: &str,
    ) -> Result<Option<BTreeSet<String>>, NftError>;
    /// Per chain of `chains` in `table` of `family`: how many rules it holds and the comments
    /// they carry.
    fn rule_comments(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &BTreeSet<String>,
    ) -> Result<RuleComments, NftError>;
    /// The elements of `sets` (name and declaration) in `table` of `family`, as this program
    /// writes them.
    fn elements(
        &mut self,
        family: IpFamily,
        table: &str,
        sets: &[(String, String)],
    ) -> Result<SetElements, NftError>;
}

/// Per chain: its rule count and its rules' comments.
pub type RuleComments = BTreeMap<String, (usize, Vec<String>)>;

/// Per set: key -> the text after the key (` comment "..." : goto chain`, or empty).
pub type SetElements = BTreeMap<String, BTreeMap<String, String>>;

/// How [`SystemNftables`] writes a transaction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Writer {
    /// Over netlink when our compiler knows every line (it knows everything this program
    /// writes), else with `nft -f -`.
    #[default]
    NetlinkOrNft,
    /// Always with `nft -f -`.
    Nft,
    /// Over netlink only; text the compiler does not know is an error (tests).
    Netlink,
}

/// The real thing: transactions over netlink (or `nft -f -`), netlink dumps of one table for
/// names.
#[derive(Clone, Debug, Default)]
pub struct SystemNftables {
    pub writer: Writer,
    /// Transactions over netlink go through one kept socket.
    sender: write::Sender,
}

impl SystemNftables {
    /// Writes every transaction with the `nft` binary.
    pub fn nft_only() -> Self {
        SystemNftables {
            writer: Writer::Nft,
            ..SystemNftables::default()
        }
    }

    /// Writes every transaction over netlink, refusing text the compiler does not know.
    pub fn netlink_only() -> Self {
        SystemNftables {
            writer: Writer::Netlink,
            ..SystemNftables::default()
        }
    }

    fn apply_with_nft(commands: &str) -> Result<(), NftError> {
        Tool::new(NFT, &["-f", "-"])
            .input(commands.as_bytes())
            .limit(apply_limit(commands))
            .run()
            .map(drop)
            .map_err(|failure| {
                let line = failure.stderr().and_then(failed_line);
                NftError::Transaction {
                    reason: failure.to_string(),
                    line,
                    context: line.map(|l| input_context(commands, l)).unwrap_or_default(),
                }
            })
    }
}

/// Sends compiled `commands`; a refusal names the line the refused message came from.
fn apply_over_netlink(
    sender: &mut write::Sender,
    commands: &str,
    compiled: &write::Compiled,
) -> Result<(), NftError> {
    sender
        .send(&compiled.messages)
        .map_err(|err| netlink_failure(err, "transaction", commands, compiled))
}

/// A refused batch as an error naming the line the refused message came from.
fn netlink_failure(
    err: write::SendError,
    what: &str,
    commands: &str,
    compiled: &write::Compiled,
) -> NftError {
    let line = match &err {
        write::SendError::Refused {
            message: Some(index),
            ..
        } => compiled.lines.get(*index).copied(),
        _ => None,
    };
    NftError::Transaction {
        reason: format!("nf_tables {what} over netlink failed: {err}"),
        line,
        context: line.map(|l| input_context(commands, l)).unwrap_or_default(),
    }
}

impl Nftables for SystemNftables {
    fn apply(&mut self, commands: &str) -> Result<(), NftError> {
        if self.writer == Writer::Nft {
            return Self::apply_with_nft(commands);
        }
        match write::compile(commands) {
            Ok(compiled) => apply_over_netlink(&mut self.sender, commands, &compiled),
            Err(err) if self.writer == Writer::Netlink => Err(NftError::Transaction {
                reason: format!("not written over netlink: {}", err.reason),
                line: Some(err.line),
                context: input_context(commands, err.line),
            }),
            Err(err) => {
                debug!(error = %err, "Writing a transaction with nft: the netlink compiler does not know a line");
                Self::apply_with_nft(commands)
            }
        }
    }

    fn names(&mut self, family: IpFamily, table: &str) -> Result<TableNames, NftError> {
        let failed = |what: &'static str| {
            move |source| NftError::Netlink {
                what,
                table: table.to_string(),
                family: family_keyword(family),
                source,
            }
        };
        let chains = read::chain_names(family, table).map_err(failed("chains"))?;
        let sets = read::set_names(family, table).map_err(failed("sets"))?;
        let counters = read::counters(family, table)
            .map_err(failed("counters"))?
            .into_keys()
            .collect();
        let flowtables = read::flowtables(family, table)
            .map_err(failed("flowtables"))?
            .into_keys()
            .collect();
        Ok(TableNames {
            chains,
            sets,
            counters,
            flowtables,
        })
    }

    fn flowtable_devices(
        &mut self,
        family: IpFamily,
        table: &str,
        flowtable: &str,
    ) -> Result<Option<BTreeSet<String>>, NftError> {
        let mut found = read::flowtables(family, table).map_err(|source| NftError::Netlink {
            what: "flowtables",
            table: table.to_string(),
            family: family_keyword(family),
            source,
        })?;
        Ok(found.remove(flowtable))
    }

    fn table_exists(&mut self, family: IpFamily, table: &str) -> Result<bool, NftError> {
        read::table_exists(family, table).map_err(|source| NftError::Netlink {
            what: "table",
            table: table.to_string(),
            family: family_keyword(family),
            source,
        })
    }

    fn rule_comments(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &BTreeSet<String>,
    ) -> Result<RuleComments, NftError> {
        read::rule_comments(family, table, chains).map_err(|source| NftError::Netlink {
            what: "rules",
            table: table.to_string(),
            family: family_keyword(family),
            source,
        })
    }

    fn elements(
        &mut self,
        family: IpFamily,
        table: &str,
        sets: &[(String, String)],
    ) -> Result<SetElements, NftError> {
        let failed = |source| NftError::Elements {
            table: table.to_string(),
            family: family_keyword(family),
            source,
        };
        let mut out = SetElements::new();
        let mut connection = Connection::open(NETLINK_NETFILTER)
            .map_err(|err| failed(elements::ElementsError::Netlink(err)))?;
        for (name, spec) in sets {
            let layout = KeyLayout::from_spec(spec).ok_or_else(|| {
                failed(elements::ElementsError::Undecodable {
                    set: name.clone(),
                    what: format!("a declaration this program does not write: {spec}"),
                })
            })?;
            let elements = elements::set_elements(&mut connection, family, table, name, &layout)
                .map_err(failed)?;
            out.insert(name.clone(), elements);
        }
        Ok(out)
    }
}

/// The commands that remove `table` of `family` whether or not it exists (adding an existing
/// table is no error, so the pair always applies).
pub fn remove_table_commands(family: IpFamily, table: &str) -> String {
    let family = family_keyword(family);
    format!("add table {family} {table}\ndelete table {family} {table}\n")
}

/// A large transaction may take a while: a minute, and a second more per 100 kB.
fn apply_limit(commands: &str) -> Duration {
    Duration::from_secs(60 + (commands.len() / 100_000) as u64)
}

/// nft names the failing input as `/dev/stdin:LINE:COLUMNS: Error: ...`.
fn failed_line(stderr: &str) -> Option<usize> {
    stderr.lines().find_map(|line| {
        let rest = line.strip_prefix("/dev/stdin:")?;
        rest.split(':').next()?.parse().ok()
    })
}

/// The `nft` binary's version (`nftables v1.0.6 (Lester Gooch #5)` -> (1, 0, 6)).
pub fn nft_version() -> Result<(u32, u32, u32), ToolError> {
    let output = Tool::new(NFT, &["--version"]).limit(READ_LIMIT).run()?;
    let text = String::from_utf8_lossy(&output);
    Ok(parse_version(&text).unwrap_or((0, 0, 0)))
}

fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let word = text.split_whitespace().find(|w| w.starts_with('v'))?;
    let mut numbers = word[1..].split('.').map(|n| {
        n.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
    });
    let major = numbers.next()?.ok()?;
    let minor = numbers.next().and_then(Result::ok).unwrap_or(0);
    let patch = numbers.next().and_then(Result::ok).unwrap_or(0);
    Some((major, minor, patch))
}

/// Checks `commands` with the kernel without applying them: nf_tables works and knows every
/// expression they use. Over netlink, as a transaction the kernel handles and then aborts; with
/// `nft --check` for text our compiler does not know (nft reads the family's ruleset first:
/// 0.1 s on a node already holding 10,000 services, and a risk with other tenants' rules).
pub fn check(commands: &str) -> Result<(), NftError> {
    if let Ok(compiled) = write::compile(commands) {
        return write::Sender::default()
            .check(&compiled.messages)
            .map_err(|err| netlink_failure(err, "check", commands, &compiled));
    }
    Tool::new(NFT, &["--check", "-f", "-"])
        .input(commands.as_bytes())
        .limit(READ_LIMIT)
        .run()
        .map(drop)
        .map_err(|failure| NftError::Transaction {
            reason: failure.to_string(),
            line: failure.stderr().and_then(failed_line),
            context: String::new(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failing_line_is_the_one_nft_names() {
        let stderr = "/dev/stdin:7:63-73: Error: Could not process rule: No such file or directory\n\
                      add rule ip kube-proxy x goto nonexistent\n";
        assert_eq!(failed_line(stderr), Some(7));
        assert_eq!(failed_line("Error: No such file or directory"), None);
    }

    #[test]
    fn versions_parse_as_nft_prints_them() {
        assert_eq!(
            parse_version("nftables v1.0.6 (Lester Gooch #5)"),
            Some((1, 0, 6))
        );
        assert_eq!(
            parse_version("nftables v1.1.1 (Commodore Bullmoose #2)"),
            Some((1, 1, 1))
        );
        assert_eq!(parse_version("nftables v0.9.8 (E.D.S.)"), Some((0, 9, 8)));
        assert_eq!(parse_version("garbage"), None);
    }
}
