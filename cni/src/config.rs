//! The network configuration on stdin: bounded read, version negotiation
//! and enim's own keys (`socket`, `timeoutSeconds`, `agentWaitSeconds`).

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use enim_api::{ValidAttachment, DEFAULT_SOCKET};
use serde_json::{Map, Value};

use super::CniError;

/// Larger stdin is refused: a network config is a few KiB at most.
pub const MAX_STDIN: u64 = 1024 * 1024;

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long ADD, DEL and CHECK wait for an enimd that is down or starting
/// (a restart, a crash back-off) before they answer "try again later".
/// 90 s covers a rollout restart (1-2 s) and the kubelet's first four
/// crash back-offs (10, 20, 40, 80 s); with one exchange's
/// [`DEFAULT_TIMEOUT`] after it, a call stays within the kubelet's 2
/// minutes for a CRI call (`runtimeRequestTimeout`, StopPodSandbox's bound;
/// RunPodSandbox gets twice that).
pub const DEFAULT_AGENT_WAIT: Duration = Duration::from_secs(90);

/// The result versions we can emit, newest last.
pub const SUPPORTED_VERSIONS: [&str; 3] = ["0.4.0", "1.0.0", "1.1.0"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CniVersion {
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl CniVersion {
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "0.4.0" => Some(CniVersion::V0_4_0),
            "1.0.0" => Some(CniVersion::V1_0_0),
            "1.1.0" => Some(CniVersion::V1_1_0),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }
}

/// The parts of a network configuration the plugin uses.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    pub cni_version: CniVersion,
    pub name: String,
    pub socket: PathBuf,
    /// The bound of one exchange with the agent.
    pub timeout: Duration,
    /// ADD, DEL and CHECK: how long to wait for an agent that is down or
    /// starting (0: not at all).
    pub agent_wait: Duration,
    /// The previous plugin's result in a chain, in `cni_version`'s format.
    pub prev_result: Option<Map<String, Value>>,
    /// GC only: `cni.dev/valid-attachments` and its alias
    /// `cni.dev/attachments`, merged.
    pub valid_attachments: Option<Vec<ValidAttachment>>,
}

/// The plugin's own keys in the conflist, described for the configuration
/// reference (docs/configuration.md). [`NetConf::parse`] reads them by
/// hand, so that every error is a CNI error; this type only describes
/// them, and its tests hold it to the parser (keys and defaults).
#[cfg(feature = "schema")]
#[derive(Debug, PartialEq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginKeys {
    /// enimd's API socket.
    #[serde(default = "plugin_keys::socket")]
    pub socket: PathBuf,
    /// Seconds one exchange with enimd may take: a hung agent is CNI error
    /// 11 after this long; above 0, at most 86400.
    #[serde(default = "plugin_keys::timeout_seconds")]
    pub timeout_seconds: f64,
    /// Seconds ADD, DEL and CHECK wait for an enimd that is down or
    /// starting, retrying every 20-250 ms, before they answer 11
    /// ([Restarts](architecture.md#restarts-what-one-costs-a-new-pod-and-what-status-says));
    /// `0` turns the wait off.
    #[serde(default = "plugin_keys::agent_wait_seconds")]
    pub agent_wait_seconds: f64,
}

/// [`PluginKeys`]' defaults: the parser's.
#[cfg(feature = "schema")]
mod plugin_keys {
    use std::path::PathBuf;

    pub fn socket() -> PathBuf {
        PathBuf::from(super::DEFAULT_SOCKET)
    }

    pub fn timeout_seconds() -> f64 {
        super::DEFAULT_TIMEOUT.as_secs_f64()
    }

    pub fn agent_wait_seconds() -> f64 {
        super::DEFAULT_AGENT_WAIT.as_secs_f64()
    }
}

/// Reads stdin up to [`MAX_STDIN`] bytes; one byte more is an error, found
/// without reading the rest.
pub fn read_stdin(mut r: impl Read) -> Result<Vec<u8>, CniError> {
    let mut buf = Vec::new();
    (&mut r)
        .take(MAX_STDIN + 1)
        .read_to_end(&mut buf)
        .map_err(|e| CniError::io("failed to read the network configuration from stdin", e))?;
    if buf.len() as u64 > MAX_STDIN {
        return Err(CniError::decode(
            "network configuration on stdin is larger than 1 MiB",
            "",
        ));
    }
    Ok(buf)
}

