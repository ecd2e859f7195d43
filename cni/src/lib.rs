//! `enim-cni`: the `enim` CNI plugin (spec 1.1.0), what a container
//! runtime execs once per pod verb. It links `enim-api` and nothing of the
//! agent (no Kubernetes, gRPC, server or netlink code), so each exec loads
//! only a client.
//!
//! It is a thin, synchronous client of the node agent `enimd`: it checks
//! its inputs, forwards ADD, DEL, CHECK, GC and STATUS over the agent's
//! unix socket (with [`enim_api::Client`], built only for the verbs
//! that need the agent, never for VERSION) and turns the answer into a
//! CNI result of the version the configuration asks for.
//!
//! enimd's restarts are invisible to the runtime: ADD, DEL and CHECK wait
//! (bounded by `agentWaitSeconds`) for an enimd that is down or starting;
//! GC and STATUS answer at once, STATUS for the node's network rather than
//! for enimd's process ([`status`]).
//!
//! - [`env`]: CNI_* variables and CNI_ARGS.
//! - [`config`]: the network configuration on stdin.
//! - [`result`]: versioned results and prevResult chaining.
//! - [`status`]: what STATUS answers, and when.

pub mod config;
pub mod env;
pub mod error;
pub mod result;
pub mod status;

use std::ffi::OsString;
use std::io::{self, Read};
use std::time::{Duration, Instant};

use enim_api::model::AttachmentResult;
use enim_api::{
    code, AttachmentRequest, Client, ClientError, GcReport, GcRequest, MtuExpectation, ROUTE_ADD,
    ROUTE_CHECK, ROUTE_DEL, ROUTE_GC, STARTING,
};
use serde_json::{json, Value};

pub use config::{CniVersion, NetConf, SUPPORTED_VERSIONS};
pub use env::{CniEnv, Command};
pub use error::CniError;

/// What the process prints on stdout and exits with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: Option<String>,
    pub exit_code: i32,
}

/// Runs one invocation. `lookup` reads the environment; stdin carries the
/// network configuration.
pub fn execute(lookup: &dyn Fn(&str) -> Option<OsString>, stdin: impl Read) -> Outcome {
    // Errors are reported in the version the config asked for, once known.
    let mut version = CniVersion::LATEST;
    match run(lookup, stdin, &mut version) {
        Ok(None) => Outcome {
            stdout: None,
            exit_code: 0,
        },
        Ok(Some(v)) => Outcome {
            stdout: Some(pretty(&v)),
            exit_code: 0,
        },
        Err(e) => Outcome {
            stdout: Some(pretty(&e.to_json(version.as_str()))),
            exit_code: 1,
        },
    }
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    s.push('\n');
    s
}

fn run(
    lookup: &dyn Fn(&str) -> Option<OsString>,
    stdin: impl Read,
    version: &mut CniVersion,
) -> Result<Option<Value>, CniError> {
    let command = env::command(lookup)?;
    let input = config::read_stdin(stdin);

    if command == Command::Version {
        // VERSION must answer whatever it is given: it is how a runtime
        // learns what we speak.
        let asked = input
            .ok()
            .and_then(|b| config::requested_version(&b))
            .unwrap_or(CniVersion::LATEST);
        return Ok(Some(json!({
            "cniVersion": asked.as_str(),
            "supportedVersions": SUPPORTED_VERSIONS,
        })));
    }

    let input = input?;
    if let Some(v) = config::requested_version(&input) {
        *version = v;
    }
    let conf = NetConf::parse(&input)?;
    let env = CniEnv::from_lookup(lookup)?;
    let client = Client::new(conf.socket.clone(), conf.timeout);

    match command {
        Command::Add => add(&client, conf, env),
        Command::Del => {
            // prevResult is of no use to DEL: the agent has the record.
            let req = attachment_request(&conf, env);
            waiting(conf.agent_wait, || client.post_ignore(ROUTE_DEL, &req))?;
            Ok(None)
        }
        Command::Check => check(&client, conf, env),
        // GC and STATUS answer at once: the runtime polls STATUS, and GC
        // is a sweep any later pass redoes.
        Command::Gc => gc(&client, conf),
        Command::Status => status::status(&conf),
        Command::Version => unreachable!("answered above"),
    }
}

/// True when `e` says enimd is not there to answer: not listening yet
/// (socket missing, refused), gone mid-exchange, or still restoring its
/// state. A hung agent (timed out, backlog full) is not waited for again:
/// its timeout is spent.
fn agent_away(e: &ClientError) -> bool {
    match e {
        ClientError::Unreachable { source, .. } => matches!(
            source.kind(),
            io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
        ),
        ClientError::CutShort { .. } => true,
        ClientError::Io { source, .. } => matches!(
            source.kind(),
            io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
        ),
        ClientError::Api { error, .. } => {
            error.code == code::TRY_AGAIN_LATER && error.details == STARTING
        }
        _ => false,
    }
}

