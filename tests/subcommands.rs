//! The subcommands as a newcomer meets them: each `--help` exits 0 and names every flag the
//! subcommand takes, `help COMMAND` says the same, a mistyped flag or subcommand gets the
//! closest name, and a bad command line exits 1.

use std::process::{Command, Output};

use kube_proxy_rs::config::{Role, specs};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("NODE_NAME")
        .output()
        .expect("run the binary")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `SUB --help` exits 0, names each of `flags` and has an example; `help SUB` prints the same.
fn help_names(sub: &str, flags: &[String]) {
    let help = run(&[sub, "--help"]);
    assert_eq!(
        help.status.code(),
        Some(0),
        "{sub} --help: {}",
        stderr(&help)
    );
    let text = stdout(&help);
    for flag in flags {
        assert!(
            text.contains(flag.as_str()),
            "{sub} --help names {flag}:\n{text}"
        );
    }
    assert!(
        text.contains("Examples:\n  "),
        "{sub} --help has examples:\n{text}"
    );
    let via_help = run(&["help", sub]);
    assert_eq!(via_help.status.code(), Some(0));
    assert_eq!(stdout(&via_help), text, "help {sub} is {sub} --help");
}

fn flags(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| format!("--{name}")).collect()
}

/// The configuration flags `render` and `print-config` take and list: every flag of the
/// daemon's that configures it and is not deprecated (those are accepted, unlisted, as in the
/// daemon's help).
fn configuration_flags() -> Vec<String> {
    let offered: Vec<&str> = kube_proxy_rs::commands::configuration_flags()
        .map(|spec| spec.name)
        .collect();
    for spec in specs() {
        if matches!(spec.role, Role::Config(_) | Role::Logging(_)) {
            assert!(offered.contains(&spec.name), "--{} is offered", spec.name);
        }
    }
    for running in [
        "cleanup",
        "version",
        "init-only",
        "write-config-to",
        "dry-run",
    ] {
        assert!(!offered.contains(&running), "--{running} runs the daemon");
    }
    let flags: Vec<String> = kube_proxy_rs::commands::configuration_flags()
        .filter(|spec| !matches!(spec.role, Role::Deprecated(_) | Role::NoEffect(_)))
        .map(|spec| format!("--{}", spec.name))
        .collect();
    assert!(flags.len() > 40, "{flags:?}");
    flags
}

#[test]
fn explain_help_names_every_flag() {
    help_names(
        "explain",
        &flags(&["to", "from", "all", "mode", "config", "metrics", "output"]),
    );
}

#[test]
fn render_help_names_every_flag() {
    let mut expected = configuration_flags();
    expected.push("<FILE>...".into());
    help_names("render", &expected);
}

#[test]
fn print_config_help_names_every_flag() {
    help_names("print-config", &configuration_flags());
}

#[test]
fn completion_help_names_its_shells() {
    help_names("completion", &["bash", "zsh", "fish"].map(String::from));
    let script = run(&["completion", "bash"]);
    assert_eq!(script.status.code(), Some(0));
    let text = stdout(&script);
    for word in [
        "explain",
        "render",
        "print-config",
        "--to",
        "--hostname-override",
    ] {
        assert!(text.contains(word), "the bash completion knows {word}");
    }
}

#[test]
fn help_alone_is_the_daemons_usage_and_lists_the_subcommands() {
    let help = run(&["help"]);
    assert_eq!(help.status.code(), Some(0));
    assert_eq!(stdout(&help), stdout(&run(&["--help"])));
    for sub in ["explain", "render", "print-config", "completion", "help"] {
        assert!(
            stdout(&help).contains(&format!("kube-proxy-rs {sub} ")),
            "lists {sub}"
        );
    }
}

