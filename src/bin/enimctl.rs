//! enimctl: look into and operate a running enimd.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use enim::api::{self, AttachmentList, EniList, GcReport, GcRequest, Status};
use enim::cni::client::Client;
use enim::cni::CniError;

#[derive(Parser, Debug)]
#[command(
    name = "enimctl",
    version,
    about = "Inspect and operate the enim node agent"
)]
struct Args {
    /// The agent's API socket.
    #[arg(long, env = "ENIM_SOCKET", default_value = api::DEFAULT_SOCKET, global = true)]
    socket: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Give up on the agent after this many seconds.
    #[arg(long, default_value_t = 30, global = true)]
    timeout: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Is the agent ready; its provider, ENIs and attachments in numbers.
    Status,
    /// Every ENI of this node: free or in use, and by whom.
    Enis,
    /// Every attachment the agent records.
    Attachments,
    /// Run a GC pass now and show what it did.
    Gc {
        /// Only this network's attachments.
        #[arg(long)]
        network: Option<String>,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let client = Client::new(&args.socket, Duration::from_secs(args.timeout));
    match run(&client, &args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("enimctl: {e} (socket {})", args.socket.display());
            ExitCode::FAILURE
        }
    }
}

fn run(client: &Client, args: &Args) -> Result<String, CniError> {
    match &args.command {
        Command::Status => {
            let s: Status = client.get(api::ROUTE_STATUS)?;
            if args.json {
                return Ok(pretty(&s));
            }
            Ok(table(
                &[
                    "READY",
                    "PROVIDER",
                    "ENIS",
                    "FREE",
                    "ATTACHMENTS",
                    "UPTIME",
                    "VERSION",
                ],
                vec![vec![
                    s.ready.to_string(),
                    s.provider,
                    s.enis_total.to_string(),
                    s.enis_free.to_string(),
                    s.attachments.to_string(),
                    humantime::format_duration(Duration::from_secs(s.uptime_secs)).to_string(),
                    s.version,
                ]],
            ))
        }
        Command::Enis => {
            let list: EniList = client.get(api::ROUTE_ENIS)?;
            if args.json {
                return Ok(pretty(&list));
            }
            let rows = list
                .enis
                .into_iter()
                .map(|s| {
                    let state = serde_json::to_value(s.state)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default();
                    vec![
                        s.eni.id,
                        s.eni.mac.to_string(),
                        s.eni.ipv4.to_string(),
                        s.eni.ipv6.map_or("-".into(), |v| v.to_string()),
                        state,
                        match (&s.state, s.eni.owner) {
                            (api::EniState::Excluded, _) | (_, None) => "-".into(),
                            (_, Some(o)) => o.to_string(),
                        },
                        s.host_device.unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            Ok(table(
                &[
                    "ENI",
                    "MAC",
                    "IPV4",
                    "IPV6",
                    "STATE",
                    "OWNER",
                    "HOST DEVICE",
                ],
                rows,
            ))
        }
        Command::Attachments => {
            let list: AttachmentList = client.get(api::ROUTE_ATTACHMENTS)?;
            if args.json {
                return Ok(pretty(&list));
            }
            let rows = list
                .attachments
                .into_iter()
                .map(|a| {
                    vec![
                        a.pod.to_string(),
                        a.key.network.clone(),
                        short(&a.key.container_id),
                        a.key.ifname.clone(),
                        a.eni_id.clone(),
                        a.ipv4.to_string(),
                        format!("{:?}", a.phase).to_lowercase(),
                        a.netns.display().to_string(),
                    ]
                })
                .collect();
            Ok(table(
                &[
                    "POD",
                    "NETWORK",
                    "CONTAINER",
                    "IFNAME",
                    "ENI",
                    "IPV4",
                    "PHASE",
                    "NETNS",
                ],
                rows,
            ))
        }
        Command::Gc { network } => {
            let report: GcReport = client.post(
                api::ROUTE_GC,
                &GcRequest {
                    network: network.clone(),
                    valid_attachments: None,
                },
            )?;
            if args.json {
                return Ok(pretty(&report));
            }
            let list = |v: &[String]| {
                if v.is_empty() {
                    "-".to_string()
                } else {
                    v.join(", ")
                }
            };
            Ok(table(
                &[
                    "COLLECTED",
                    "ORPHANS RELEASED",
                    "NORMALISED",
                    "TOO YOUNG",
                    "ERRORS",
                ],
                vec![vec![
                    list(&report.collected),
                    list(&report.orphans_released),
                    list(&report.normalised),
                    report.too_young.to_string(),
                    list(&report.errors),
                ]],
            ))
        }
    }
}

/// Container ids are 64 hex digits; 12 are enough to tell them apart.
fn short(id: &str) -> String {
    id.chars().take(12).collect()
}

/// Left-aligned columns, two spaces apart.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows.iter()) {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn pretty<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default() + "\n"
}