/// Runs `call` until it gets an answer other than "enimd is away", or
/// until `wait` has passed since the first try: a restarting enimd costs
/// the pod the restart and nothing more. ADD, DEL and CHECK are
/// idempotent by their attachment key, so a call cut short by enimd's
/// death is safe to repeat against its successor.
fn waiting<T>(
    wait: Duration,
    mut call: impl FnMut() -> Result<T, ClientError>,
) -> Result<T, CniError> {
    let give_up = Instant::now() + wait;
    // Short first: enimd binds its socket before its recovery, so a
    // request gets in (and waits there) as soon as it is back.
    let mut pause = Duration::from_millis(20);
    loop {
        match call() {
            Err(e) if agent_away(&e) => {
                let left = give_up.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    let e = CniError::from(e);
                    return Err(if wait.is_zero() { e } else { e.waited(wait) });
                }
                std::thread::sleep(pause.min(left));
                pause = (pause * 2).min(Duration::from_millis(250));
            }
            r => return r.map_err(CniError::from),
        }
    }
}

fn attachment_request(conf: &NetConf, env: CniEnv) -> AttachmentRequest {
    // CniEnv::from_lookup guarantees these for ADD, DEL and CHECK.
    AttachmentRequest {
        network: conf.name.clone(),
        container_id: env.container_id.unwrap_or_default(),
        ifname: env.ifname.unwrap_or_default(),
        netns: env.netns.unwrap_or_default(),
        pod: env.pod,
        expected_mtu: MtuExpectation::Recorded,
    }
}

fn add(client: &Client, conf: NetConf, env: CniEnv) -> Result<Option<Value>, CniError> {
    // A prevResult we could not extend is found before the agent attaches
    // anything, not after.
    if let Some(prev) = &conf.prev_result {
        result::check_prev_shape(prev)?;
    }
    let req = attachment_request(&conf, env);
    let ours: AttachmentResult = waiting(conf.agent_wait, || client.post(ROUTE_ADD, &req))?;
    result::add_result(&ours, conf.cni_version, conf.prev_result).map(Some)
}

fn check(client: &Client, conf: NetConf, env: CniEnv) -> Result<Option<Value>, CniError> {
    let mut req = attachment_request(&conf, env);
    req.expected_mtu =
        result::mtu_expectation(conf.prev_result.as_ref(), &req.ifname, conf.cni_version);
    // The agent compares the kernel with its record.
    let ours: AttachmentResult = waiting(conf.agent_wait, || client.post(ROUTE_CHECK, &req))?;
    if let Some(prev) = &conf.prev_result {
        result::check_prev_result(&ours, prev)?;
    }
    Ok(None)
}

fn gc(client: &Client, conf: NetConf) -> Result<Option<Value>, CniError> {
    // Without the list (not a spec-conforming runtime) the agent falls back
    // to judging liveness by the netns, which never frees a live pod.
    let req = GcRequest {
        network: Some(conf.name),
        valid_attachments: conf.valid_attachments,
    };
    let report: GcReport = client.post(ROUTE_GC, &req)?;
    if !report.errors.is_empty() {
        // The spec asks GC to do what it can and report the rest.
        return Err(CniError::try_again(
            format!(
                "GC left {} error(s); the agent retries them on its next pass",
                report.errors.len()
            ),
            report
                .errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        ));
    }
    Ok(None)
}

#[cfg(test)]
mod client_tests;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Cursor;

    use super::*;

    fn exec(vars: &[(&str, &str)], stdin: &str) -> (Value, i32) {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        let out = execute(
            &|k| map.get(k).cloned(),
            Cursor::new(stdin.as_bytes().to_vec()),
        );
        let v = out
            .stdout
            .map(|s| serde_json::from_str(&s).unwrap())
            .unwrap_or(Value::Null);
        (v, out.exit_code)
    }

    #[test]
    fn version() {
        let (v, rc) = exec(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"0.4.0"}"#);
        assert_eq!(rc, 0);
        assert_eq!(
            v,
            json!({"cniVersion": "0.4.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
        );
        let (v, rc) = exec(&[("CNI_COMMAND", "VERSION")], "");
        assert_eq!((v["cniVersion"].as_str(), rc), (Some("1.1.0"), 0));
    }

    #[test]
    fn errors_carry_the_config_version() {
        let (v, rc) = exec(
            &[("CNI_COMMAND", "ADD")],
            r#"{"cniVersion":"1.0.0","name":"n"}"#,
        );
        assert_eq!(rc, 1);
        assert_eq!(v["cniVersion"], "1.0.0");
        assert_eq!(v["code"], 4);
        assert!(v["msg"].as_str().unwrap().contains("CNI_CONTAINERID"));

        let (v, _) = exec(
            &[("CNI_COMMAND", "ADD")],
            r#"{"cniVersion":"0.3.1","name":"n"}"#,
        );
        assert_eq!(
            (v["cniVersion"].as_str(), v["code"].as_u64()),
            (Some("1.1.0"), Some(1))
        );

        let (v, _) = exec(&[("CNI_COMMAND", "NOPE")], "");
        assert_eq!(v["code"], 4);
    }

    #[test]
    fn agent_down() {
        let conf = r#"{"cniVersion":"1.1.0","name":"n","socket":"/nonexistent/enimd.sock","agentWaitSeconds":0}"#;
        let vars = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
        ];
        assert_eq!(exec(&vars, conf).0["code"], 11);
        let (v, rc) = exec(&[("CNI_COMMAND", "STATUS")], conf);
        assert_eq!((v["code"].as_u64(), rc), (Some(50), 1));
        assert!(
            v["details"].as_str().unwrap().contains("not reachable"),
            "{v}"
        );
    }
}
