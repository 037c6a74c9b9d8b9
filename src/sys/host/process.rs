//! Running the kernel's command-line tools (iptables-restore, `iptables -S`, ipset): input fed on
//! stdin, output collected, a time limit, a log line while a slow one is still running, and a
//! failure that says which command it was, how it ended (exit status or the signal that killed
//! it) and the first lines it printed on stderr. Never an empty reason.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::info;

/// How many lines of a failed tool's stderr an error carries.
const STDERR_LINES: usize = 5;
/// How many characters of them.
const STDERR_CHARS: usize = 800;
/// A tool still running after this is logged, and again every this often.
const SLOW_AFTER: Duration = Duration::from_secs(10);

/// How long a finished tool's pid is still recognised as ours (its kernel events may be read a
/// little after it exits).
const REMEMBER_EXITED: Duration = Duration::from_secs(60);

/// The pids of the tools this process runs (and ran lately), with when each exited.
static CHILDREN: Mutex<BTreeMap<u32, Option<Instant>>> = Mutex::new(BTreeMap::new());

fn children() -> std::sync::MutexGuard<'static, BTreeMap<u32, Option<Instant>>> {
    CHILDREN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `pid` is a tool this process started (running, or finished within the last minute).
/// A netlink socket's port id is its process's pid, so the kernel's change events tell which
/// changes were our own restores'.
pub fn is_our_tool(pid: u32) -> bool {
    let mut children = children();
    children.retain(|_, exited| exited.is_none_or(|at| at.elapsed() < REMEMBER_EXITED));
    children.contains_key(&pid)
}

/// The port ids of this process's own netlink sockets that write nf_tables transactions, each
/// with how many are open (port ids are per network namespace: two sockets of ours in two
/// namespaces may share one).
static OWN_PORTS: Mutex<BTreeMap<u32, usize>> = Mutex::new(BTreeMap::new());

fn own_ports() -> std::sync::MutexGuard<'static, BTreeMap<u32, usize>> {
    OWN_PORTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Notes that a socket of ours that writes transactions has port id `port` (the kernel's change
/// events carry it: those are our own changes, not drift).
pub fn own_socket_opened(port: u32) {
    *own_ports().entry(port).or_default() += 1;
}

/// The socket with port id `port` is closed (the kernel may hand the number to another socket).
pub fn own_socket_closed(port: u32) {
    let mut ports = own_ports();
    if let Some(count) = ports.get_mut(&port) {
        *count -= 1;
        if *count == 0 {
            ports.remove(&port);
        }
    }
}

/// Whether `port` is one of this process's own writing sockets.
pub fn is_own_socket(port: u32) -> bool {
    own_ports().contains_key(&port)
}

/// Whether a tool of ours is running, or finished within `within`.
pub fn tool_active_within(within: Duration) -> bool {
    children()
        .values()
        .any(|exited| exited.is_none_or(|at| at.elapsed() < within))
}

/// Why running a tool failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The tool could not be started (not installed, not executable).
    #[error("cannot run {command}: {reason}")]
    Spawn { command: String, reason: String },
    /// The tool ran and failed.
    #[error("{command} {ended}: {}", describe_stderr(.stderr))]
    Failed {
        command: String,
        ended: Ended,
        /// Its first lines on stderr.
        stderr: String,
    },
    /// The tool ran past its time limit and was killed.
    #[error("{command} did not finish within {limit:?} and was killed")]
    TimedOut { command: String, limit: Duration },
}

impl ToolError {
    /// The tool's stderr, when it ran and failed.
    pub fn stderr(&self) -> Option<&str> {
        match self {
            ToolError::Failed { stderr, .. } => Some(stderr),
            _ => None,
        }
    }
}

/// How a process that did not succeed ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Exited(i32),
    /// A signal killed it.
    Signaled(i32),
}

impl Ended {
    fn of(status: ExitStatus) -> Ended {
        match (status.code(), status.signal()) {
            (Some(code), _) => Ended::Exited(code),
            (None, Some(signal)) => Ended::Signaled(signal),
            (None, None) => Ended::Exited(-1),
        }
    }
}

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ended::Exited(code) => write!(f, "exited with status {code}"),
            Ended::Signaled(signal) => {
                let name = nix::sys::signal::Signal::try_from(*signal)
                    .map(|s| s.as_str())
                    .unwrap_or("unknown signal");
                write!(f, "was killed by signal {signal} ({name})")
            }
        }
    }
}

fn describe_stderr(stderr: &str) -> String {
    if stderr.is_empty() {
        "nothing on stderr".to_string()
    } else {
        format!("stderr: {stderr}")
    }
}

/// The first lines of a tool's stderr, on one line.
fn stderr_head(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut head = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .take(STDERR_LINES)
        .collect::<Vec<_>>()
        .join(" | ");
    if head.chars().count() > STDERR_CHARS {
        head = head.chars().take(STDERR_CHARS).collect::<String>() + "...";
    }
    head
}

/// One tool invocation.
pub struct Tool<'a> {
    program: &'a str,
    args: Vec<String>,
    input: Option<&'a [u8]>,
    limit: Duration,
}

