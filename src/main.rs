//! The `kube-proxy-rs` binary: parse flags and config, set up logging, run the daemon.

use std::process::ExitCode;

use clap::Parser;
use kube_proxy_rs::config::{self, Command, Flags, NodeNameSources};
use kube_proxy_rs::{daemon, logging};
use tokio::sync::watch;

/// Exit status for a configuration the program cannot use (sysexits' EX_USAGE).
const EXIT_BAD_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let flags = Flags::parse();
    let sources = NodeNameSources {
        env_node_name: std::env::var("NODE_NAME").ok(),
        hostname: gethostname::gethostname().into_string().ok(),
    };
    let settings = match config::resolve(&flags, &sources) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("kube-proxy-rs: {err}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    if let Some(Command::Render { files }) = &flags.command {
        return render(&flags, settings, files);
    }
    if let Some(Command::PrintConfig) = flags.command {
        return match serde_yaml_ng::to_string(&settings.config) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("kube-proxy-rs: cannot print the configuration: {err}");
                ExitCode::FAILURE
            }
        };
    }
    let format = match logging::Format::parse(&settings.config.logging.format) {
        Ok(format) => format,
        Err(err) => {
            eprintln!("kube-proxy-rs: {err}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    if let Err(err) = logging::init(format, settings.config.logging.verbosity) {
        eprintln!("kube-proxy-rs: {err}");
        return ExitCode::FAILURE;
    }
    if flags.cleanup == Some(true) {
        daemon::cleanup();
        return ExitCode::SUCCESS;
    }
    let options = daemon::RunOptions {
        dry_run: flags.dry_run,
        ipvs_fallback: flags.ipvs_fallback.unwrap_or(true),
        exit_on_config_change: flags.exit_on_config_change.unwrap_or(true),
    };
    match run(settings, options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %format!("{err:#}"), "kube-proxy-rs stopped");
            eprintln!("kube-proxy-rs: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// `render`: prints what would be programmed; objects that could not be used are listed on
/// stderr and make the exit status 1 (the rest is still printed).
fn render(flags: &Flags, mut settings: config::Settings, files: &[std::path::PathBuf]) -> ExitCode {
    if let Some(mode) = &flags.proxy_mode {
        settings.config.mode = mode.clone();
        let errors = config::validate(&settings.config);
        if !errors.is_empty() {
            eprintln!("kube-proxy-rs: {}", config::ConfigError::Invalid(errors));
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    }
    match kube_proxy_rs::render::render(&settings.config, &settings.node_name, files) {
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

fn run(settings: config::Settings, options: daemon::RunOptions) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let (stop, shutdown) = watch::channel(false);
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("Received a stop signal");
            let _ = stop.send(true);
        });
        daemon::run(settings, options, shutdown).await?;
        Ok(())
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
