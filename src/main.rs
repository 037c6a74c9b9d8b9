//! The `kube-proxy-rs` binary: parse flags and config, set up logging, run the daemon.

use std::process::ExitCode;

use kube_proxy_rs::config::{self, Command, Flags, NodeNameSources, VersionRequest};
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

/// Exit status for a configuration the program cannot use (sysexits' EX_USAGE).
const EXIT_BAD_CONFIG: u8 = 64;
/// Exit status for a command line it cannot read (upstream's, for flag errors).
const EXIT_BAD_FLAGS: u8 = 1;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("explain") {
        return explain(&args[1..]);
    }
    let flags = match Flags::parse_from(std::env::args().skip(1)) {
        Ok(flags) => flags,
        Err(err) => {
            eprintln!("Error: {err}\nRun 'kube-proxy-rs --help' for usage.");
            return ExitCode::from(EXIT_BAD_FLAGS);
        }
    };
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
    let sources = NodeNameSources {
        env_node_name: std::env::var("NODE_NAME").ok(),
        hostname: gethostname::gethostname().into_string().ok(),
    };
    let mut settings = match config::resolve(&flags, &sources) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("kube-proxy-rs: {err}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    if let VersionRequest::Set(version) = &flags.version {
        settings.reported_version = Some(version.clone());
    }
    match &flags.command {
        Some(Command::Render { files }) => return render(&flags, settings, files),
        Some(Command::PrintConfig) => return print_config(&settings.config, None),
        None => {}
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
        return print_config(&settings.config, Some(&path));
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

/// `print-config` (to stdout) and `--write-config-to` (to a file, then exit as upstream does).
fn print_config(
    config: &config::KubeProxyConfiguration,
    path: Option<&std::path::Path>,
) -> ExitCode {
    let text = match config::config_yaml(config) {
        Ok(text) => text,
        Err(err) => {
            eprintln!("kube-proxy-rs: cannot write the configuration: {err}");
            return ExitCode::FAILURE;
        }
    };
    let Some(path) = path else {
        print!("{text}");
        return ExitCode::SUCCESS;
    };
    match std::fs::write(path, text) {
        Ok(()) => {
            tracing::info!(file = %path.display(), "Wrote configuration");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("kube-proxy-rs: cannot write {}: {err}", path.display());
            ExitCode::FAILURE
        }
    }
}

/// `explain`: one packet's path through what this node programmed, read from the kernel.
fn explain(args: &[String]) -> ExitCode {
    let request = match kube_proxy_rs::explain::parse_args(args) {
        Ok(request) => request,
        Err(err) => {
            eprintln!("kube-proxy-rs explain: {err}");
            return ExitCode::from(EXIT_BAD_FLAGS);
        }
    };
    match kube_proxy_rs::explain::run(&request) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("kube-proxy-rs explain: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `render`: prints what would be programmed; objects that could not be used are listed on
/// stderr and make the exit status 1 (the rest is still printed).
fn render(flags: &Flags, mut settings: config::Settings, files: &[std::path::PathBuf]) -> ExitCode {
    if let Some(mode) = flags.proxy_mode() {
        settings.config.mode = mode;
        let errors = config::validate(&settings.config);
        if !errors.is_empty() {
            eprintln!("kube-proxy-rs: {}", config::ConfigError::Invalid(errors));
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    }
    for warning in &settings.warnings {
        eprintln!("kube-proxy-rs render: warning: {warning}");
    }
    match kube_proxy_rs::preview::render(&settings.config, &settings.node_name, files) {
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
