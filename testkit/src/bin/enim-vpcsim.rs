//! `enim-vpcsim --config FILE`: the test rig's VPC simulator (see
//! `enim_testkit::vpc` for what it does and the file's format). Runs until
//! SIGTERM or SIGINT; the devices it made stay for the next run to adopt.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use enim_testkit::moto::{FaultProxy, Outage};
use enim_testkit::vpc::{Ec2Access, VpcConfig, VpcSim};
use serde::Deserialize;

/// The config file: the simulator's settings, a `[moto]` table and an
/// optional `[fault_proxy]`.
#[derive(Deserialize)]
struct File {
    #[serde(flatten)]
    vpc: VpcConfig,
    moto: Ec2Access,
    fault_proxy: Option<FaultProxyConfig>,
}

/// A fault proxy in front of moto, for the cluster's cloud clients: what
/// `control_file` holds (`unavailable`, `throttled`; absent or empty:
/// none) is the outage every call through it answers, read every 200 ms.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultProxyConfig {
    listen: SocketAddr,
    control_file: PathBuf,
}

/// Serves the fault proxy until the process ends, following its control
/// file; logs each change of outage with the faulted calls so far.
async fn run_fault_proxy(cfg: FaultProxyConfig, upstream: String) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| format!("fault proxy: binding {}: {e}", cfg.listen))?;
    let proxy = FaultProxy::start_on(listener, &upstream);
    eprintln!("enim-vpcsim: fault proxy on {} for {upstream}", proxy.url);
    tokio::spawn(async move {
        let mut now = Outage::None;
        loop {
            let want = match tokio::fs::read_to_string(&cfg.control_file).await {
                Ok(text) => match text.trim() {
                    "" => Outage::None,
                    "unavailable" => Outage::Unavailable,
                    "throttled" => Outage::Throttled,
                    other => {
                        eprintln!("enim-vpcsim: fault proxy: {other:?} in {}: want unavailable or throttled", cfg.control_file.display());
                        now
                    }
                },
                Err(_) => Outage::None,
            };
            if want != now {
                eprintln!(
                    "enim-vpcsim: fault proxy: outage {now:?} -> {want:?} ({} calls faulted so far)",
                    proxy.faulted_total()
                );
                proxy.set_outage(want);
                now = want;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    });
    Ok(())
}

const USAGE: &str = "usage: enim-vpcsim --config FILE";

fn config_path() -> Result<PathBuf, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match &args[..] {
        [flag, path] if flag == "--config" => Ok(PathBuf::from(path)),
        _ => Err(USAGE.to_string()),
    }
}

fn load() -> Result<File, String> {
    let path = config_path()?;
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[tokio::main]
async fn main() -> ExitCode {
    let file = match load() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("enim-vpcsim: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(cfg) = file.fault_proxy {
        if let Err(e) = run_fault_proxy(cfg, file.moto.endpoint.clone()).await {
            eprintln!("enim-vpcsim: {e}");
            return ExitCode::FAILURE;
        }
    }
    let sim = match VpcSim::start(file.vpc, &file.moto).await {
        Ok(sim) => sim,
        Err(e) => {
            eprintln!("enim-vpcsim: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("enim-vpcsim: running");
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("enim-vpcsim: SIGTERM handler: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    sim.stop().await;
    eprintln!("enim-vpcsim: stopped");
    ExitCode::SUCCESS
}
