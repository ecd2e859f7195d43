//! Issue #29, "Trust boundaries": every parser of bytes another party
//! writes, fed arbitrary and structured-but-wrong input. Each returns Ok
//! or its typed error (for the CNI plugin: the spec's error code), never
//! panics and never allocates without bound; where a writer exists,
//! writing and reading back is the identity.
//!
//! Covered here (the root crate): the CNI plugin's stdin and environment,
//! the agent's API request bodies and the server's body limit, the
//! checkpoint, enimd's config, and the DRA driver's claim record, bound
//! provider, devices and ResourceClaims. The providers' own parsers have
//! their `tests/untrusted_input.rs`.
//!
//! Pure parsing, bounded: each property runs at most 256 small cases.
//! One test, the server's body limit, builds the real router over the
//! real primary driver, which opens a netlink socket in the test's own
//! namespace (root: test binaries run as root, scripts/cargo-runner.sh);
//! no request reaches the kernel.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::io::Cursor;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use enim::store::checkpoint::{Checkpoint, CheckpointError, HostHome};
use enim_api::model::naming::valid_container_id;
use enim_api::model::{
    AttachmentKey, HostPath, Payload, Phase, PrimaryPayload, Record, SecondaryPayload,
};
use enim_api::{AttachmentRequest, GcRequest, MtuExpectation, ValidAttachment};
use enim_cni::config::{requested_version, CniVersion, NetConf};
use enim_cni::env::{parse_cni_args, CniEnv, Command};
use enim_core::{MacAddr, PodRef};
use enim_testkit::metadata_stub::answers::{cases, mac_text};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

// ---------------------------------------------------------------------
// Strategies shared by the sections below.

/// Text another party may write: any Unicode (control characters and NUL
/// included), or the ASCII the parsers split on.
fn wild_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,20}",
        "(?s:.{0,20})",
        "[a-zA-Z0-9_.:/;=, \\-\\x00\\t\\n]{0,20}",
    ]
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        wild_string().prop_map(Value::from),
    ]
}

/// Any JSON, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            btree_map(wild_string(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Arbitrary bytes, or JSON text with a few bytes overwritten, cut or
/// inserted (so the decoder gets far before it fails).
fn mangled(valid: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        vec(any::<u8>(), 0..256),
        (
            valid,
            vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 0..4)
        )
            .prop_map(|(mut bytes, edits)| {
                for (at, byte, how) in edits {
                    if bytes.is_empty() {
                        bytes.push(byte);
                        continue;
                    }
                    let i = at.index(bytes.len());
                    match how {
                        0 => bytes[i] = byte,
                        1 => bytes.truncate(i),
                        _ => bytes.insert(i, byte),
                    }
                }
                bytes
            }),
    ]
}

fn mac() -> impl Strategy<Value = MacAddr> {
    any::<[u8; 6]>().prop_map(MacAddr)
}

fn ipv4_net() -> impl Strategy<Value = Ipv4Net> {
    (any::<u32>(), 0u8..=32).prop_map(|(a, p)| Ipv4Net::new(Ipv4Addr::from(a), p).unwrap())
}

fn ipv6_net() -> impl Strategy<Value = Ipv6Net> {
    (any::<u128>(), 0u8..=128).prop_map(|(a, p)| Ipv6Net::new(Ipv6Addr::from(a), p).unwrap())
}

fn pod_ref() -> impl Strategy<Value = PodRef> {
    (
        wild_string(),
        wild_string(),
        proptest::option::of(wild_string()),
    )
        .prop_map(|(namespace, name, uid)| PodRef {
            namespace,
            name,
            uid,
        })
}

// ---------------------------------------------------------------------
// 1. The CNI plugin: stdin (network config), environment, CNI_ARGS.

/// A socket path no agent listens on: the plugin fails to connect (code
/// 11), so no property ever talks to a real enimd.
const NO_AGENT: &str = "/nonexistent/enim-untrusted-input/enimd.sock";

const GC_LIST_KEYS: [&str; 2] = ["cni.dev/valid-attachments", "cni.dev/attachments"];

/// One key of a network config: mostly a value the plugin accepts, else
/// absent or wrong, so that a case is often valid but for one key.
fn conf_key(
    valid: impl Strategy<Value = Value> + 'static,
    wrong: impl Strategy<Value = Value> + 'static,
) -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        1 => Just(None),
        8 => valid.prop_map(Some),
        1 => prop_oneof![3 => wrong, 1 => json_value()].prop_map(Some),
    ]
    .boxed()
}

fn gc_list(entry: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    vec(entry, 0..5).prop_map(Value::Array)
}

fn gc_entry() -> impl Strategy<Value = Value> {
    ("[a-z0-9]{1,8}", "[a-z0-9]{1,6}").prop_map(|(c, i)| json!({"containerID": c, "ifname": i}))
}

/// A network config object: every key enim reads, each accepted, absent
/// or wrong (wrong types, out of range, huge numbers, unicode and NULs),
/// and keys of other plugins it must ignore.
fn net_conf_object() -> impl Strategy<Value = Map<String, Value>> {
    let versions = ["1.1.0", "1.0.0", "0.4.0"];
    let version = conf_key(
        prop::sample::select(versions.to_vec()).prop_map(Value::from),
        prop_oneof![Just("0.3.1"), Just(""), Just("1.1")].prop_map(Value::from),
    );
    let name = conf_key(
        "[a-zA-Z0-9][a-zA-Z0-9_.\\-]{0,12}".prop_map(Value::from),
        wild_string().prop_map(Value::from),
    );
    let socket = conf_key(
        prop_oneof![Just(NO_AGENT.to_string()), "\\PC{1,20}"].prop_map(Value::from),
        Just(Value::from("")),
    );
    let timeout = conf_key(
        prop_oneof![
            (0.001f64..=86_400.0).prop_map(Value::from),
            (1u64..=86_400).prop_map(Value::from),
            Just(json!(1e-300)),
        ],
        prop_oneof![
            Just(json!(0)),
            Just(json!(-0.0)),
            Just(json!(86_400.000_001)),
            (86_401u64..).prop_map(Value::from),
            (i64::MIN..0).prop_map(Value::from),
            Just(json!("5")),
        ],
    );
    let prev = conf_key(
        prop_oneof![
            btree_map(wild_string(), json_value(), 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            (json_value(), json_value(), json_value()).prop_map(|(i, p, r)| json!({
                "cniVersion": "1.1.0", "interfaces": i, "ips": p, "routes": r
            })),
        ],
        prop_oneof![Just(json!([])), Just(json!("{}")), Just(json!(1))],
    );
    let valid_attachments = || {
        conf_key(
            gc_list(gc_entry()),
            gc_list(prop_oneof![gc_entry(), json_value()]),
        )
    };
    (
        (version, name, socket),
        (timeout, prev, valid_attachments(), valid_attachments()),
        (
            proptest::option::of(json_value()),
            proptest::option::of(json_value()),
        ),
    )
        .prop_map(
            |((version, name, socket), (timeout, prev, valid, alias), (runtime, extra))| {
                let mut obj = Map::new();
                for (key, value) in [
                    ("cniVersion", version),
                    ("name", name),
                    ("socket", socket),
                    ("timeoutSeconds", timeout),
                    ("prevResult", prev),
                    (GC_LIST_KEYS[0], valid),
                    (GC_LIST_KEYS[1], alias),
                    ("runtimeConfig", runtime),
                    ("someOtherPlugin", extra),
                ] {
                    if let Some(v) = value {
                        obj.insert(key.to_string(), v);
                    }
                }
                obj.insert("type".into(), json!("enim"));
                obj
            },
        )
}

/// The CNI code `NetConf::parse` must answer for `obj`, `None` for Ok: the
/// spec's classes in the order the plugin checks them (7 a bad config, 1
/// a version it does not speak, 6 a prevResult it cannot decode).
fn expected_conf_code(obj: &Map<String, Value>) -> Option<u32> {
    let absent = |k: &str| matches!(obj.get(k), None | Some(Value::Null));
    let Some(Value::String(version)) = obj.get("cniVersion") else {
        return Some(7);
    };
    match obj.get("name") {
        Some(Value::String(n)) if valid_container_id(n) => {}
        _ => return Some(7),
    }
    if CniVersion::parse(version).is_none() {
        return Some(1);
    }
    match obj.get("socket") {
        Some(Value::String(s)) if !s.is_empty() => {}
        _ if absent("socket") => {}
        _ => return Some(7),
    }
    match obj.get("timeoutSeconds") {
        Some(Value::Number(n)) if n.as_f64().is_some_and(|s| s > 0.0 && s <= 86_400.0) => {}
        _ if absent("timeoutSeconds") => {}
        _ => return Some(7),
    }
    match obj.get("prevResult") {
        Some(Value::Object(_)) => {}
        _ if absent("prevResult") => {}
        _ => return Some(6),
    }
    for key in GC_LIST_KEYS {
        if !absent(key) && serde_json::from_value::<Vec<ValidAttachment>>(obj[key].clone()).is_err()
        {
            return Some(7);
        }
    }
    None
}

/// What `bytes` must give: decode failures are 6, the rest as above.
fn expected_stdin_code(bytes: &[u8]) -> Option<u32> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(obj)) => expected_conf_code(&obj),
        _ => Some(6),
    }
}