/// A mistyped flag exits 1 and names the closest one.
fn suggests(args: &[&str], closest: &str) {
    let output = run(args);
    assert_eq!(output.status.code(), Some(1), "{args:?}");
    let text = stderr(&output);
    assert!(
        text.contains(&format!("a similar argument exists: '{closest}'"))
            || text.contains(&format!("a similar value exists: '{closest}'"))
            || text.contains(&format!("a similar subcommand exists: '{closest}'")),
        "{args:?} suggests {closest}:\n{text}"
    );
}

#[test]
fn explain_suggests_the_closest_flag() {
    suggests(&["explain", "--too", "10.96.0.10:80"], "--to");
    suggests(
        &["explain", "--to", "10.96.0.10:80", "--ouput", "json"],
        "--output",
    );
}

#[test]
fn render_suggests_the_closest_flag() {
    suggests(
        &["render", "--hostname-overide", "n", "-"],
        "--hostname-override",
    );
}

#[test]
fn print_config_suggests_the_closest_flag() {
    suggests(&["print-config", "--proxymode=ipvs"], "--proxy-mode");
    suggests(
        &["print-config", "--cluster-cdr=10.0.0.0/8"],
        "--cluster-cidr",
    );
}

#[test]
fn completion_suggests_the_closest_shell() {
    suggests(&["completion", "bsh"], "bash");
}

#[test]
fn a_mistyped_subcommand_gets_the_closest_name() {
    suggests(&["explian", "--to", "10.96.0.10:80"], "explain");
    suggests(&["print-confg"], "print-config");
}

#[test]
fn explain_wants_a_destination_or_all_and_not_both() {
    let neither = run(&["explain"]);
    assert_eq!(neither.status.code(), Some(1));
    assert!(stderr(&neither).contains("--to"), "{}", stderr(&neither));
    let both = run(&["explain", "--to", "10.96.0.10:80", "--all"]);
    assert_eq!(both.status.code(), Some(1));
    let bad_flow = run(&["explain", "--to", "10.96.0.10"]);
    assert_eq!(bad_flow.status.code(), Some(1));
    assert!(
        stderr(&bad_flow).starts_with("kube-proxy-rs explain: "),
        "{}",
        stderr(&bad_flow)
    );
}

#[test]
fn configuration_flags_keep_the_daemons_rules_and_exit_codes() {
    // Read as the daemon reads them, in any order around the subcommand's name.
    let before = run(&["--hostname-override=n", "--proxy-mode=ipvs", "print-config"]);
    let after = run(&[
        "print-config",
        "--hostname-override=n",
        "--proxy-mode",
        "ipvs",
    ]);
    assert_eq!(before.status.code(), Some(0), "{}", stderr(&before));
    assert_eq!(stdout(&before), stdout(&after));
    assert!(stdout(&after).contains("mode: ipvs"));
    // A value the daemon's reader refuses: exit 1, as for the daemon.
    let bad_value = run(&["print-config", "--conntrack-min=many"]);
    assert_eq!(bad_value.status.code(), Some(1));
    assert!(
        stderr(&bad_value).contains("--conntrack-min"),
        "{}",
        stderr(&bad_value)
    );
    // A configuration validation refuses: exit 64 naming the field and the value.
    let invalid = run(&["print-config", "--iptables-masquerade-bit=99"]);
    assert_eq!(invalid.status.code(), Some(64));
    assert!(
        stderr(&invalid).contains("iptables.masqueradeBit: invalid value \"99\""),
        "{}",
        stderr(&invalid)
    );
    // Names with `_` for `-`, as pflag reads them.
    let underscores = run(&[
        "print-config",
        "--hostname_override=n",
        "--proxy_mode",
        "ipvs",
    ]);
    assert_eq!(
        stdout(&underscores),
        stdout(&after),
        "{}",
        stderr(&underscores)
    );
    // A retired flag a distribution still passes is accepted, as by the daemon.
    let retired = run(&[
        "print-config",
        "--hostname-override=n",
        "--log-dir=/var/log",
    ]);
    assert_eq!(retired.status.code(), Some(0), "{}", stderr(&retired));
}
