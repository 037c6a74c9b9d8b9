//! The `kube-proxy-rs` binary: a subcommand's command line goes to `commands`; the daemon's
//! is read as upstream's (flags, config), then logging is set up and the daemon runs.

use std::process::ExitCode;

use kube_proxy_rs::commands::{self, EXIT_BAD_CONFIG, EXIT_BAD_FLAGS};
use kube_proxy_rs::config::{self, Flags, VersionRequest};
use kube_proxy_rs::{daemon, logging};
use tokio::sync::watch;

#[cfg(all(feature = "mimalloc", not(feature = "jemalloc")))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// jemalloc gives memory back to the system after a full sync's peak, which glibc's malloc
/// mostly keeps (docs/benchmarks.md, Memory).
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The daemon takes no arguments (an empty one is ignored, as upstream's does): a first word
    // is a subcommand's name, or a mistyped one that clap suggests the closest name for.
    if args
        .first()
        .is_some_and(|first| !first.is_empty() && !first.starts_with('-'))
    {
        return commands::run(args, 0);
    }
    let flags = match Flags::parse_from(&args) {
        Ok(flags) => flags,
        Err(err) => {
            eprintln!("Error: {err}\nRun 'kube-proxy-rs --help' for usage.");
            return ExitCode::from(EXIT_BAD_FLAGS);
        }
    };
    if let Some(at) = flags.subcommand_at {
        return commands::run(args, at);
    }
    if flags.help {
        print!("{}", config::usage());
        return ExitCode::SUCCESS;
    }
    match &flags.version {
        VersionRequest::Print => {
            println!("{}", daemon::version_line());
            return ExitCode::SUCCESS;
        }
        VersionRequest::Raw => {
            println!("{}", daemon::version_raw());
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    let mut settings = match config::resolve(&flags, &commands::node_name_sources()) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("kube-proxy-rs: {err}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    if let VersionRequest::Set(version) = &flags.version {
        settings.reported_version = Some(version.clone());
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
    for warning in &settings.warnings {
        tracing::warn!("{warning}");
    }
    if let Some(path) = flags.write_config_to() {
        return commands::write_config(&settings.config, Some(&path));
    }
    if flags.cleanup() {
        daemon::cleanup();
        return ExitCode::SUCCESS;
    }
    if flags.init_only() {
        daemon::init_only(&settings);
        return ExitCode::SUCCESS;
    }
    let options = daemon::RunOptions {
        dry_run: flags.dry_run,
        ipvs_fallback: flags.ipvs_fallback.unwrap_or(true),
        exit_on_config_change: flags.exit_on_config_change.unwrap_or(true),
        offload_packet_threshold: flags.offload_packet_threshold.unwrap_or(0),
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