impl<'a> Tool<'a> {
    /// `program` with `args`, no input, a one-minute limit.
    pub fn new(program: &'a str, args: &[&str]) -> Self {
        Tool {
            program,
            args: args.iter().map(|a| a.to_string()).collect(),
            input: None,
            limit: Duration::from_secs(60),
        }
    }

    /// Feeds `input` on stdin.
    pub fn input(mut self, input: &'a [u8]) -> Self {
        self.input = Some(input);
        self
    }

    /// Kills the tool if it runs longer than `limit`.
    pub fn limit(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// The command line, as errors and logs name it.
    pub fn command_line(&self) -> String {
        std::iter::once(self.program)
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Runs it; its stdout when it succeeds.
    pub fn run(self) -> Result<Vec<u8>, ToolError> {
        let command = self.command_line();
        let mut child = Command::new(self.program)
            .args(&self.args)
            .stdin(if self.input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| ToolError::Spawn {
                command: command.clone(),
                reason: err.to_string(),
            })?;
        let pid = child.id();
        children().insert(pid, None);
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let input = self.input;
        // Input and both outputs move on their own threads so a full pipe never stalls the tool.
        // Without those threads (a process limit reached) the tool is killed: its pipes close,
        // which ends the threads that did start.
        let (status, out, err) = std::thread::scope(|scope| {
            let helper = || std::thread::Builder::new().name("tool-pipe".into());
            let feeder = match (stdin, input) {
                // A tool that exits early closes its stdin: its exit status tells why.
                (Some(mut stdin), Some(input)) => Some(helper().spawn_scoped(scope, move || {
                    let _ = stdin.write_all(input);
                })),
                _ => None,
            };
            let out = helper().spawn_scoped(scope, move || read_all(stdout));
            let err = helper().spawn_scoped(scope, move || read_all(stderr));
            let (out, err) = match (feeder.transpose(), out, err) {
                (Ok(_), Ok(out), Ok(err)) => (out, err),
                (Err(reason), _, _) | (_, Err(reason), _) | (_, _, Err(reason)) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let reason = format!("cannot start a thread for its pipes: {reason}");
                    let command = command.clone();
                    return (Err(ToolError::Spawn { command, reason }), vec![], vec![]);
                }
            };
            let status = wait(&mut child, &command, self.limit);
            (
                status,
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default(),
            )
        });
        children().insert(pid, Some(Instant::now()));
        let status = status?;
        if status.success() {
            Ok(out)
        } else {
            Err(ToolError::Failed {
                command,
                ended: Ended::of(status),
                stderr: stderr_head(&err),
            })
        }
    }
}

fn read_all(pipe: Option<impl Read>) -> Vec<u8> {
    let mut buffer = Vec::new();
    if let Some(mut pipe) = pipe {
        let _ = pipe.read_to_end(&mut buffer);
    }
    buffer
}

/// Waits for the child, logging while it is slow and killing it past `limit`.
fn wait(
    child: &mut std::process::Child,
    command: &str,
    limit: Duration,
) -> Result<ExitStatus, ToolError> {
    let started = Instant::now();
    let mut next_log = SLOW_AFTER;
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) => {}
            Err(err) => {
                return Err(ToolError::Spawn {
                    command: command.to_string(),
                    reason: err.to_string(),
                });
            }
        }
        let elapsed = started.elapsed();
        if elapsed >= limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ToolError::TimedOut {
                command: command.to_string(),
                limit,
            });
        }
        if elapsed >= next_log {
            info!(command, waited = ?Duration::from_secs(elapsed.as_secs()), "Still waiting for a tool to finish");
            next_log += SLOW_AFTER;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_returns_stdout_and_feeds_stdin() {
        let out = Tool::new("cat", &[]).input(b"a\nb\n").run().unwrap();
        assert_eq!(out, b"a\nb\n");
        let big = vec![b'x'; 4 << 20];
        let out = Tool::new("cat", &[]).input(&big).run().unwrap();
        assert_eq!(
            out.len(),
            big.len(),
            "no pipe deadlock on large input and output"
        );
    }

    #[test]
    fn failures_name_the_command_how_it_ended_and_its_stderr() {
        let err = Tool::new("sh", &["-c", "echo first >&2; echo second >&2; exit 3"])
            .run()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "sh -c echo first >&2; echo second >&2; exit 3 exited with status 3: stderr: first | second"
        );
        let err = Tool::new("sh", &["-c", "kill -SEGV $$"]).run().unwrap_err();
        assert_eq!(
            err.to_string(),
            "sh -c kill -SEGV $$ was killed by signal 11 (SIGSEGV): nothing on stderr"
        );
        let err = Tool::new("no-such-tool-kprs", &[]).run().unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot run no-such-tool-kprs: "),
            "{err}"
        );
        let err = Tool::new("sleep", &["5"])
            .limit(Duration::from_millis(100))
            .run()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "sleep 5 did not finish within 100ms and was killed"
        );
    }

    #[test]
    fn stderr_is_cut_to_its_first_lines() {
        let many: String = (0..20).map(|i| format!("line {i}\n")).collect();
        assert_eq!(
            stderr_head(many.as_bytes()),
            "line 0 | line 1 | line 2 | line 3 | line 4"
        );
        let long = "x".repeat(2000);
        assert_eq!(stderr_head(long.as_bytes()).len(), STDERR_CHARS + 3);
    }
}