/// The `cniVersion` a config asks for, if it is one we speak. Used to pick
/// the version of an error or VERSION answer even when parsing fails later.
pub fn requested_version(stdin: &[u8]) -> Option<CniVersion> {
    let v: Value = serde_json::from_slice(stdin).ok()?;
    CniVersion::parse(v.get("cniVersion")?.as_str()?)
}

/// The spec's network name pattern (same as container ids).
fn valid_name(name: &str) -> bool {
    enim_api::model::naming::valid_container_id(name)
}

impl NetConf {
    pub fn parse(stdin: &[u8]) -> Result<Self, CniError> {
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::decode(
                "failed to decode the network configuration on stdin as JSON",
                e,
            )
        })?;
        let Value::Object(mut obj) = value else {
            return Err(CniError::decode(
                "the network configuration on stdin is not a JSON object",
                "",
            ));
        };

        let version = match obj.get("cniVersion") {
            None | Some(Value::Null) => {
                return Err(CniError::invalid_config(
                    "network configuration has no cniVersion",
                ))
            }
            Some(Value::String(s)) => s.clone(),
            Some(_) => {
                return Err(CniError::invalid_config(
                    "network configuration's cniVersion is not a string",
                ))
            }
        };
        let name = match obj.get("name") {
            None | Some(Value::Null) => {
                return Err(CniError::invalid_config(
                    "network configuration has no name",
                ))
            }
            Some(Value::String(s)) if valid_name(s) => s.clone(),
            Some(other) => {
                return Err(CniError::invalid_config(format!(
                    "network name {other} is invalid: it must be a string matching ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"
                )))
            }
        };
        let cni_version = CniVersion::parse(&version).ok_or_else(|| {
            CniError::incompatible_version(format!(
                "CNI version {version:?} is not supported (supported: {})",
                SUPPORTED_VERSIONS.join(", ")
            ))
        })?;

        let socket = match obj.get("socket") {
            None | Some(Value::Null) => PathBuf::from(DEFAULT_SOCKET),
            Some(Value::String(s)) if !s.is_empty() => PathBuf::from(s),
            Some(_) => {
                return Err(CniError::invalid_config(
                    "\"socket\" must be a non-empty string (the agent's unix socket path)",
                ))
            }
        };

        let timeout = match seconds(&obj, "timeoutSeconds", false)? {
            None => DEFAULT_TIMEOUT,
            Some(d) => d,
        };
        let agent_wait = match seconds(&obj, "agentWaitSeconds", true)? {
            None => DEFAULT_AGENT_WAIT,
            Some(d) => d,
        };

        let prev_result = match obj.remove("prevResult") {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(_) => return Err(CniError::decode("prevResult is not a JSON object", "")),
        };

        // libcni sends the list under both names (the spec first called it
        // `cni.dev/attachments`); a runtime may send either: take the union.
        let mut valid_attachments: Option<Vec<ValidAttachment>> = None;
        for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
            let list: Vec<ValidAttachment> = match obj.remove(key) {
                None | Some(Value::Null) => continue,
                Some(v) => serde_json::from_value(v).map_err(|e| {
                    CniError::invalid_config(format!(
                        "{key} is not a list of {{containerID, ifname}}: {e}"
                    ))
                })?,
            };
            let all = valid_attachments.get_or_insert_with(Vec::new);
            for a in list {
                if !all.contains(&a) {
                    all.push(a);
                }
            }
        }

        Ok(NetConf {
            cni_version,
            name,
            socket,
            timeout,
            agent_wait,
            prev_result,
            valid_attachments,
        })
    }
}