/// A config accepted from `obj` carries exactly what `obj` says.
fn assert_conf_matches(conf: &NetConf, obj: &Map<String, Value>) -> Result<(), TestCaseError> {
    prop_assert_eq!(Some(conf.cni_version.as_str()), obj["cniVersion"].as_str());
    prop_assert_eq!(Some(conf.name.as_str()), obj["name"].as_str());
    if let Some(Value::String(s)) = obj.get("socket") {
        prop_assert_eq!(&conf.socket, &PathBuf::from(s));
    }
    prop_assert_eq!(
        conf.prev_result.as_ref(),
        obj.get("prevResult").and_then(Value::as_object)
    );
    // The GC list is the union of both keys, each entry once.
    let given: Vec<ValidAttachment> = GC_LIST_KEYS
        .iter()
        .filter_map(|k| obj.get(*k).filter(|v| !v.is_null()))
        .flat_map(|v| serde_json::from_value::<Vec<ValidAttachment>>(v.clone()).unwrap())
        .collect();
    match &conf.valid_attachments {
        None => prop_assert!(GC_LIST_KEYS
            .iter()
            .all(|k| obj.get(*k).is_none_or(Value::is_null))),
        Some(list) => {
            for a in &given {
                prop_assert!(list.contains(a), "{:?} dropped from the GC list", a);
            }
            for (i, a) in list.iter().enumerate() {
                prop_assert!(given.contains(a));
                prop_assert!(!list[..i].contains(a), "{:?} twice in the GC list", a);
            }
        }
    }
    Ok(())
}

fn env_lookup<'a>(
    vars: &'a HashMap<&'static str, OsString>,
) -> impl Fn(&str) -> Option<OsString> + 'a {
    |k| vars.get(k).cloned()
}

/// A CNI_* value: plausible, any text, or bytes that are not UTF-8.
fn env_value(plausible: BoxedStrategy<String>) -> impl Strategy<Value = Option<OsString>> {
    prop_oneof![
        1 => Just(None),
        12 => plausible.prop_map(|s| Some(OsString::from(s))),
        1 => wild_string().prop_map(|s| Some(OsString::from(s))),
        1 => vec(any::<u8>(), 0..20).prop_map(|b| Some(OsString::from_vec(b))),
    ]
}

const VERBS: [&str; 6] = ["ADD", "DEL", "CHECK", "VERSION", "GC", "STATUS"];

fn cni_args() -> BoxedStrategy<String> {
    let pair = prop_oneof![
        3 => ("[a-z0-9\\-]{0,10}").prop_map(|v| format!("K8S_POD_NAMESPACE={v}")),
        3 => ("[a-z0-9\\-]{0,10}").prop_map(|v| format!("K8S_POD_NAME={v}")),
        3 => ("[a-f0-9\\-]{0,10}").prop_map(|v| format!("K8S_POD_UID={v}")),
        1 => prop_oneof![Just("1"), Just("true"), Just("0"), Just("maybe")]
            .prop_map(|v| format!("IgnoreUnknown={v}")),
        1 => "[A-Z_]{1,8}=[^;]{0,6}",
        1 => "[^;]{0,8}",
    ];
    vec(pair, 0..5).prop_map(|p| p.join(";")).boxed()
}

fn cni_env() -> impl Strategy<Value = HashMap<&'static str, OsString>> {
    let command = prop_oneof![
        4 => prop::sample::select(VERBS.to_vec()).prop_map(str::to_string),
        1 => Just("add".to_string()),
    ]
    .boxed();
    let container = "[a-zA-Z0-9][a-zA-Z0-9_.\\-]{0,16}".boxed();
    let ifname = prop_oneof![
        4 => Just("eth0".to_string()),
        2 => Just("ëth0".to_string()),
        1 => Just(".".to_string()),
        1 => Just("a:b".to_string()),
        1 => Just("sixteen-bytes-xx".to_string()),
        1 => Just("fünfzehn-bytes".to_string()),
        2 => "\\PC{1,8}",
    ]
    .boxed();
    let netns = prop_oneof![Just("/run/netns/x".to_string()), "/[^\\x00]{0,20}"].boxed();
    let path = "(/[a-z]{1,5}){1,3}(:(/[a-z]{1,5}){1,3}){0,2}".boxed();
    (
        env_value(command),
        env_value(container),
        env_value(ifname),
        env_value(netns),
        env_value(cni_args()),
        env_value(path),
    )
        .prop_map(|(command, container, ifname, netns, args, path)| {
            [
                ("CNI_COMMAND", command),
                ("CNI_CONTAINERID", container),
                ("CNI_IFNAME", ifname),
                ("CNI_NETNS", netns),
                ("CNI_ARGS", args),
                ("CNI_PATH", path),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect()
        })
}

