//! iptables through its restore/save tools: one `iptables-restore --noflush --counters` per sync
//! and family, fed on stdin, never a process per rule. The back end (legacy or nft) is chosen as
//! kube-proxy's image does: the one kubelet's hint chain names, else the one whose tables already
//! hold more rules, else nft.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::model::IpFamily;

/// Why an iptables operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    /// iptables-restore refused the input.
    #[error("iptables-restore failed at line {line}: {reason}")]
    Restore { line: usize, reason: String },
    /// A tool could not be started.
    #[error("failed to run {command}: {reason}")]
    Exec { command: String, reason: String },
    /// A tool ran and failed.
    #[error("{command} failed: {stderr}")]
    Command { command: String, stderr: String },
}

/// The operations the iptables proxier needs.
pub trait Iptables: Send {
    /// Applies restore input without flushing tables (`--noflush --counters`).
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError>;
    /// `iptables-save -t <table>`, or every table when `None` (one process instead of several).
    fn save(&mut self, family: IpFamily, table: Option<&str>) -> Result<String, IptablesError>;
    /// Whether a chain exists (for the canary check).
    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<bool, IptablesError>;
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

    /// Chooses as kube-proxy's image does (iptables-wrapper): kubelet's KUBE-IPTABLES-HINT chain
    /// wins; else the back end with more rules; nft on a tie.
    pub fn detect() -> Backend {
        for backend in [Backend::Legacy, Backend::Nft] {
            let hinted = [IpFamily::V4, IpFamily::V6].into_iter().any(|family| {
                run(&tool(family, backend, "save"), &["-t", "mangle"])
                    .is_ok_and(|out| out.contains(":KUBE-IPTABLES-HINT"))
            });
            if hinted {
                return backend;
            }
        }
        let count = |backend| {
            [IpFamily::V4, IpFamily::V6]
                .into_iter()
                .filter_map(|family| run(&tool(family, backend, "save"), &[]).ok())
                .map(|out| out.lines().filter(|l| l.starts_with("-A ")).count())
                .sum::<usize>()
        };
        if count(Backend::Legacy) > count(Backend::Nft) {
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
}

impl SystemIptables {
    /// Uses the given back end.
    pub fn new(backend: Backend) -> Self {
        SystemIptables { backend }
    }
}

impl Iptables for SystemIptables {
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), IptablesError> {
        let command = tool(family, self.backend, "restore");
        let mut child = Command::new(&command)
            .args(["-w", "5", "--noflush", "--counters"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| IptablesError::Exec {
                command: command.clone(),
                reason: err.to_string(),
            })?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(input.as_bytes())
                .map_err(|err| IptablesError::Exec {
                    command: command.clone(),
                    reason: err.to_string(),
                })?;
        }
        let output = child
            .wait_with_output()
            .map_err(|err| IptablesError::Exec {
                command: command.clone(),
                reason: err.to_string(),
            })?;
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        let line = failed_line(&stderr).unwrap_or(0);
        let context = input
            .lines()
            .nth(line.saturating_sub(1))
            .filter(|_| line > 0)
            .unwrap_or_default();
        Err(IptablesError::Restore {
            line,
            reason: format!("{stderr} (input: {context})"),
        })
    }

    fn save(&mut self, family: IpFamily, table: Option<&str>) -> Result<String, IptablesError> {
        match table {
            Some(table) => run(&tool(family, self.backend, "save"), &["-t", table]),
            None => run(&tool(family, self.backend, "save"), &[]),
        }
    }

    fn chain_exists(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<bool, IptablesError> {
        let command = tool(family, self.backend, "");
        let status = Command::new(&command)
            .args(["-w", "5", "-t", table, "-S", chain])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|err| IptablesError::Exec {
                command,
                reason: err.to_string(),
            })?;
        Ok(status.success())
    }
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

fn run(command: &str, args: &[&str]) -> Result<String, IptablesError> {
    let output = Command::new(command)
        .args(args)
        .output()
        .map_err(|err| IptablesError::Exec {
            command: command.to_string(),
            reason: err.to_string(),
        })?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(IptablesError::Command {
            command: format!("{command} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        })
    }
}

/// iptables-restore says `line N failed`.
fn failed_line(stderr: &str) -> Option<usize> {
    let words: Vec<&str> = stderr.split_whitespace().collect();
    words
        .windows(3)
        .find(|w| w[0] == "line" && w[2].starts_with("failed"))
        .and_then(|w| w[1].parse().ok())
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
        let save =
            "# Generated\n*mangle\n:A - [0:0]\nCOMMIT\n*nat\n:B - [0:0]\n-A B -j RETURN\nCOMMIT\n";
        assert_eq!(
            table_section(save, "nat"),
            "*nat\n:B - [0:0]\n-A B -j RETURN"
        );
        assert_eq!(table_section(save, "filter"), "");
    }
}
