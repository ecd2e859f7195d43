//! enimd: the enim node agent.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use enim::daemon::config::{Config, LogFormat};
use enim::daemon::install::{self, CniInstall, InstallError, PortmapChoice, PortmapMode};
use enim::deviceplugin::{self, relay};

/// Without a subcommand enimd runs the agent, so the flags below keep
/// working as before; they cannot be mixed with a subcommand.
#[derive(Parser, Debug)]
#[command(
    name = "enimd",
    version,
    about = "enim node agent: hands whole ENIs to pods",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(flatten)]
    run: Args,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Install the `enim` CNI plugin and its conflist on this node, each
    /// atomically (temp file, fsync, rename), then exit. Idempotent.
    InstallCni(InstallCniArgs),
    /// Remove what install-cni put on this node: enim's conflist (under
    /// its name and any previous default name; a file there of another
    /// CNI is left) and the plugin. Idempotent. The chart's uninstall hook
    /// runs it on every node.
    UninstallCni(UninstallCniArgs),
    /// Serve the kubelet's device plugin API from a process of its own,
    /// with the device list of the enimd at --socket, so that enimd's
    /// restarts never end the kubelet's stream. Refuses to run beside an
    /// enimd whose own plugin is on ([device_plugin] enabled = true).
    DevicePlugin(DevicePluginArgs),
}

#[derive(clap::Args, Debug)]
struct DevicePluginArgs {
    /// enimd's API socket.
    #[arg(long, default_value = enim_api::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The kubelet's device plugin dir.
    #[arg(long, default_value = deviceplugin::DEFAULT_DIR)]
    dir: PathBuf,
    /// This plugin's socket, in --dir.
    #[arg(long, default_value = deviceplugin::DEFAULT_ENDPOINT)]
    endpoint: String,
    /// The kubelet's registration socket, in --dir.
    #[arg(long, default_value = deviceplugin::DEFAULT_KUBELET_SOCKET)]
    kubelet_socket: String,
    /// How often enimd is asked for its list, e.g. "1s".
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    poll: Duration,
    /// Log format [default: text].
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
}

#[derive(clap::Args, Debug)]
struct InstallCniArgs {
    /// The plugin binary to install [default: `enim` next to this enimd].
    #[arg(long)]
    plugin: Option<PathBuf>,
    #[command(flatten)]
    cni: CniPaths,
    /// enimd config whose `socket` goes into the conflist.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Agent socket for the conflist (overrides --config's) [default:
    /// /run/enim/enimd.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Chain the reference `portmap` plugin after enim, which is what makes
    /// a pod's hostPort work: `auto` when `<cni-bin-dir>/portmap` is an
    /// executable that speaks every CNI version of the conflist, `always`
    /// (an error if it is not there), or `never`.
    #[arg(long, value_enum, default_value_t = PortmapMode::Auto)]
    portmap: PortmapMode,
}

/// Where enim's CNI files are, for install-cni and uninstall-cni alike.
#[derive(clap::Args, Debug)]
struct CniPaths {
    /// Where the runtime looks for CNI plugins.
    #[arg(long, default_value = install::DEFAULT_CNI_BIN_DIR)]
    cni_bin_dir: PathBuf,
    /// Where the runtime looks for network configs.
    #[arg(long, default_value = install::DEFAULT_NET_D_DIR)]
    net_d_dir: PathBuf,
    /// File name of the conflist in the net.d dir.
    #[arg(long, default_value = install::DEFAULT_CONFLIST_NAME)]
    conflist_name: String,
    /// CNI network name in the conflist.
    #[arg(long, default_value = install::DEFAULT_NETWORK_NAME)]
    network_name: String,
}

#[derive(clap::Args, Debug)]
struct UninstallCniArgs {
    #[command(flatten)]
    cni: CniPaths,
    /// Once done, wait for SIGTERM or SIGINT before exiting, so that a
    /// DaemonSet's pod runs on.
    #[arg(long)]
    wait: bool,
    /// The agent's run dir (its socket's) as seen here: once the CNI files
    /// are gone, leave the uninstall marker there, so that the agent gives
    /// back its ENIs and removes its state when it stops. Skipped when the
    /// dir holds no agent's socket (`enimd.sock`): no agent runs here.
    #[arg(long)]
    mark_run_dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
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
    /// Serve /metrics, /healthz and /readyz on this address (e.g. the
    /// node's IP, the downward API's status.hostIP) at metrics_address's
    /// port, for Prometheus in the cluster.
    #[arg(long, env = "ENIMD_METRICS_HOST")]
    metrics_host: Option<std::net::IpAddr>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::InstallCni(args)) => install_cni(args),
        Some(Command::UninstallCni(args)) => uninstall_cni(args),
        Some(Command::DevicePlugin(args)) => device_plugin(args),
        None => run_agent(cli.run),
    }
}