proptest! {
    #![proptest_config(cases(256))]

    /// Stdin of any bytes: the config the plugin reads, or the spec's
    /// code for why not (6 undecodable, 7 invalid, 1 unsupported version).
    #[test]
    fn cni_stdin_of_any_bytes_is_a_config_or_its_cni_code(
        bytes in mangled(net_conf_object().prop_map(|o| serde_json::to_vec(&o).unwrap()))
    ) {
        let _ = requested_version(&bytes);
        match (NetConf::parse(&bytes), expected_stdin_code(&bytes)) {
            (Ok(conf), None) => {
                let Value::Object(obj) = serde_json::from_slice(&bytes).unwrap() else { unreachable!() };
                assert_conf_matches(&conf, &obj)?;
            }
            (Err(e), Some(code)) => prop_assert_eq!(e.code(), code, "{}", e),
            (got, want) => prop_assert!(false, "got {:?}, want code {:?}", got, want),
        }
    }

    /// Configs of the right shape with wrong types, huge numbers, unicode
    /// and NULs in names: the code of the first thing wrong, or exactly
    /// what the config says.
    #[test]
    fn cni_config_of_wrong_types_gets_the_spec_code(generated in net_conf_object()) {
        let bytes = serde_json::to_vec(&generated).unwrap();
        // Compared with the JSON as read back: serde_json's float parsing
        // may differ from what it wrote in the last digit.
        let Value::Object(obj) = serde_json::from_slice(&bytes).unwrap() else { unreachable!() };
        prop_assert_eq!(
            requested_version(&bytes),
            obj.get("cniVersion").and_then(Value::as_str).and_then(CniVersion::parse)
        );
        match (NetConf::parse(&bytes), expected_conf_code(&obj)) {
            (Ok(conf), None) => assert_conf_matches(&conf, &obj)?,
            (Err(e), Some(code)) => prop_assert_eq!(e.code(), code, "{}", e),
            (got, want) => prop_assert!(false, "got {:?}, want code {:?}", got, want),
        }
    }

    /// CNI_* variables of any content: the environment, or code 4. What is
    /// accepted is what the spec allows, as the runtime gave it.
    #[test]
    fn cni_environment_is_valid_or_code_4(vars in cni_env()) {
        let lookup = env_lookup(&vars);
        let text = |k: &str| vars.get(k).and_then(|v| v.to_str()).filter(|v| !v.is_empty());
        let env = match CniEnv::from_lookup(&lookup) {
            Ok(env) => env,
            Err(e) => {
                prop_assert_eq!(e.code(), 4, "{}", e);
                return Ok(());
            }
        };
        prop_assert_eq!(Some(env.command), text("CNI_COMMAND").and_then(|c| Command::parse(c).ok()));
        if matches!(env.command, Command::Add | Command::Del | Command::Check) {
            let id = env.container_id.as_deref().unwrap();
            prop_assert!(valid_container_id(id));
            prop_assert_eq!(Some(id), text("CNI_CONTAINERID"));
            let ifname = env.ifname.as_deref().unwrap();
            prop_assert_eq!(Some(ifname), text("CNI_IFNAME"));
            // What the plugin lets through, the agent accepts (a NUL cannot
            // reach the plugin: execve's strings end at it).
            if !ifname.contains('\0') {
                prop_assert!(enim::netlink::validate_ifname(ifname).is_ok(), "{:?}", ifname);
            }
            if env.command != Command::Del {
                prop_assert!(env.netns.is_some());
            }
            if let Some(ns) = &env.netns {
                prop_assert!(ns.is_absolute());
                prop_assert_eq!(Some(ns.as_path()), text("CNI_NETNS").map(Path::new));
            }
            if let Some(args) = text("CNI_ARGS") {
                prop_assert_eq!(&env.pod, &parse_cni_args(args).unwrap());
            }
        }
    }

    /// CNI_ARGS of any text: the pod, or code 4; and the pod's keys, once
    /// written as CNI_ARGS, read back as they were.
    #[test]
    fn cni_args_parse_or_code_4_and_round_trip(
        args in prop_oneof![cni_args(), wild_string().boxed()],
        namespace in "[^;]{0,12}",
        name in "[^;]{0,12}",
        uid in proptest::option::of("[^;]{1,12}"),
    ) {
        if let Err(e) = parse_cni_args(&args) {
            prop_assert_eq!(e.code(), 4, "{}", e);
        }
        let mut written = format!("K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}");
        if let Some(uid) = &uid {
            written.push_str(&format!(";K8S_POD_UID={uid}"));
        }
        let want = PodRef { namespace, name, uid };
        prop_assert_eq!(parse_cni_args(&written).unwrap(), want);
    }
}

/// A config whose socket, if the plugin gets that far, reaches no agent,
/// and that does not wait for one.
fn net_conf_without_agent() -> impl Strategy<Value = Vec<u8>> {
    let socket = prop_oneof![
        Just(NO_AGENT.to_string()),
        Just("/run/a\0b.sock".to_string()),
        Just(format!("/{}", "s".repeat(200))),
    ];
    (net_conf_object(), socket).prop_map(|(mut obj, socket)| {
        obj.insert("socket".into(), Value::from(socket));
        // The plugin waits (bounded) for an agent that is down: not here.
        obj.insert("agentWaitSeconds".into(), json!(0));
        serde_json::to_vec(&obj).unwrap()
    })
}

proptest! {
    // Each case execs the plugin's whole path (an agent that is not there
    // included): fewer cases.
    #![proptest_config(cases(96))]

    /// The whole plugin on any environment and stdin: exit 0 or 1, stdout
    /// one JSON document, every error a spec code with msg and details.
    #[test]
    fn cni_plugin_answers_any_invocation_with_json(
        vars in cni_env(),
        stdin in prop_oneof![mangled(net_conf_without_agent()), net_conf_without_agent()],
    ) {
        // Never an agent: a config the plugin accepts names a socket
        // nothing listens on, or one that cannot be an address; and it
        // does not wait for one (a mangled key would mean 90 s).
        if let Ok(conf) = NetConf::parse(&stdin) {
            let s = conf.socket.as_os_str().as_encoded_bytes();
            prop_assume!(conf.socket == Path::new(NO_AGENT) || s.contains(&0) || s.len() > 108);
            let obj: Value = serde_json::from_slice(&stdin).unwrap();
            prop_assume!(obj.get("agentWaitSeconds") == Some(&json!(0)));
        }
        let out = enim_cni::execute(&env_lookup(&vars), Cursor::new(stdin));
        let doc: Value = match &out.stdout {
            Some(s) => serde_json::from_str(s).map_err(|e| TestCaseError::fail(format!("{e}: {s}")))?,
            None => Value::Null,
        };
        match out.exit_code {
            // Success without an agent: only VERSION.
            0 => prop_assert!(doc.get("supportedVersions").is_some(), "{}", doc),
            1 => {
                let code = doc["code"].as_u64().unwrap_or(0);
                prop_assert!([1, 4, 6, 7, 11, 50].contains(&code), "{}", doc);
                prop_assert!(doc["msg"].as_str().is_some_and(|m| !m.is_empty()), "{}", doc);
                prop_assert!(doc["details"].is_string(), "{}", doc);
            }
            other => prop_assert!(false, "exit code {}", other),
        }
    }
}

