//! Every example the subcommands' help shows is a command line they accept.

use super::*;

/// The example lines of every subcommand's help, from `kube-proxy-rs` on.
fn examples() -> Vec<String> {
    let mut lines = Vec::new();
    for sub in command().get_subcommands_mut() {
        let help = sub.render_long_help().to_string();
        let (_, examples) = help.split_once("Examples:\n").expect("examples");
        for line in examples.lines().filter(|line| !line.trim().is_empty()) {
            let (_, from_program) = line.split_once("kube-proxy-rs ").expect("the program");
            // Up to a shell's redirection or the end of a process substitution.
            let command = from_program.split([' ', ')']).take_while(|w| *w != ">");
            lines.push(command.collect::<Vec<_>>().join(" "));
        }
    }
    lines
}

#[test]
fn every_example_is_a_command_line_the_subcommands_accept() {
    let examples = examples();
    assert!(examples.len() >= 8, "{examples:?}");
    for example in examples {
        let words = std::iter::once(PROGRAM).chain(example.split_whitespace());
        let matches = command().try_get_matches_from(words);
        assert!(matches.is_ok(), "{example}: {}", matches.err().unwrap());
        let Some(("explain", explain)) = matches.as_ref().ok().and_then(|m| m.subcommand()) else {
            continue;
        };
        if let Some(to) = explain.get_one::<String>("to") {
            let from = explain.get_one::<String>("from").map(String::as_str);
            let flow = crate::proxier::explanation::Flow::parse(to, from);
            assert!(flow.is_ok(), "{example}: {}", flow.err().unwrap());
        }
    }
}

#[test]
fn the_configuration_flags_go_back_to_the_daemons_reader_in_order() {
    let matches = command()
        .try_get_matches_from([
            PROGRAM,
            "print-config",
            "--nodeport-addresses=10.0.0.0/8",
            "--masquerade-all",
            "-v",
            "4",
            "--nodeport-addresses",
            "primary",
        ])
        .expect("accepted");
    let (_, print_config) = matches.subcommand().expect("a subcommand");
    assert_eq!(
        config_flags::given(print_config),
        [
            "--nodeport-addresses=10.0.0.0/8",
            "--masquerade-all=true",
            "--v=4",
            "--nodeport-addresses=primary",
        ]
    );
}
