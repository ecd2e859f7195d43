//! enimctl: look into and operate a running enimd.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use enim::clusterview;
use enim_api::model::Payload;
use enim_api::{AttachmentList, Client, ClientError, EniList, GcReport, GcRequest, Status};

#[derive(Parser, Debug)]
#[command(
    name = "enimctl",
    version,
    about = "Inspect and operate the enim node agent"
)]
struct Args {
    /// The agent's API socket.
    #[arg(long, env = "ENIM_SOCKET", default_value = enim_api::DEFAULT_SOCKET, global = true)]
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
    /// The whole cluster from the API server: who leads the operators,
    /// every node's ENIs and who holds each, what is quarantined. Exits 0
    /// when all is ready, 2 when something is not (each reason printed),
    /// 1 when the API server cannot be read.
    Cluster {
        /// Else $KUBECONFIG, ~/.kube/config, or the pod's ServiceAccount.
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
        /// The operator's namespace (its leader Lease).
        #[arg(long, default_value = "enim-system")]
        namespace: String,
        /// The operator's leader Lease.
        #[arg(long, default_value = "enim-operator")]
        lease: String,
        /// table, json or yaml (--json is json).
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// The chart's pre-delete hook: waits for its DaemonSet to clean every
    /// node of enim's CNI files, has the operator release every node's
    /// ENIs, scales the operator to 0 and deletes the released
    /// NetResourceSets. Exits 0 when all is done, 1 with what is left (a
    /// pod still holding an ENI, a node that cannot run the cleanup).
    Uninstall {
        /// Else $KUBECONFIG, ~/.kube/config, or the pod's ServiceAccount.
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
        /// The release's namespace.
        #[arg(long, default_value = "enim-system")]
        namespace: String,
        /// The node cleanup DaemonSet to wait for; none: nodes untouched.
        #[arg(long)]
        node_cleanup: Option<String>,
        /// The operator's Deployment; none: NetResourceSets untouched.
        #[arg(long)]
        operator: Option<String>,
        /// The operator's leader Lease, waited for after the scale to 0.
        #[arg(long, default_value = "enim-operator")]
        lease: String,
        /// How long all of it may take, e.g. "4m" (the global --timeout is
        /// the agent's).
        #[arg(long, default_value = "4m", value_parser = humantime::parse_duration)]
        within: Duration,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Table,
    Json,
    Yaml,
}

/// `enimctl cluster`'s exit when something is not ready (1 is an error).
const EXIT_NOT_READY: u8 = 2;

fn main() -> ExitCode {
    let args = Args::parse();
    if let Command::Cluster {
        kubeconfig,
        namespace,
        lease,
        output,
    } = &args.command
    {
        let output = if args.json { Output::Json } else { *output };
        return cluster(kubeconfig.as_deref(), namespace, lease, output);
    }
    if let Command::Uninstall {
        kubeconfig,
        namespace,
        node_cleanup,
        operator,
        lease,
        within,
    } = &args.command
    {
        let u = enim::uninstall::Uninstall {
            namespace: namespace.clone(),
            node_cleanup: node_cleanup.clone(),
            operator: operator.clone(),
            lease: lease.clone(),
            timeout: *within,
        };
        return uninstall(kubeconfig.as_deref(), &u);
    }
    let client = Client::new(&args.socket, Duration::from_secs(args.timeout));
    match run(&client, &args) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let mut msg = explain(&e);
            // Most errors already name the socket.
            let socket = args.socket.display().to_string();
            if !msg.contains(&socket) {
                msg += &format!(" (socket {socket})");
            }
            eprintln!("enimctl: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// `enimctl cluster`: reads, prints, and exits by readiness.
/// A client from `kubeconfig`, else the default chain.
async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, String> {
    match kubeconfig {
        Some(path) => enim_provider_cluster::kube_client(Some(path))
            .await
            .map_err(|e| e.to_string()),
        None => kube::Client::try_default()
            .await
            .map_err(|e| format!("no kubeconfig and not in a pod: {e}")),
    }
}

/// Runs `f` with a client of the API server, on a runtime of its own.
fn with_api<T, F, Fut>(kubeconfig: Option<&std::path::Path>, f: F) -> Result<T, String>
where
    F: FnOnce(kube::Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))?;
    runtime.block_on(async { f(kube_client(kubeconfig).await?).await })
}

fn uninstall(kubeconfig: Option<&std::path::Path>, u: &enim::uninstall::Uninstall) -> ExitCode {
    let done = with_api(kubeconfig, |client| async move {
        enim::uninstall::run(client, u)
            .await
            .map_err(|e| enim_core::with_causes(&e))
    });
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("enimctl uninstall: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cluster(
    kubeconfig: Option<&std::path::Path>,
    namespace: &str,
    lease: &str,
    output: Output,
) -> ExitCode {
    let view = with_api(kubeconfig, |client| async move {
        clusterview::gather(
            client,
            namespace,
            lease,
            k8s_openapi::jiff::Timestamp::now(),
        )
        .await
        .map_err(|e| enim_core::with_causes(&e))
    });
    let view = match view {
        Ok(v) => v,
        Err(e) => {
            eprintln!("enimctl: {e}");
            return ExitCode::FAILURE;
        }
    };
    let printed = match output {
        Output::Table => Ok(clusterview::table(&view)),
        Output::Json => serde_json::to_string_pretty(&view)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string()),
        Output::Yaml => serde_yaml::to_string(&view).map_err(|e| e.to_string()),
    };
    match printed {
        Ok(s) => print!("{s}"),
        Err(e) => {
            eprintln!("enimctl: printing the view: {e}");
            return ExitCode::FAILURE;
        }
    }
    match view.not_ready.is_empty() {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(EXIT_NOT_READY),
    }
}

/// The error with what lies under it: the agent's code and details, or
/// the OS error behind a failed connect.
fn explain(e: &ClientError) -> String {
    let mut out = e.to_string();
    match e {
        ClientError::Api { status, error } => {
            out += &format!(" (HTTP {status}, code {})", error.code);
            if !error.details.is_empty() {
                out += &format!(": {}", error.details);
            }
        }
        ClientError::Status { body, .. } if !body.is_empty() => out += &format!(": {body}"),
        ClientError::CutShort { details, .. } | ClientError::Malformed { details, .. }
            if !details.is_empty() =>
        {
            out += &format!(": {details}")
        }
        _ => out = enim_core::with_causes(e),
    }
    out
}

fn run(client: &Client, args: &Args) -> Result<String, ClientError> {
    match &args.command {
        Command::Status => {
            let s: Status = client.get(enim_api::ROUTE_STATUS)?;
            if args.json {
                return Ok(pretty(&s));
            }
            let degraded = s
                .degraded
                .as_ref()
                .map(|why| format!("degraded: {why}\n"))
                .unwrap_or_default();
            // Secondary mode: the address pool, free meaning neither held
            // nor cooling down.
            let addresses = s
                .addresses
                .map(|a| {
                    let lost = if a.lost > 0 {
                        format!(
                            ", {} lost (unassigned from outside, kept for their pods)",
                            a.lost
                        )
                    } else {
                        String::new()
                    };
                    format!(
                        "addresses: {} in all, {} assigned, {} cooling, {} free{lost}\n",
                        a.total,
                        a.assigned,
                        a.cooling,
                        a.total - a.assigned - a.cooling
                    )
                })
                .unwrap_or_default();
            Ok(degraded
                + &addresses
                + &table(
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
            let list: EniList = client.get(enim_api::ROUTE_ENIS)?;
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
                            (enim_api::EniState::Excluded | enim_api::EniState::Missing, _)
                            | (_, None) => "-".into(),
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
            let list: AttachmentList = client.get(enim_api::ROUTE_ATTACHMENTS)?;
            if args.json {
                return Ok(pretty(&list));
            }
            Ok(attachments_table(list))
        }
        Command::Gc { network } => {
            let report: GcReport = client.post(
                enim_api::ROUTE_GC,
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
                    "RECORDS DROPPED",
                    "ORPHANS RELEASED",
                    "NORMALISED",
                    "BACK IN SERVICE",
                    "SWEPT",
                    "TOO YOUNG",
                    "ERRORS",
                ],
                vec![vec![
                    list(&report.collected),
                    list(&report.records_dropped),
                    list(&report.orphans_released),
                    list(&report.normalised),
                    list(&report.back_in_service),
                    list(&report.swept),
                    report.too_young.to_string(),
                    list(
                        &report
                            .errors
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>(),
                    ),
                ]],
            ))
        }
        Command::Cluster { .. } => unreachable!("main runs `cluster` itself"),
        Command::Uninstall { .. } => unreachable!("main runs `uninstall` itself"),
    }
}

const ATTACHMENT_COLUMNS: [&str; 9] = [
    "POD",
    "NETWORK",
    "CONTAINER",
    "IFNAME",
    "MODE",
    "ENI",
    "IPV4",
    "PHASE",
    "NETNS",
];

/// Both modes' attachments, one row each: an exclusive ENI (primary mode)
/// or a secondary address of an ENI over a veth (secondary mode).
fn attachments_table(list: AttachmentList) -> String {
    let rows = list.attachments.into_iter().map(|a| {
        let (mode, ipv4) = match &a.payload {
            Payload::Primary(p) => ("exclusive", p.ipv4.to_string()),
            Payload::Secondary(s) => (
                "secondary",
                s.ipv4.map_or("-".into(), |v| format!("{v}/32")),
            ),
        };
        vec![
            a.pod.to_string(),
            a.key.network.clone(),
            short(&a.key.container_id),
            a.key.ifname.clone(),
            mode.into(),
            a.eni_id.clone(),
            ipv4,
            format!("{:?}", a.phase).to_lowercase(),
            a.netns.display().to_string(),
        ]
    });
    table(&ATTACHMENT_COLUMNS, rows.collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attachments_table_shows_both_modes() {
        let list: AttachmentList = serde_json::from_value(serde_json::json!({
            "attachments": [{
                "network": "enim", "container_id": "0123456789abcdef0123", "ifname": "eth0",
                "pod": {"namespace": "default", "name": "web-0", "uid": "u1"},
                "eni_id": "eni-0001", "mac": "02:e1:00:00:00:01", "host_name": "eth1",
                "host_mtu": 1500, "netns": "/var/run/netns/cni-1", "mtu": 9001,
                "ipv4": "10.0.1.10/24", "gateway4": "10.0.1.1", "phase": "ready",
                "created_ms": 1, "updated_ms": 1
            }, {
                "network": "enim", "container_id": "fedcba9876543210fedc", "ifname": "eth0",
                "pod": {"namespace": "default", "name": "db-0", "uid": "u2"},
                "eni_id": "eni-0002", "table": 1002, "rule_priority_to_pod": 512,
                "rule_priority_from_pod": 1536, "host_veth": "enim1a2b3c4d5e6",
                "netns": "/var/run/netns/cni-2", "mtu": 1500, "ipv4": "10.0.2.20",
                "phase": "adding", "created_ms": 1, "updated_ms": 1
            }]
        }))
        .unwrap();
        let out = attachments_table(list);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        let cells = |i: usize| lines[i].split_whitespace().collect::<Vec<_>>();
        assert_eq!(cells(0), ATTACHMENT_COLUMNS);
        assert_eq!(
            cells(1),
            [
                "default/web-0",
                "enim",
                "0123456789ab",
                "eth0",
                "exclusive",
                "eni-0001",
                "10.0.1.10/24",
                "ready",
                "/var/run/netns/cni-1"
            ]
        );
        assert_eq!(
            cells(2),
            [
                "default/db-0",
                "enim",
                "fedcba987654",
                "eth0",
                "secondary",
                "eni-0002",
                "10.0.2.20/32",
                "adding",
                "/var/run/netns/cni-2"
            ]
        );
    }
}