/// serde_json stops at 128 levels, so a deeply nested config is a decode
/// error (6), not a stack overflow; within the limit prevResult is kept.
#[test]
fn cni_config_nested_deeply_is_a_decode_error() {
    for depth in [129, 10_000, 500_000] {
        let stdin = format!(
            r#"{{"cniVersion":"1.1.0","name":"n","prevResult":{{"x":{}{}}}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let e = NetConf::parse(stdin.as_bytes()).unwrap_err();
        assert_eq!(e.code(), 6, "depth {depth}: {e}");
        assert!(e.to_string().contains("JSON"), "{e}");
    }
    let stdin = format!(
        r#"{{"cniVersion":"1.1.0","name":"n","prevResult":{{"x":{}{}}}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    let conf = NetConf::parse(stdin.as_bytes()).unwrap();
    assert!(conf.prev_result.unwrap().contains_key("x"));
}

// ---------------------------------------------------------------------
// 2. The agent's HTTP API: request bodies, and the server's body limit.

fn mtu_expectation() -> impl Strategy<Value = MtuExpectation> {
    prop_oneof![
        Just(MtuExpectation::Recorded),
        Just(MtuExpectation::Skip),
        any::<u32>().prop_map(MtuExpectation::Exactly),
    ]
}

fn attachment_request() -> impl Strategy<Value = AttachmentRequest> {
    (
        (wild_string(), wild_string(), wild_string(), wild_string()),
        pod_ref(),
        mtu_expectation(),
    )
        .prop_map(
            |((network, container_id, ifname, netns), pod, expected_mtu)| AttachmentRequest {
                network,
                container_id,
                ifname,
                netns: PathBuf::from(netns),
                pod,
                expected_mtu,
            },
        )
}

fn gc_request() -> impl Strategy<Value = GcRequest> {
    let attachment =
        (wild_string(), wild_string()).prop_map(|(container_id, ifname)| ValidAttachment {
            container_id,
            ifname,
        });
    (
        proptest::option::of(wild_string()),
        proptest::option::of(vec(attachment, 0..6)),
    )
        .prop_map(|(network, valid_attachments)| GcRequest {
            network,
            valid_attachments,
        })
}

proptest! {
    #![proptest_config(cases(256))]

    /// Any JSON, and any bytes, into each request body: a value holding
    /// what the JSON says, or a serde error; never a panic.
    #[test]
    fn api_request_bodies_of_any_json_decode_or_fail(
        value in json_value(),
        bytes in mangled(attachment_request().prop_map(|r| serde_json::to_vec(&r).unwrap())),
    ) {
        // What decodes from an object is what it says (serde also takes
        // a struct as an array of its fields, in order).
        let text = |v: &Value, key: &str, position: usize| {
            let field = match v {
                Value::Array(fields) => fields.get(position),
                _ => v.get(key),
            };
            field.and_then(Value::as_str).map(str::to_string)
        };
        if let Ok(req) = serde_json::from_value::<AttachmentRequest>(value.clone()) {
            prop_assert_eq!(Some(req.network), text(&value, "network", 0));
            prop_assert_eq!(Some(req.container_id), text(&value, "container_id", 1));
            prop_assert_eq!(Some(req.ifname), text(&value, "ifname", 2));
        }
        if let Ok(gc) = serde_json::from_value::<GcRequest>(value.clone()) {
            prop_assert_eq!(gc.network, text(&value, "network", 0));
        }
        if let Ok(a) = serde_json::from_value::<ValidAttachment>(value.clone()) {
            prop_assert_eq!(Some(a.container_id), text(&value, "containerID", 0));
        }
        if let Ok(req) = serde_json::from_slice::<AttachmentRequest>(&bytes) {
            let back: AttachmentRequest = serde_json::from_slice(&serde_json::to_vec(&req).unwrap()).unwrap();
            prop_assert_eq!(back, req);
        }
        let _ = serde_json::from_slice::<GcRequest>(&bytes);
    }

    /// What the plugin and enimctl send is what the agent reads.
    #[test]
    fn api_requests_round_trip(req in attachment_request(), gc in gc_request()) {
        let back: AttachmentRequest = serde_json::from_slice(&serde_json::to_vec(&req).unwrap()).unwrap();
        prop_assert_eq!(back, req);
        let back: GcRequest = serde_json::from_slice(&serde_json::to_vec(&gc).unwrap()).unwrap();
        prop_assert_eq!(back, gc);
    }
}

mod server {
    use std::time::{Duration, Instant};

    use axum::body::Body;
    use axum::extract::connect_info::ConnectInfo;
    use axum::http::{Request, StatusCode};
    use enim::daemon::server::{router, AppState, PeerCred};
    use enim::engine::Engine;
    use enim::netlink::rtnl::RtnlPlumbing;
    use enim::primary::PrimaryDriver;
    use enim_provider_static::StaticProvider;
    use tower::ServiceExt;

    use super::*;

    /// axum's default body limit (`DefaultBodyLimit`): enimd sets none of
    /// its own.
    pub const BODY_LIMIT: usize = 2 * 1024 * 1024;

    /// The real router over the real primary driver, never ready (so a
    /// body that decodes is answered 503 and reaches no engine step).
    pub async fn app(dir: &Path) -> axum::Router {
        let provider = Arc::new(StaticProvider::new(Vec::new()).unwrap());
        let plumbing = Arc::new(RtnlPlumbing::new(None).await.unwrap());
        let checkpoint = Arc::new(Checkpoint::open(&dir.join("cp.json"), false).unwrap());
        let driver = PrimaryDriver::new(provider, plumbing, checkpoint.clone(), Default::default());
        // Never ready: its sender is gone.
        let (_, ready) = tokio::sync::watch::channel(false);
        router(Arc::new(AppState {
            engine: Arc::new(Engine::new(driver, checkpoint)),
            devices: enim::daemon::devices::EngineDevices::new(enim_api::model::Mode::Primary),
            in_process_plugin: false,
            dra: false,
            ready,
            allowed_uids: Vec::new(),
            startup_wait: Duration::ZERO,
            gc_grace: Duration::from_secs(30),
            allocation_expiry: Duration::from_secs(120),
            metrics: Arc::new(enim::daemon::metrics::Metrics::new()),
            heap: Arc::default(),
            started: Instant::now(),
            events: Arc::new(enim::daemon::events::AgentEvents::off()),
        }))
    }

    /// POSTs `body` to `route` as root; the status and the answer's text.
    pub async fn post(app: &axum::Router, route: &str, body: Body) -> (StatusCode, String) {
        let mut req = Request::post(route)
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
        req.extensions_mut()
            .insert(ConnectInfo(PeerCred { uid: Some(0) }));
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A valid ADD body, padded with JSON white space to `len` bytes.
    pub fn padded_add(len: usize) -> Vec<u8> {
        let mut body = serde_json::to_vec(&json!({
            "network": "enim", "container_id": "c1", "ifname": "eth0", "netns": "/run/netns/x"
        }))
        .unwrap();
        body.resize(len, b' ');
        body
    }
}

/// A body over the limit is refused (413) before it is decoded, whether
/// its length is known up front or it streams; one just under the limit
/// is read (and answered 503: the agent is not ready).
#[tokio::test]
async fn api_server_refuses_an_oversize_body() {
    use axum::body::Body;
    use axum::http::StatusCode;
    let dir = tempfile::tempdir().unwrap();
    let app = server::app(dir.path()).await;
    let limit = server::BODY_LIMIT;

    let (status, text) = server::post(
        &app,
        enim_api::ROUTE_ADD,
        Body::from(server::padded_add(limit - 1024)),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{text}");
    assert!(text.contains("try again later"), "{text}");

    for route in [enim_api::ROUTE_ADD, enim_api::ROUTE_DEL, enim_api::ROUTE_GC] {
        let (status, text) =
            server::post(&app, route, Body::from(server::padded_add(limit + 1))).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{route}: {text}");

        // 64 MiB of unknown length, streamed in 64 KiB chunks: the server
        // stops reading at the limit.
        const CHUNK: usize = 64 * 1024;
        let pulled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = pulled.clone();
        let chunks = futures::stream::iter((0..1024).map(move |_| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, std::io::Error>(axum::body::Bytes::from(vec![b' '; CHUNK]))
        }));
        let (status, text) = server::post(&app, route, Body::from_stream(chunks)).await;
        assert_eq!(
            status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{route} streamed: {text}"
        );
        let read = pulled.load(std::sync::atomic::Ordering::SeqCst);
        assert!(read <= limit / CHUNK + 1, "{route}: {read} chunks read");
    }
}

/// Any bytes to any POST route: refused with a 4xx, or (a body that
/// decodes) 503 until the agent is ready; never a 500 or a panic.
#[tokio::test]
async fn api_server_answers_any_body_with_a_client_error() {
    use axum::body::Body;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let dir = tempfile::tempdir().unwrap();
    let app = server::app(dir.path()).await;
    let mut runner = TestRunner::new(cases(64));
    let bodies = mangled(prop_oneof![
        attachment_request().prop_map(|r| serde_json::to_vec(&r).unwrap()),
        gc_request().prop_map(|r| serde_json::to_vec(&r).unwrap()),
    ]);
    let routes = [
        enim_api::ROUTE_ADD,
        enim_api::ROUTE_DEL,
        enim_api::ROUTE_CHECK,
        enim_api::ROUTE_GC,
    ];
    for i in 0..64 {
        let body = bodies.new_tree(&mut runner).unwrap().current();
        let route = routes[i % routes.len()];
        let (status, text) = server::post(&app, route, Body::from(body.clone())).await;
        assert!(
            status.is_client_error() || status == axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "{route} {:?}: {status} {text}",
            String::from_utf8_lossy(&body)
        );
    }
}

// ---------------------------------------------------------------------
// 3. The checkpoint.

const FIXTURES: [&str; 4] = [
    "checkpoint-enim-1.json",
    "checkpoint-enim-2.json",
    "checkpoint-enim-2-secondary.json",
    "checkpoint-enim-3.json",
];

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
    .unwrap()
}

fn record() -> impl Strategy<Value = Record> {
    let key = (wild_string(), wild_string(), wild_string()).prop_map(
        |(network, container_id, ifname)| AttachmentKey {
            network,
            container_id,
            ifname,
        },
    );
    let host_path = (
        wild_string(),
        wild_string(),
        vec(ipv4_net().prop_map(IpNet::V4), 0..3),
        proptest::option::of(mac()),
    )
        .prop_map(|(host_veth, ifname, routes, mac)| HostPath {
            host_veth,
            ifname,
            routes,
            mac,
        });
    let primary = (
        (mac(), wild_string(), any::<u32>(), ipv4_net(), any::<u32>()),
        (
            proptest::option::of(ipv6_net()),
            proptest::option::of(any::<u128>()),
        ),
        proptest::option::of(host_path),
    )
        .prop_map(
            |((mac, host_name, host_mtu, ipv4, gw4), (ipv6, gw6), host_path)| {
                Payload::Primary(PrimaryPayload {
                    mac,
                    host_name,
                    host_mtu,
                    ipv4,
                    gateway4: Ipv4Addr::from(gw4),
                    ipv6,
                    gateway6: gw6.map(Ipv6Addr::from),
                    host_path,
                })
            },
        );
    let secondary = (
        (any::<u32>(), any::<u32>(), any::<u32>(), wild_string()),
        (
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u128>()),
            proptest::option::of(mac()),
        ),
    )
        .prop_map(|((table, to_pod, from_pod, host_veth), (v4, v6, mac))| {
            Payload::Secondary(SecondaryPayload {
                table,
                rule_priority_to_pod: to_pod,
                rule_priority_from_pod: from_pod,
                host_veth,
                ipv4: v4.map(Ipv4Addr::from),
                ipv6: v6.map(Ipv6Addr::from),
                mac,
            })
        });
    let phase = prop_oneof![
        Just(Phase::Adding),
        Just(Phase::Ready),
        Just(Phase::Deleting)
    ];
    (
        (
            key,
            pod_ref(),
            wild_string(),
            wild_string(),
            any::<u32>(),
            phase,
        ),
        (
            any::<u64>(),
            any::<u64>(),
            proptest::option::of(any::<u64>()),
        ),
        prop_oneof![primary, secondary],
    )
        .prop_map(
            |(
                (key, pod, eni_id, netns, mtu, phase),
                (created_ms, updated_ms, expires_ms),
                payload,
            )| Record {
                key,
                pod,
                eni_id,
                netns: PathBuf::from(netns),
                mtu,
                phase,
                created_ms,
                updated_ms,
                expires_ms,
                payload,
            },
        )
}

/// Parses `bytes` as the checkpoint file at `path`: the state, or one of
/// the errors that name the file and say it was left alone, with the file
/// untouched.
fn open_untrusted(path: &Path, bytes: &[u8]) -> Result<Option<Checkpoint>, TestCaseError> {
    std::fs::write(path, bytes).unwrap();
    match Checkpoint::open(path, false) {
        Ok(cp) => Ok(Some(cp)),
        Err(e) => {
            let shown = e.to_string();
            match &e {
                CheckpointError::Corrupt { path: p, .. }
                | CheckpointError::UnsupportedVersion { path: p, .. }
                | CheckpointError::DuplicateKey { path: p, .. }
                | CheckpointError::WrongSection { path: p, .. } => prop_assert_eq!(p, path),
                other => prop_assert!(false, "not a parse error: {:?}", other),
            }
            prop_assert!(shown.contains(&path.display().to_string()), "{}", shown);
            prop_assert_eq!(std::fs::read(path).unwrap(), bytes, "the file was changed");
            Ok(None)
        }
    }
}

/// The state of `cp` written to a fresh file and read back is the same.
fn assert_rewrite_is_identity(cp: &Checkpoint, dir: &Path) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let (records, homes) = (cp.list().await, cp.homes().await);
        let path = dir.join("rewritten.json");
        let _ = std::fs::remove_file(&path);
        let copy = Checkpoint::open(&path, false).unwrap();
        copy.update_many(records.clone(), &[]).await.unwrap();
        copy.learn_homes(homes.clone()).await.unwrap();
        let back = Checkpoint::open(&path, false).unwrap();
        prop_assert_eq!(back.list().await, records);
        prop_assert_eq!(back.homes().await, homes);
        Ok(())
    })
}

