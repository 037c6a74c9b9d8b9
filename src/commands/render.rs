//! `render` and `print-config`: what the daemon would program, and the configuration it would
//! run with, for a command line of the daemon's configuration flags.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::{EXIT_BAD_CONFIG, EXIT_BAD_FLAGS, node_name_sources, write_config};
use crate::config::{self, Flags, Settings};

/// Print what this node would program for Services, EndpointSlices and its Node read from YAML
/// files, with no root and no cluster.
///
/// The files hold what `kubectl get -o yaml` prints (a List, or documents separated by `---`);
/// `-` reads standard input. The output is the mode's own text: the iptables-restore input,
/// the nftables transaction, or the virtual servers in `ipvsadm -Ln` form with kube-ipvs0's
/// addresses, the ipsets and the rules. Objects it cannot use are named on stderr and make the
/// exit status 1; the rest is printed. The mode and everything else come from the
/// configuration flags, as the daemon reads them (--proxy-mode wins over --config here).
#[derive(Args)]
#[command(after_help = RENDER_EXAMPLES)]
pub struct RenderArgs {
    /// YAML files of Services, EndpointSlices and Nodes (`-`: standard input).
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
}

const RENDER_EXAMPLES: &str = "\
Examples:
  kubectl get svc,endpointslices,nodes -A -o yaml | kube-proxy-rs render --hostname-override node-a -
  kube-proxy-rs render --config=/var/lib/kube-proxy/config.conf --proxy-mode=nftables objects.yaml";

/// Print the configuration the daemon would run with, defaulted and validated, as YAML.
///
/// The configuration flags combine with --config as the daemon combines them: with a file,
/// the file wins but for --hostname-override, --master and the logging flags. An invalid
/// configuration exits 64 naming the field and the value.
#[derive(Args)]
#[command(after_help = PRINT_CONFIG_EXAMPLES)]
pub struct PrintConfigArgs {}

const PRINT_CONFIG_EXAMPLES: &str = "\
Examples:
  kubectl -n kube-system exec ds/kube-proxy -- kube-proxy-rs print-config --config=/var/lib/kube-proxy/config.conf
  kube-proxy-rs print-config --proxy-mode=ipvs --cluster-cidr=10.244.0.0/16";

/// The settings the daemon would take from these flags, or the exit status of why not.
fn settings(command: &str, flags: &[String]) -> Result<(Flags, Settings), ExitCode> {
    let flags = Flags::parse_from(flags).map_err(|err| {
        eprintln!("kube-proxy-rs {command}: {err}");
        ExitCode::from(EXIT_BAD_FLAGS)
    })?;
    let settings = config::resolve(&flags, &node_name_sources()).map_err(|err| {
        eprintln!("kube-proxy-rs {command}: {err}");
        ExitCode::from(EXIT_BAD_CONFIG)
    })?;
    for warning in &settings.warnings {
        eprintln!("kube-proxy-rs {command}: warning: {warning}");
    }
    Ok((flags, settings))
}

/// `print-config`.
pub fn print_config(flags: Vec<String>) -> ExitCode {
    match settings("print-config", &flags) {
        Ok((_, settings)) => write_config(&settings.config, None),
        Err(status) => status,
    }
}

/// `render`: prints what would be programmed; objects that could not be used are listed on
/// stderr and make the exit status 1 (the rest is still printed).
pub fn render(args: &RenderArgs, flags: Vec<String>) -> ExitCode {
    let (flags, mut settings) = match settings("render", &flags) {
        Ok(read) => read,
        Err(status) => return status,
    };
    if let Some(mode) = flags.proxy_mode() {
        settings.config.mode = mode;
        let errors = config::validate(&settings.config);
        if !errors.is_empty() {
            eprintln!(
                "kube-proxy-rs render: {}",
                config::ConfigError::Invalid(errors)
            );
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    }
    match crate::preview::render(&settings.config, &settings.node_name, &args.files) {
        Ok(rendered) => {
            print!("{}", rendered.text);
            for problem in &rendered.problems {
                eprintln!("kube-proxy-rs render: skipped: {problem}");
            }
            if rendered.problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(err) => {
            eprintln!("kube-proxy-rs render: {err}");
            ExitCode::FAILURE
        }
    }
}
