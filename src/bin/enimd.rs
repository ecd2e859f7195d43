//! enimd: the enim node agent.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use enim::daemon::config::{Config, LogFormat};

#[derive(Parser, Debug)]
#[command(
    name = "enimd",
    version,
    about = "enim node agent: hands whole ENIs to pods"
)]
struct Args {
    /// Config file (TOML).
    #[arg(
        long,
        short,
        env = "ENIMD_CONFIG",
        default_value = "/etc/enim/enimd.toml"
    )]
    config: PathBuf,
    /// API socket path (overrides the config).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Checkpoint file (overrides the config).
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Namespace ENIs live in when free (overrides the config).
    #[arg(long)]
    host_netns: Option<PathBuf>,
    /// GC period, e.g. "10s"; "0s" disables the loop (overrides the config).
    #[arg(long, value_parser = humantime::parse_duration)]
    gc_interval: Option<Duration>,
    /// Log format (overrides the config).
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut config = match Config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("enimd: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(v) = args.socket {
        config.socket = v;
    }
    if let Some(v) = args.checkpoint {
        config.checkpoint = v;
    }
    if let Some(v) = args.host_netns {
        config.host_netns = Some(v);
    }
    if let Some(v) = args.gc_interval {
        config.gc_interval = v;
    }
    if let Some(v) = args.log_format {
        config.log_format = v;
    }
    init_logging(config.log_format);

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("enimd: starting runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(enim::daemon::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "enimd failed");
            eprintln!("enimd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("ENIMD_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