/// A fixture's JSON with one value (at any depth) replaced by any JSON.
fn mutated_fixture() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(FIXTURES.to_vec()),
        any::<prop::sample::Index>(),
        json_value(),
    )
        .prop_map(|(name, at, replacement)| {
            let mut doc: Value = serde_json::from_slice(&fixture(name)).unwrap();
            let mut slots = Vec::new();
            collect_pointers(&doc, String::new(), &mut slots);
            let pointer = &slots[at.index(slots.len())];
            *doc.pointer_mut(pointer).unwrap() = replacement;
            serde_json::to_vec(&doc).unwrap()
        })
}

/// Every JSON pointer into `v` (the root included).
fn collect_pointers(v: &Value, here: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let escaped = k.replace('~', "~0").replace('/', "~1");
                collect_pointers(child, format!("{here}/{escaped}"), out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                collect_pointers(child, format!("{here}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(here);
}

proptest! {
    #![proptest_config(cases(256))]

    /// Any bytes, and real checkpoints with bytes changed or one value
    /// replaced: the state (which then survives a rewrite as it is), or an
    /// error naming the file, left as it was.
    #[test]
    fn checkpoint_of_any_bytes_loads_or_is_refused_untouched(
        bytes in prop_oneof![
            mangled(prop::sample::select(FIXTURES.to_vec()).prop_map(fixture)),
            mutated_fixture(),
        ]
    ) {
        let dir = tempfile::tempdir().unwrap();
        if let Some(cp) = open_untrusted(&dir.path().join("checkpoint.json"), &bytes)? {
            assert_rewrite_is_identity(&cp, dir.path())?;
        }
    }

    /// Any records and homes, written by the checkpoint, read back equal.
    #[test]
    fn checkpoint_round_trips(
        records in vec(record(), 0..6),
        homes in btree_map(mac(), (wild_string(), any::<u32>()), 0..4),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        let homes: BTreeMap<MacAddr, HostHome> = homes
            .into_iter()
            .map(|(mac, (name, mtu))| (mac, HostHome { name, mtu }))
            .collect();
        // Later records of one key replace earlier ones, as in the agent.
        let mut want: BTreeMap<AttachmentKey, Record> = BTreeMap::new();
        for r in &records {
            want.insert(r.key.clone(), r.clone());
        }
        rt.block_on(async {
            let cp = Checkpoint::open(&path, false).unwrap();
            cp.update_many(records, &[]).await.unwrap();
            cp.learn_homes(homes.clone()).await.unwrap();
        });
        let back = Checkpoint::open(&path, false).unwrap();
        rt.block_on(async {
            prop_assert_eq!(back.list().await, want.into_values().collect::<Vec<_>>());
            prop_assert_eq!(back.homes().await, homes);
            Ok(())
        })?;
    }
}

/// The committed fixtures: the readable versions load (and survive a
/// rewrite), enim/3 is refused as too new.
#[test]
fn checkpoint_fixtures_load_or_are_refused_by_version() {
    let dir = tempfile::tempdir().unwrap();
    for name in FIXTURES {
        let path = dir.path().join(name);
        let bytes = fixture(name);
        let loaded = open_untrusted(&path, &bytes).unwrap();
        match name {
            "checkpoint-enim-3.json" => {
                assert!(loaded.is_none());
                let e = Checkpoint::open(&path, false).err().unwrap();
                assert!(
                    matches!(e, CheckpointError::UnsupportedVersion { .. }),
                    "{e}"
                );
            }
            _ => {
                let cp = loaded.unwrap_or_else(|| panic!("{name} refused"));
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                assert_eq!(rt.block_on(cp.len()), 1, "{name}");
                assert_rewrite_is_identity(&cp, dir.path()).unwrap();
            }
        }
    }
}

// ---------------------------------------------------------------------
// 4. enimd's config.

/// A TOML value: right-looking for some key, or not.
fn toml_value() -> impl Strategy<Value = String> {
    let scalar = prop_oneof![
        wild_string().prop_map(|s| format!("{s:?}")),
        "[0-9]{1,6}(ms|s|m|h|d|y)".prop_map(|s| format!("{s:?}")),
        "[0-9]{15,25}(ns|s|y)".prop_map(|s| format!("{s:?}")),
        any::<i64>().prop_map(|n| n.to_string()),
        "[0-9]{19,30}",
        any::<f64>().prop_map(|f| format!("{f:?}")),
        any::<bool>().prop_map(|b| b.to_string()),
        prop_oneof![
            Just("\"10.96.0.0/12\""),
            Just("\"fd00::/8\""),
            Just("\"169.254.169.254/32\""),
            Just("\"127.0.0.1:9464\""),
            Just("\"secondary\""),
            Just("\"primary\""),
            Just("\"json\""),
            Just("\"02:00:00:00:00:01\""),
            Just("\"enih\""),
            Just("\"enim\""),
        ]
        .prop_map(str::to_string),
    ];
    scalar.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            vec(("[a-z_]{1,10}", inner), 0..3).prop_map(|kv| {
                let kv: Vec<String> = kv.into_iter().map(|(k, v)| format!("{k} = {v}")).collect();
                format!("{{ {} }}", kv.join(", "))
            }),
        ]
    })
}

