//! Runs the test API server on its own, for the sandbox: loads objects from YAML files, writes a
//! kubeconfig, and serves until interrupted. Change objects with plain HTTP (curl -X PUT/PATCH/DELETE).

use std::process::ExitCode;

use test_apiserver::{ApiServer, Options, objects_from_yaml};

const USAGE: &str =
    "usage: test-apiserver [--listen IP:PORT] [--kubeconfig-out PATH] [FILE.yaml ...]";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut options = Options::default();
    let mut kubeconfig_out = None;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => match args.next().and_then(|a| a.parse().ok()) {
                Some(addr) => options.addr = addr,
                None => return usage("--listen needs IP:PORT"),
            },
            "--kubeconfig-out" => match args.next() {
                Some(path) => kubeconfig_out = Some(path),
                None => return usage("--kubeconfig-out needs a path"),
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ if arg.starts_with('-') => return usage(&format!("unknown flag {arg}")),
            _ => files.push(arg),
        }
    }
    let server = match ApiServer::start_with(options).await {
        Ok(server) => server,
        Err(err) => return fail(&format!("cannot listen: {err}")),
    };
    for file in &files {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(err) => return fail(&format!("cannot read {file}: {err}")),
        };
        let objects = match objects_from_yaml(&text) {
            Ok(objects) => objects,
            Err(err) => return fail(&format!("{file}: {err}")),
        };
        for object in objects {
            if let Err(err) = server.apply(object) {
                return fail(&format!("{file}: {err:?}"));
            }
        }
    }
    if let Some(path) = kubeconfig_out
        && let Err(err) = std::fs::write(&path, server.kubeconfig_yaml())
    {
        return fail(&format!("cannot write {path}: {err}"));
    }
    println!("test-apiserver listening on {}", server.url());
    let _ = tokio::signal::ctrl_c().await;
    ExitCode::SUCCESS
}

fn usage(message: &str) -> ExitCode {
    eprintln!("test-apiserver: {message}\n{USAGE}");
    ExitCode::from(64)
}

fn fail(message: &str) -> ExitCode {
    eprintln!("test-apiserver: {message}");
    ExitCode::FAILURE
}