fn install_cni(args: InstallCniArgs) -> ExitCode {
    let socket = match (args.socket, &args.config) {
        (Some(socket), _) => socket,
        (None, Some(path)) => match Config::load(path) {
            Ok(c) => c.socket,
            Err(e) => {
                eprintln!("enimd install-cni: {e}");
                return ExitCode::from(2);
            }
        },
        (None, None) => enim_api::DEFAULT_SOCKET.into(),
    };
    let plugin = match args.plugin {
        Some(p) => p,
        None => match install::default_plugin_path() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("enimd install-cni: locating enimd's own dir: {e} (pass --plugin)");
                return ExitCode::FAILURE;
            }
        },
    };
    let opts = CniInstall {
        plugin,
        cni_bin_dir: args.cni.cni_bin_dir,
        net_d_dir: args.cni.net_d_dir,
        conflist_name: args.cni.conflist_name,
        network_name: args.cni.network_name,
        socket,
        portmap: args.portmap,
    };
    match install::install_cni(&opts) {
        Ok(done) => {
            let word = |o| match o {
                install::Outcome::Created => "created",
                install::Outcome::Replaced => "replaced",
                install::Outcome::Unchanged => "unchanged",
            };
            println!("{}: {}", done.plugin.display(), word(done.plugin_outcome));
            println!(
                "{}: {}",
                done.conflist.display(),
                word(done.conflist_outcome)
            );
            for old in &done.removed {
                println!("{}: removed (enim's previous conflist name)", old.display());
            }
            match &done.portmap {
                PortmapChoice::Chained { path } => {
                    println!("{}: chained after enim (hostPort)", path.display())
                }
                PortmapChoice::Off => {}
                PortmapChoice::Unusable(problem) => eprintln!(
                    "enimd install-cni: hostPort will not work: portmap is not in the \
                     conflist: {problem}"
                ),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("enimd install-cni: {e}");
            match e {
                InstallError::Invalid(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

fn uninstall_cni(args: UninstallCniArgs) -> ExitCode {
    // Blocked before any work, so a SIGTERM that comes early is kept for
    // the wait below instead of killing the process half-way.
    let signals = {
        let mut set = nix::sys::signal::SigSet::empty();
        set.add(nix::sys::signal::Signal::SIGTERM);
        set.add(nix::sys::signal::Signal::SIGINT);
        set
    };
    if args.wait {
        if let Err(e) = signals.thread_block() {
            eprintln!("enimd uninstall-cni: blocking SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    }
    let opts = install::CniUninstall {
        cni_bin_dir: args.cni.cni_bin_dir,
        net_d_dir: args.cni.net_d_dir,
        conflist_name: args.cni.conflist_name,
        network_name: args.cni.network_name,
    };
    let done = match install::uninstall_cni(&opts) {
        Ok(done) => done,
        Err(e) => {
            eprintln!("enimd uninstall-cni: {e}");
            return match e {
                InstallError::Invalid(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            };
        }
    };
    for (path, removal) in done.conflists.iter().chain([&done.plugin]) {
        let word = match removal {
            install::Removal::Removed => "removed",
            install::Removal::Absent => "not there",
            install::Removal::NotEnims => "left: not enim's",
        };
        println!("{}: {word}", path.display());
    }
    if let Some(dir) = &args.mark_run_dir {
        match enim::daemon::leave::request(dir) {
            Ok(Some(marker)) => println!(
                "{}: written; the agent leaves the node when it stops",
                marker.display()
            ),
            Ok(None) => println!("{}: no agent's socket, so no marker", dir.display()),
            Err(e) => {
                eprintln!(
                    "enimd uninstall-cni: leaving the uninstall marker in {}: {e}",
                    dir.display()
                );
                return ExitCode::FAILURE;
            }
        }
    }
    if args.wait {
        println!("this node is clean of enim's CNI files; waiting for SIGTERM");
        match signals.wait() {
            Ok(signal) => println!("{signal}: exiting"),
            Err(e) => {
                eprintln!("enimd uninstall-cni: waiting for SIGTERM: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

fn device_plugin(args: DevicePluginArgs) -> ExitCode {
    init_logging(args.log_format.unwrap_or_default());
    let config = relay::RelayConfig {
        socket: args.socket,
        plugin: deviceplugin::DevicePluginConfig {
            enabled: true,
            dir: args.dir,
            kubelet_socket: args.kubelet_socket,
            endpoint: args.endpoint,
        },
        poll: args.poll,
    };
    // One thread is plenty: a poll a second and the kubelet's few calls.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("enimd device-plugin: starting runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Dropped after block_on: the client owns a runtime of its own, which
    // may not be dropped inside this one.
    let client = std::sync::Arc::new(enim_api::Client::new(
        config.socket.clone(),
        relay::ANSWER_WITHIN,
    ));
    let served = runtime.block_on(async {
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let stop_signal = enim::daemon::stop_signal("stopping")
            .map_err(|e| format!("installing signal handlers: {e}"))?;
        tokio::spawn(async move {
            stop_signal.await;
            let _ = stop_tx.send(true);
        });
        relay::run(config, client.clone(), stop)
            .await
            .map_err(|e| e.to_string())
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "enimd device-plugin failed");
            eprintln!("enimd device-plugin: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_agent(args: Args) -> ExitCode {
    let mut config = match Config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("enimd: {e}");
            // Still a sign of life for STATUS (docs/architecture.md, "Restarts"): a
            // crash loop on a broken config must not make the node
            // NotReady. The socket's path is the flag's or the default.
            let socket = args
                .socket
                .unwrap_or_else(|| enim_api::DEFAULT_SOCKET.into());
            let renewed = enim_api::note::boot_id()
                .map_err(Into::into)
                .and_then(|boot| {
                    enim::daemon::note::renew(&enim_api::note::note_path(&socket), &boot)
                });
            if let Err(e) = renewed {
                eprintln!("enimd: could not renew the status note: {e}");
            }
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
    if let Some(host) = args.metrics_host {
        if let Err(e) = config.serve_metrics_on(host) {
            eprintln!("enimd: {e}");
            return ExitCode::from(2);
        }
    }
    init_logging(config.log_format);

    enim::daemon::heap::limit_arenas();
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
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("ENIMD_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal, never in a pod's log.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
