//! `enim-vpcsim --config FILE`: the test rig's VPC simulator (see
//! `enim_testkit::vpc` for what it does and the file's format). Runs until
//! SIGTERM or SIGINT; the devices it made stay for the next run to adopt.

use std::path::PathBuf;
use std::process::ExitCode;

use enim_testkit::vpc::{Ec2Access, VpcConfig, VpcSim};
use serde::Deserialize;

/// The config file: the simulator's settings and a `[moto]` table.
#[derive(Deserialize)]
struct File {
    #[serde(flatten)]
    vpc: VpcConfig,
    moto: Ec2Access,
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