/// A key of seconds (a number; `zero_ok`: 0 allowed), `None` when absent.
/// An upper bound of a day keeps Duration arithmetic sane, far beyond any
/// runtime's own deadline anyway.
fn seconds(
    obj: &Map<String, Value>,
    key: &str,
    zero_ok: bool,
) -> Result<Option<Duration>, CniError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let secs = n.as_f64().unwrap_or(f64::NAN);
            let low_ok = if zero_ok { secs >= 0.0 } else { secs > 0.0 };
            if !(low_ok && secs <= 86_400.0) {
                let low = if zero_ok {
                    "at least 0"
                } else {
                    "greater than 0"
                };
                return Err(CniError::invalid_config(format!(
                    "\"{key}\" {n} must be {low} and at most 86400"
                )));
            }
            Ok(Some(Duration::from_secs_f64(secs)))
        }
        Some(_) => Err(CniError::invalid_config(format!(
            "\"{key}\" must be a number"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn parse(s: &str) -> Result<NetConf, CniError> {
        NetConf::parse(s.as_bytes())
    }

    #[test]
    fn minimal() {
        let c = parse(r#"{"cniVersion":"1.1.0","name":"enim","type":"enim"}"#).unwrap();
        assert_eq!(c.cni_version, CniVersion::V1_1_0);
        assert_eq!(c.name, "enim");
        assert_eq!(c.socket, PathBuf::from(DEFAULT_SOCKET));
        assert_eq!(c.timeout, DEFAULT_TIMEOUT);
        assert_eq!(c.agent_wait, DEFAULT_AGENT_WAIT);
        assert_eq!(c.prev_result, None);
        assert_eq!(c.valid_attachments, None);
    }

    #[test]
    fn own_keys() {
        let c = parse(
            r#"{"cniVersion":"0.4.0","name":"n","socket":"/tmp/s.sock","timeoutSeconds":1.5,
                "agentWaitSeconds":0.25,"prevResult":{"interfaces":[]},
                "cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(c.cni_version, CniVersion::V0_4_0);
        assert_eq!(c.socket, PathBuf::from("/tmp/s.sock"));
        assert_eq!(c.timeout, Duration::from_millis(1500));
        assert_eq!(c.agent_wait, Duration::from_millis(250));
        assert!(c.prev_result.is_some());
        let no_wait = parse(r#"{"cniVersion":"1.1.0","name":"n","agentWaitSeconds":0}"#).unwrap();
        assert_eq!(no_wait.agent_wait, Duration::ZERO);
        assert_eq!(
            c.valid_attachments.unwrap(),
            vec![ValidAttachment {
                container_id: "a".into(),
                ifname: "eth0".into()
            }]
        );
    }

    /// The keys the configuration reference shows are the ones the parser
    /// reads, with its defaults.
    #[cfg(feature = "schema")]
    #[test]
    fn plugin_keys_describe_the_parser() {
        let head = r#""cniVersion":"1.1.0","name":"n""#;
        let both = |keys: &str| {
            let text = format!("{{{head}{keys}}}");
            let described: PluginKeys = serde_json::from_str(&text).unwrap();
            (described, parse(&text).unwrap())
        };
        for keys in [
            "",
            r#","socket":"/tmp/s.sock","timeoutSeconds":1.5,"agentWaitSeconds":0"#,
        ] {
            let (described, parsed) = both(keys);
            assert_eq!(described.socket, parsed.socket, "{keys}");
            assert_eq!(
                Duration::from_secs_f64(described.timeout_seconds),
                parsed.timeout,
                "{keys}"
            );
            assert_eq!(
                Duration::from_secs_f64(described.agent_wait_seconds),
                parsed.agent_wait,
                "{keys}"
            );
        }
        let schema = schemars::schema_for!(PluginKeys);
        let described = schema
            .get("properties")
            .and_then(Value::as_object)
            .expect("PluginKeys has properties");
        assert_eq!(described.len(), 3);
        for key in described.keys() {
            let e = parse(&format!("{{{head},\"{key}\":true}}")).unwrap_err();
            assert!(e.to_string().contains(key.as_str()), "{key}: {e}");
        }
    }

    #[test]
    fn gc_lists_under_either_name_are_merged() {
        let va = |c: &str| ValidAttachment {
            container_id: c.into(),
            ifname: "eth0".into(),
        };
        let only_alias = parse(
            r#"{"cniVersion":"1.1.0","name":"n",
                "cni.dev/attachments":[{"containerID":"b","ifname":"eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(only_alias.valid_attachments.unwrap(), vec![va("b")]);
        let both = parse(
            r#"{"cniVersion":"1.1.0","name":"n",
                "cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"},{"containerID":"b","ifname":"eth0"}],
                "cni.dev/attachments":[{"containerID":"b","ifname":"eth0"},{"containerID":"c","ifname":"eth0"}]}"#,
        )
        .unwrap();
        assert_eq!(
            both.valid_attachments.unwrap(),
            vec![va("a"), va("b"), va("c")]
        );
        // An empty list under either name is a list: everything is omitted.
        let empty = parse(r#"{"cniVersion":"1.1.0","name":"n","cni.dev/attachments":[]}"#).unwrap();
        assert_eq!(empty.valid_attachments, Some(vec![]));
        let bad = parse(r#"{"cniVersion":"1.1.0","name":"n","cni.dev/attachments":[{"x":1}]}"#);
        assert_eq!(bad.unwrap_err().code(), 7);
    }

    #[test]
    fn codes() {
        let code = |s: &str| parse(s).unwrap_err().code();
        assert_eq!(code(""), 6);
        assert_eq!(code("not json"), 6);
        assert_eq!(code(r#"{"cniVersion":"1.1.0","na"#), 6);
        assert_eq!(code("[1,2]"), 6);
        assert_eq!(code(r#"{"name":"n"}"#), 7);
        assert_eq!(code(r#"{"cniVersion":"1.1.0"}"#), 7);
        assert_eq!(code(r#"{"cniVersion":1,"name":"n"}"#), 7);
        assert_eq!(code(r#"{"cniVersion":"1.1.0","name":""}"#), 7);
        assert_eq!(code(r#"{"cniVersion":"1.1.0","name":"a b"}"#), 7);
        assert_eq!(code(r#"{"cniVersion":"0.3.1","name":"n"}"#), 1);
        assert_eq!(code(r#"{"cniVersion":"2.0.0","name":"n"}"#), 1);
        assert_eq!(code(r#"{"cniVersion":"1.1.0","name":"n","socket":""}"#), 7);
        assert_eq!(code(r#"{"cniVersion":"1.1.0","name":"n","socket":3}"#), 7);
        for t in ["0", "-1", "\"5\"", "1e9"] {
            let s = format!(r#"{{"cniVersion":"1.1.0","name":"n","timeoutSeconds":{t}}}"#);
            assert_eq!(code(&s), 7, "{t}");
        }
        for t in ["-1", "\"5\"", "1e9"] {
            let s = format!(r#"{{"cniVersion":"1.1.0","name":"n","agentWaitSeconds":{t}}}"#);
            assert_eq!(code(&s), 7, "{t}");
        }
        assert_eq!(
            code(r#"{"cniVersion":"1.1.0","name":"n","prevResult":[]}"#),
            6
        );
        assert_eq!(
            code(r#"{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":[{"x":1}]}"#),
            7
        );
        let msg = parse(r#"{"cniVersion":"0.3.1","name":"n"}"#)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("0.3.1") && msg.contains("1.1.0"), "{msg}");
    }

    #[test]
    fn stdin_limit() {
        let exact = vec![b' '; usize::try_from(MAX_STDIN).unwrap()];
        assert_eq!(read_stdin(Cursor::new(&exact)).unwrap().len(), exact.len());

        // A reader that never ends proves we stop after the limit.
        let e = read_stdin(std::io::repeat(b' ')).unwrap_err();
        assert_eq!(e.code(), 6);
        assert!(e.to_string().contains("1 MiB"));
    }

    #[test]
    fn requested() {
        assert_eq!(
            requested_version(br#"{"cniVersion":"0.4.0"}"#),
            Some(CniVersion::V0_4_0)
        );
        assert_eq!(requested_version(br#"{"cniVersion":"0.3.0"}"#), None);
        assert_eq!(requested_version(b"junk"), None);
    }
}