const CONFIG_KEYS: [(&str, &[&str]); 9] = [
    (
        "",
        &[
            "socket",
            "socket_group",
            "allowed_uids",
            "checkpoint",
            "checkpoint_fsync",
            "host_netns",
            "gc_interval",
            "gc_grace",
            "startup_wait",
            "allocation_expiry",
            "log_format",
            "metrics_address",
            "mode",
        ],
    ),
    ("exclude", &["enis", "addresses"]),
    (
        "secondary",
        &[
            "table_offset",
            "rule_priority_to_pod",
            "rule_priority_from_pod",
            "cooldown",
            "veth_prefix",
        ],
    ),
    (
        "host_path",
        &[
            "service_cidrs",
            "host_stack_cidrs",
            "interfaces",
            "veth_prefix",
            "masquerade",
            "nft",
            "ct_mark",
        ],
    ),
    ("pod_metadata", &["blocked", "allowed_namespaces"]),
    (
        "device_plugin",
        &["enabled", "dir", "kubelet_socket", "endpoint"],
    ),
    (
        "dra",
        &[
            "enabled",
            "driver",
            "registry_dir",
            "plugin_dir",
            "node_name",
            "kubeconfig",
            "claims",
            "sweep_interval",
        ],
    ),
    (
        "provider",
        &[
            "type",
            "enis",
            "node_name",
            "kubeconfig",
            "cache",
            "status_debounce",
            "subnet_id",
            "security_group_ids",
            "poll_interval",
            "imds_endpoint",
            "region",
        ],
    ),
    ("provider.pool", &["min_free", "max_free"]),
];

/// A config file: sections enimd knows with keys it knows (and a few it
/// does not), each with any value, or a known-good base with one line
/// replaced or a line of junk added.
fn config_text() -> impl Strategy<Value = String> {
    let line = (
        0..CONFIG_KEYS.len(),
        any::<prop::sample::Index>(),
        toml_value(),
        0u8..10,
    )
        .prop_map(|(section, key, value, odd)| {
            let (name, keys) = CONFIG_KEYS[section];
            let key = if odd == 0 {
                "unknown_key"
            } else {
                keys[key.index(keys.len())]
            };
            (name, format!("{key} = {value}"))
        });
    let provider = prop_oneof![
        Just("static"),
        Just("aws"),
        Just("bce"),
        Just("cluster"),
        Just("nimbus")
    ];
    let built = (vec(line, 0..10), provider).prop_map(|(lines, provider)| {
        let mut by_section: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        by_section
            .entry("provider")
            .or_default()
            .push(format!("type = {provider:?}"));
        for (section, line) in lines {
            // TOML allows a key once: the first wins here.
            let key = line.split(" = ").next().unwrap().to_string();
            let lines = by_section.entry(section).or_default();
            if !lines
                .iter()
                .any(|l| l.split(" = ").next() == Some(key.as_str()))
            {
                lines.push(line);
            }
        }
        let mut text = by_section.remove("").unwrap_or_default().join("\n");
        for (section, lines) in by_section {
            text.push_str(&format!("\n[{section}]\n{}\n", lines.join("\n")));
        }
        text
    });
    let mutated = (
        valid_config(),
        any::<prop::sample::Index>(),
        toml_value(),
        wild_string(),
    )
        .prop_map(|(text, at, value, junk)| {
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            let i = at.index(lines.len());
            match lines[i].split_once(" = ") {
                Some((key, _)) => lines[i] = format!("{key} = {value}"),
                None => lines.insert(i, junk),
            }
            lines.join("\n")
        });
    prop_oneof![
        2 => built,
        3 => mutated,
        2 => valid_config(),
        1 => wild_string(),
        1 => vec(any::<u8>(), 0..200).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

/// [`BASE_CONFIG`] over each provider, in either mode, with other
/// durations: configs `Config::parse` accepts.
fn valid_config() -> impl Strategy<Value = String> {
    let duration = "[1-9][0-9]{0,4}(ms|s|m|h)|[1-9]h [1-5]m|[1-9]m [1-5]s [1-9]ms";
    (
        prop::sample::select(PROVIDERS.to_vec()),
        prop_oneof![Just("primary"), Just("secondary")],
        vec(duration, 4),
    )
        .prop_map(|(provider, mode, durations)| {
            let mut text = BASE_CONFIG.replace("mode = \"primary\"", &format!("mode = {mode:?}"));
            for (key, d) in [
                "gc_interval",
                "gc_grace",
                "startup_wait",
                "allocation_expiry",
            ]
            .iter()
            .zip(durations)
            {
                let line = BASE_CONFIG.lines().find(|l| l.starts_with(key)).unwrap();
                text = text.replace(line, &format!("{key} = {d:?}"));
            }
            format!("{text}{provider}")
        })
}

/// The provider sections of [`valid_config`].
const PROVIDERS: [&str; 4] = [
    "[provider]\ntype = \"static\"\n[[provider.enis]]\nid = \"eni-1\"\nmac = \"02:00:00:00:00:01\"\n\
     ipv4 = \"10.0.0.10/24\"\ngateway4 = \"10.0.0.1\"\nmtu = 9001\ndevice_index = 1\n",
    "[provider]\ntype = \"aws\"\nsubnet_id = \"subnet-1\"\nsecurity_group_ids = [\"sg-1\"]\n\
     [provider.pool]\nmin_free = 2\nmax_free = 4\n",
    "[provider]\ntype = \"bce\"\nsecurity_group_ids = [\"g-1\"]\npoll_interval = \"1s\"\n",
    "[provider]\ntype = \"cluster\"\nnode_name = \"node-1\"\nstatus_debounce = \"50ms\"\n",
];

/// Every section but the provider's (see [`PROVIDERS`]).
const BASE_CONFIG: &str = r#"socket = "/run/enim/enimd.sock"
allowed_uids = [1000]
checkpoint = "/var/lib/enim/checkpoint.json"
gc_interval = "10s"
gc_grace = "30s"
startup_wait = "10s"
allocation_expiry = "2m"
log_format = "json"
metrics_address = "127.0.0.1:9464"
mode = "primary"
[exclude]
enis = ["eni-9"]
addresses = ["10.0.9.9"]
[secondary]
cooldown = "30s"
[host_path]
service_cidrs = ["10.96.0.0/12"]
host_stack_cidrs = ["169.254.20.10/32"]
[pod_metadata]
allowed_namespaces = ["kube-system"]
[device_plugin]
enabled = false
[dra]
enabled = false
"#;

proptest! {
    #![proptest_config(cases(256))]

    /// Any text as enimd's config: a config or an error, and a config
    /// written back as TOML reads back the same.
    #[test]
    fn config_of_any_text_parses_or_is_refused(text in config_text()) {
        use enim::daemon::config::{Config, ConfigError};
        match Config::parse(&text) {
            Ok(config) => {
                let written = toml::to_string(&config).unwrap();
                let back = Config::parse(&written)
                    .map_err(|e| TestCaseError::fail(format!("{e}\n{written}")))?;
                prop_assert_eq!(back, config);
            }
            Err(ConfigError::Parse { .. } | ConfigError::Invalid(_)) => {}
            Err(other) => prop_assert!(false, "{:?}", other),
        }
    }
}

#[test]
fn config_base_over_each_provider_is_valid() {
    for provider in PROVIDERS {
        enim::daemon::config::Config::parse(&format!("{BASE_CONFIG}{provider}")).unwrap();
    }
}

// ---------------------------------------------------------------------
// 5. The DRA driver: the prepared-claim record, the bound provider, the
//    devices published, and the ResourceClaims it reads.

mod dra {
    use enim::dra::bound::BoundProvider;
    use enim::dra::claims::{Claims, PreparedClaim, PreparedDevice};
    use enim::dra::DraError;
    use enim::provider::EniProvider;
    use enim_api::{EniState, EniStatus};
    use enim_core::{Eni, EniOwner, Placement, ProviderError};
    use enim_provider_static::{StaticEniConfig, StaticProvider};
    use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceClaim};

    use super::*;

    pub fn prepared_claim() -> impl Strategy<Value = PreparedClaim> {
        let device = (
            wild_string(),
            wild_string(),
            prop_oneof![
                3 => Just("eni-1".to_string()),
                3 => Just("eni-2".to_string()),
                1 => wild_string()
            ],
        )
            .prop_map(|(request, device, eni_id)| PreparedDevice {
                request,
                device,
                eni_id,
            });
        (
            prop_oneof![
                Just("u1".to_string()),
                Just("u2".to_string()),
                wild_string()
            ],
            wild_string(),
            wild_string(),
            vec(device, 0..3),
            vec(
                prop_oneof![3 => Just("pod-1".to_string()), 1 => wild_string()],
                0..3,
            ),
        )
            .prop_map(|(uid, namespace, name, devices, pods)| PreparedClaim {
                uid,
                namespace,
                name,
                devices,
                pods,
            })
    }

    pub fn static_eni(i: u8) -> StaticEniConfig {
        StaticEniConfig::new(
            format!("eni-{i}"),
            MacAddr([2, 0, 0, 0, 0, i]),
            format!("10.0.{i}.10/24").parse().unwrap(),
            Ipv4Addr::new(10, 0, i, 1),
        )
    }

    pub fn owner(container: &str, pod_uid: Option<String>) -> EniOwner {
        enim_testkit::fixtures::dra_owner(container, "p", pod_uid.as_deref())
    }

    pub fn eni_status() -> impl Strategy<Value = EniStatus> {
        let placement = (
            proptest::option::of(wild_string()),
            proptest::option::of("\\PC{0,80}"),
            vec(
                prop_oneof!["sg-[0-9a-f]{1,17}", wild_string(), "[a-z]{30,40}"],
                0..40,
            ),
            proptest::option::of(any::<u32>()),
        )
            .prop_map(|(subnet, zone, security_groups, network_card)| Placement {
                subnet,
                zone,
                security_groups,
                network_card,
            });
        let id = prop_oneof![
            "eni-[0-9a-fA-F]{1,17}",
            "[a-zA-Z0-9\\-]{0,70}",
            wild_string()
        ];
        let state = prop_oneof![
            Just(EniState::Free),
            Just(EniState::InUse),
            Just(EniState::Excluded),
            Just(EniState::Missing)
        ];
        (
            id,
            mac(),
            placement,
            state,
            proptest::option::of("[a-z0-9]{1,8}"),
            proptest::option::of(any::<u32>()),
            proptest::option::of(any::<u32>()),
        )
            .prop_map(
                |(id, mac, placement, state, host_device, mtu, device_index)| EniStatus {
                    eni: Eni {
                        id,
                        mac,
                        ipv4: "10.0.0.10/24".parse().unwrap(),
                        gateway4: Ipv4Addr::new(10, 0, 0, 1),
                        ipv6: None,
                        gateway6: None,
                        mtu,
                        owner: None,
                        device_index,
                        secondary_ips: Vec::new(),
                        placement,
                    },
                    state,
                    host_device,
                },
            )
    }

    /// A ResourceClaim as the API server serves it: this driver's results
    /// and others', and an opaque config of any JSON, in the claim's
    /// request and in its allocation.
    pub fn claim_json(results: &[(String, String, String)], parameters: &Value) -> Value {
        let results: Vec<Value> = results
            .iter()
            .map(|(driver, pool, device)| json!({"request": "eni", "driver": driver, "pool": pool, "device": device}))
            .collect();
        let config = json!([{ "requests": ["eni"], "opaque": { "driver": "enim.io", "parameters": parameters } }]);
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": { "name": "c", "namespace": "default", "uid": "u1" },
            "spec": { "devices": {
                "requests": [{ "name": "eni", "exactly": { "deviceClassName": "eni.enim.io" } }],
                "config": config.clone(),
            } },
            "status": {
                "allocation": { "devices": { "results": results, "config": [{
                    "source": "FromClaim", "requests": ["eni"],
                    "opaque": { "driver": "enim.io", "parameters": parameters }
                }] } },
                "reservedFor": [{ "resource": "pods", "name": "p", "uid": "pod-1" }]
            }
        })
    }

    pub fn results_of(rc: &ResourceClaim) -> Vec<(String, String, String)> {
        rc.status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .map(|r| {
                r.iter()
                    .map(|r| (r.driver.clone(), r.pool.clone(), r.device.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn is_string_within(attr: &DeviceAttribute, max: usize) -> bool {
        attr.string.as_ref().is_none_or(|s| s.len() <= max)
    }

    pub fn allocate(p: &BoundProvider, o: &EniOwner) -> Result<Eni, ProviderError> {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(p.allocate_next(o))
    }

    pub fn bound(dir: &Path, claims: &[PreparedClaim]) -> (Arc<Claims>, BoundProvider) {
        let claims_file = Arc::new(Claims::open(&dir.join("claims.json")).unwrap());
        for c in claims {
            claims_file.record(c.clone()).unwrap();
        }
        let inner: Arc<dyn EniProvider> =
            Arc::new(StaticProvider::new(vec![static_eni(1), static_eni(2)]).unwrap());
        (
            claims_file.clone(),
            BoundProvider::new(inner, claims_file, None, None),
        )
    }

    pub fn open_claims(path: &Path, bytes: &[u8]) -> Result<Option<Claims>, TestCaseError> {
        std::fs::write(path, bytes).unwrap();
        match Claims::open(path) {
            Ok(c) => Ok(Some(c)),
            Err(DraError::CorruptClaims { path: p, reason }) => {
                prop_assert_eq!(&p, path);
                prop_assert!(reason.contains("left as it is"), "{}", reason);
                prop_assert_eq!(std::fs::read(path).unwrap(), bytes);
                Ok(None)
            }
            Err(other) => Err(TestCaseError::fail(format!("not a parse error: {other}"))),
        }
    }
}

proptest! {
    #![proptest_config(cases(128))]

    /// The prepared-claim record of any bytes: the table, or an error
    /// naming the file, left as it was; any table written reads back.
    #[test]
    fn dra_claims_file_loads_or_is_refused_and_round_trips(
        bytes in mangled(vec(dra::prepared_claim(), 0..3).prop_map(|cs| {
            let claims: BTreeMap<String, _> = cs.into_iter().map(|c| (c.uid.clone(), c)).collect();
            serde_json::to_vec(&json!({ "claims": claims })).unwrap()
        })),
        claims in vec(dra::prepared_claim(), 0..4),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let _ = dra::open_claims(&dir.path().join("any.json"), &bytes)?;
        let path = dir.path().join("claims.json");
        let table = enim::dra::claims::Claims::open(&path).unwrap();
        let mut want = BTreeMap::new();
        for c in claims {
            want.insert(c.uid.clone(), c.clone());
            table.record(c).unwrap();
        }
        let back = enim::dra::claims::Claims::open(&path).unwrap();
        prop_assert_eq!(back.all(), want.into_values().collect::<Vec<_>>());
    }

    /// Whatever the records say and whatever pod uid CNI_ARGS carries, ADD
    /// gets an ENI the pod's claim names, or an error; never another one.
    #[test]
    fn dra_bound_provider_hands_out_only_a_claimed_eni(
        claims in vec(dra::prepared_claim(), 0..4),
        pod in prop_oneof![
            3 => Just(Some("pod-1".to_string())),
            1 => Just(None),
            1 => wild_string().prop_map(Some),
        ],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (table, provider) = dra::bound(dir.path(), &claims);
        let claimed: Vec<String> = pod
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(|p| table.enis_for_pod(p).into_iter().map(|(_, d)| d.eni_id).collect())
            .unwrap_or_default();
        // Nothing is held yet: the first claimed ENI, if the node has it.
        let want = claimed.first().filter(|id| *id == "eni-1" || *id == "eni-2");
        match (dra::allocate(&provider, &dra::owner("c1", pod)), want) {
            (Ok(eni), Some(id)) => prop_assert_eq!(&eni.id, id),
            (Err(_), None) => {}
            (got, want) => prop_assert!(false, "got {:?}, want {:?} of {:?}", got, want, claimed),
        }
    }

    /// ENIs of any id, placement and state as DRA devices: unique DNS-label
    /// names, the API's limits on attributes held, the index naming each.
    #[test]
    fn dra_devices_of_any_enis_keep_the_api_limits(enis in vec(dra::eni_status(), 0..12)) {
        use enim::dra::devices::{device_name, MAX_ATTRIBUTES, MAX_STRING, SG_DOMAIN};
        let sysfs = tempfile::tempdir().unwrap();
        let (devices, index) = enim::dra::slices::devices_of(&enis, sysfs.path(), &mut Default::default());
        prop_assert_eq!(devices.len(), index.len());
        for d in &devices {
            let eni_id = &index[&d.name];
            let name = device_name(eni_id);
            prop_assert_eq!(name.as_deref(), Some(d.name.as_str()));
            let attrs = d.attributes.as_ref().unwrap();
            prop_assert!(attrs.len() <= MAX_ATTRIBUTES, "{} attributes", attrs.len());
            for (name, attr) in attrs {
                prop_assert!(dra::is_string_within(attr, MAX_STRING), "{}", name);
                if let Some(id) = name.strip_prefix(&format!("{SG_DOMAIN}/")) {
                    prop_assert!(id.len() <= 32 && !id.starts_with(|c: char| c.is_ascii_digit()));
                    prop_assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'), "{}", id);
                }
            }
        }
    }

    /// A claim's opaque parameters are anyone's JSON: the claim still
    /// decodes as the agent reads it, with the same allocation results.
    #[test]
    fn dra_claim_with_any_opaque_parameters_decodes_the_same(
        parameters in json_value(),
        results in vec((prop_oneof![Just("enim.io".to_string()), wild_string()], wild_string(), wild_string()), 0..4),
    ) {
        let plain: k8s_openapi::api::resource::v1::ResourceClaim = serde_json::from_value(dra::claim_json(&results, &json!({}))).unwrap();
        let bytes = serde_json::to_vec(&dra::claim_json(&results, &parameters)).unwrap();
        let with: k8s_openapi::api::resource::v1::ResourceClaim = serde_json::from_slice(&bytes).unwrap();
        prop_assert_eq!(dra::results_of(&with), results.clone());
        prop_assert_eq!(dra::results_of(&plain), results);
        prop_assert_eq!(
            with.status.as_ref().and_then(|s| s.reserved_for.clone()),
            plain.status.as_ref().and_then(|s| s.reserved_for.clone())
        );
    }
}

/// Opaque parameters nested past serde_json's limit (128): the claim is
/// a decode error the agent reports, not a stack overflow.
#[test]
fn dra_claim_with_deeply_nested_parameters_is_an_error() {
    let mut deep = json!(1);
    for _ in 0..200 {
        deep = json!([deep]);
    }
    let bytes = serde_json::to_vec(&dra::claim_json(&[], &deep)).unwrap();
    let e = serde_json::from_slice::<k8s_openapi::api::resource::v1::ResourceClaim>(&bytes)
        .unwrap_err();
    assert!(e.to_string().contains("recursion limit"), "{e}");
}

// ---------------------------------------------------------------------
// Regressions found by the properties above.

/// MacAddr's parser took "+a" as an octet (u8::from_str_radix allows a
/// sign), so "+2:+0:+0:+0:+0:+1" was a MAC in a NetResourceSet spec, a
/// checkpoint or a metadata listing. Six pairs of hex digits only.
#[test]
fn a_mac_with_signed_octets_is_refused() {
    for bad in [
        "+2:+0:+0:+0:+0:+1",
        "02:00:00:00:00:+1",
        "+2-00-00-00-00-01",
    ] {
        assert!(bad.parse::<MacAddr>().is_err(), "{bad} accepted");
    }
    let cp = br#"{"version":"enim/2","attachments":[],"homes":{"+2:00:00:00:00:01":{"name":"eth1","mtu":1500}}}"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    std::fs::write(&path, cp).unwrap();
    let e = Checkpoint::open(&path, false).err().unwrap();
    assert!(matches!(e, CheckpointError::Corrupt { .. }), "{e}");
}

proptest! {
    #![proptest_config(cases(256))]

    /// A MAC that parses is six hex pairs: written back, it is the input
    /// in lower case with ':' (the form every listing and the checkpoint
    /// use).
    #[test]
    fn a_mac_that_parses_prints_as_it_was_written(
        text in prop_oneof![mac_text(), wild_string()]
    ) {
        if let Ok(mac) = text.parse::<MacAddr>() {
            prop_assert_eq!(mac.to_string(), text.to_ascii_lowercase().replace('-', ":"));
        }
    }
}
