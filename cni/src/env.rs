//! The CNI_* environment: which verb, which attachment, and the pod from
//! CNI_ARGS. Each verb requires only what the spec says it requires.

use std::ffi::OsString;
use std::path::PathBuf;

use enim_api::model::naming::valid_container_id;
use enim_core::PodRef;

use super::CniError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Gc,
    Status,
}

impl Command {
    pub fn parse(s: &str) -> Result<Self, CniError> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            other => {
                return Err(CniError::invalid_env(format!(
                    "CNI_COMMAND {other:?} is not one of ADD, DEL, CHECK, VERSION, GC, STATUS"
                )))
            }
        })
    }

    /// ADD, DEL and CHECK act on one attachment and need its key.
    fn needs_attachment(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

/// The environment of one invocation, validated for its verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniEnv {
    pub command: Command,
    /// Set for ADD, DEL and CHECK.
    pub container_id: Option<String>,
    /// Set for ADD and CHECK; for DEL only when the runtime still knows it.
    pub netns: Option<PathBuf>,
    /// Set for ADD, DEL and CHECK.
    pub ifname: Option<String>,
    pub pod: PodRef,
    /// Parsed but unused: enim delegates to no other plugin.
    pub path: Vec<PathBuf>,
}

/// Reads CNI_COMMAND alone, so VERSION and unknown verbs need nothing else.
pub fn command(lookup: &dyn Fn(&str) -> Option<OsString>) -> Result<Command, CniError> {
    let cmd = var(lookup, "CNI_COMMAND")?
        .ok_or_else(|| CniError::invalid_env("CNI_COMMAND is not set"))?;
    Command::parse(&cmd)
}

impl CniEnv {
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<OsString>) -> Result<Self, CniError> {
        let command = command(lookup)?;
        let mut env = CniEnv {
            command,
            container_id: None,
            netns: None,
            ifname: None,
            pod: PodRef::default(),
            path: Vec::new(),
        };
        if let Some(p) = var(lookup, "CNI_PATH")? {
            env.path = std::env::split_paths(&p).collect();
        }
        if !command.needs_attachment() {
            // GC and STATUS work on the whole network; per-container
            // variables are not theirs to check.
            return Ok(env);
        }

        let id = required(lookup, "CNI_CONTAINERID")?;
        if !valid_container_id(&id) {
            return Err(CniError::invalid_env(format!(
                "CNI_CONTAINERID {id:?} is invalid: it must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"
            )));
        }
        env.container_id = Some(id);

        let ifname = required(lookup, "CNI_IFNAME")?;
        validate_ifname(&ifname)?;
        env.ifname = Some(ifname);

        // DEL may come after the netns is gone and the runtime forgot it.
        let netns = match command {
            Command::Del => var(lookup, "CNI_NETNS")?,
            _ => Some(required(lookup, "CNI_NETNS")?),
        };
        if let Some(ns) = netns {
            // The agent opens it with another working directory.
            if !ns.starts_with('/') {
                return Err(CniError::invalid_env(format!(
                    "CNI_NETNS {ns:?} is not an absolute path"
                )));
            }
            env.netns = Some(PathBuf::from(ns));
        }

        if let Some(args) = var(lookup, "CNI_ARGS")? {
            env.pod = parse_cni_args(&args)?;
        }
        Ok(env)
    }
}

/// A variable as UTF-8; unset and empty are the same (runtimes differ).
fn var(lookup: &dyn Fn(&str) -> Option<OsString>, name: &str) -> Result<Option<String>, CniError> {
    match lookup(name) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => v
            .into_string()
            .map(Some)
            .map_err(|_| CniError::invalid_env(format!("{name} is not valid UTF-8"))),
    }
}

fn required(lookup: &dyn Fn(&str) -> Option<OsString>, name: &str) -> Result<String, CniError> {
    var(lookup, name)?.ok_or_else(|| CniError::invalid_env(format!("{name} is not set")))
}

/// What the kernel accepts as a link name (the checks libcni also makes).
fn validate_ifname(name: &str) -> Result<(), CniError> {
    let bad = |why: &str| CniError::invalid_env(format!("CNI_IFNAME {name:?} is invalid: {why}"));
    if name.len() > 15 {
        return Err(bad("longer than 15 bytes"));
    }
    if name == "." || name == ".." {
        return Err(bad("not a usable name"));
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(bad("contains '/', ':' or whitespace"));
    }
    Ok(())
}

/// CNI_ARGS, `K=V;K=V`: the Kubernetes pod keys. Unknown keys fail unless
/// `IgnoreUnknown` is true, as with libcni's args loader.
pub fn parse_cni_args(args: &str) -> Result<PodRef, CniError> {
    let mut pairs = Vec::new();
    // A trailing ';' leaves an empty segment; it carries nothing.
    for pair in args.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            CniError::invalid_env(format!("CNI_ARGS: {pair:?} is not a KEY=VALUE pair"))
        })?;
        if k.is_empty() {
            return Err(CniError::invalid_env(format!(
                "CNI_ARGS: {pair:?} has an empty key"
            )));
        }
        pairs.push((k, v));
    }

    // IgnoreUnknown may come after the unknown key, so look for it first.
    let mut ignore_unknown = false;
    for (k, v) in &pairs {
        if *k == "IgnoreUnknown" {
            ignore_unknown = match v.to_ascii_lowercase().as_str() {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => {
                    return Err(CniError::invalid_env(format!(
                        "CNI_ARGS: IgnoreUnknown={v:?} is not 1, true, 0 or false"
                    )))
                }
            };
        }
    }

    let mut pod = PodRef::default();
    let mut unknown = Vec::new();
    for (k, v) in pairs {
        match k {
            "K8S_POD_NAMESPACE" => pod.namespace = v.to_string(),
            "K8S_POD_NAME" => pod.name = v.to_string(),
            "K8S_POD_UID" => pod.uid = (!v.is_empty()).then(|| v.to_string()),
            // Known but not needed: the container id already names the sandbox.
            "K8S_POD_INFRA_CONTAINER_ID" | "IgnoreUnknown" => {}
            other => unknown.push(other),
        }
    }
    if !unknown.is_empty() && !ignore_unknown {
        return Err(CniError::invalid_env(format!(
            "CNI_ARGS: unknown key(s) {} (set IgnoreUnknown=1 to accept them)",
            unknown.join(", ")
        )));
    }
    Ok(pod)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> Result<CniEnv, CniError> {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        CniEnv::from_lookup(&|k| map.get(k).cloned())
    }

    fn full(cmd: &str) -> Vec<(&str, &str)> {
        vec![
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", "abc123"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
        ]
    }

    /// `full(cmd)` without `name`.
    fn full_without<'a>(cmd: &'a str, name: &str) -> Vec<(&'a str, &'a str)> {
        let mut vars = full(cmd);
        vars.retain(|(k, _)| *k != name);
        vars
    }

    /// A full ADD with `name` set to `value`.
    fn add_with<'a>(name: &'a str, value: &'a str) -> Vec<(&'a str, &'a str)> {
        let mut vars = full_without("ADD", name);
        vars.push((name, value));
        vars
    }

    fn msg_of(r: Result<CniEnv, CniError>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.code(), 4, "{e}");
        e.to_string()
    }

    #[test]
    fn full_add() {
        let mut vars = full("ADD");
        vars.push((
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=u-1",
        ));
        let env = env_of(&vars).unwrap();
        assert_eq!(env.command, Command::Add);
        assert_eq!(env.container_id.as_deref(), Some("abc123"));
        assert_eq!(env.ifname.as_deref(), Some("eth0"));
        assert_eq!(env.netns, Some(PathBuf::from("/run/netns/x")));
        assert_eq!(env.pod.namespace, "default");
        assert_eq!(env.pod.name, "web-0");
        assert_eq!(env.pod.uid.as_deref(), Some("u-1"));
        assert_eq!(env.path.len(), 2);
    }

    #[test]
    fn commands() {
        for (s, c) in [
            ("ADD", Command::Add),
            ("DEL", Command::Del),
            ("CHECK", Command::Check),
            ("VERSION", Command::Version),
            ("GC", Command::Gc),
            ("STATUS", Command::Status),
        ] {
            assert_eq!(Command::parse(s).unwrap(), c);
        }
        assert!(msg_of(env_of(&[("CNI_COMMAND", "add")])).contains("CNI_COMMAND"));
        assert!(msg_of(env_of(&[("CNI_COMMAND", "FROB")])).contains("FROB"));
        assert!(msg_of(env_of(&[])).contains("CNI_COMMAND"));
    }

    #[test]
    fn missing_variables_are_named() {
        for name in ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS"] {
            for cmd in ["ADD", "CHECK"] {
                let msg = msg_of(env_of(&full_without(cmd, name)));
                assert!(msg.contains(name), "{cmd} without {name}: {msg}");
            }
        }
        // Empty counts as unset.
        assert!(msg_of(env_of(&add_with("CNI_IFNAME", ""))).contains("CNI_IFNAME"));
    }

    #[test]
    fn del_netns_optional() {
        let env = env_of(&full_without("DEL", "CNI_NETNS")).unwrap();
        assert_eq!(env.netns, None);
        assert!(
            msg_of(env_of(&[("CNI_COMMAND", "DEL"), ("CNI_IFNAME", "eth0")]))
                .contains("CNI_CONTAINERID")
        );
    }

    #[test]
    fn gc_status_version_need_only_the_command() {
        for cmd in ["GC", "STATUS", "VERSION"] {
            let env = env_of(&[("CNI_COMMAND", cmd)]).unwrap();
            assert_eq!(env.container_id, None);
        }
    }

    #[test]
    fn container_id_pattern() {
        for ok in ["a", "0", "abc-DEF_1.2", "f00d"] {
            assert!(valid_container_id(ok), "{ok}");
        }
        for bad in ["", "-a", ".a", "_a", "a/b", "a b", "a:b", "é"] {
            assert!(!valid_container_id(bad), "{bad}");
        }
        let vars = add_with("CNI_CONTAINERID", "-bad");
        assert!(msg_of(env_of(&vars)).contains("CNI_CONTAINERID"));
    }

    #[test]
    fn ifname_and_netns_checked() {
        for bad in ["a/b", "a:b", "a b", ".", "..", "sixteen-chars-xx"] {
            let vars = add_with("CNI_IFNAME", bad);
            assert!(msg_of(env_of(&vars)).contains("CNI_IFNAME"), "{bad}");
        }
        let vars = add_with("CNI_NETNS", "netns/x");
        assert!(msg_of(env_of(&vars)).contains("CNI_NETNS"));
    }

    #[test]
    fn non_utf8_is_invalid() {
        use std::os::unix::ffi::OsStringExt;
        let lookup = |k: &str| match k {
            "CNI_COMMAND" => Some(OsString::from("DEL")),
            "CNI_CONTAINERID" => Some(OsString::from_vec(vec![b'a', 0xff])),
            _ => None,
        };
        let e = CniEnv::from_lookup(&lookup).unwrap_err();
        assert_eq!(e.code(), 4);
        assert!(e.to_string().contains("CNI_CONTAINERID"));
    }

    #[test]
    fn cni_args() {
        assert_eq!(parse_cni_args("").unwrap(), PodRef::default());
        let pod = parse_cni_args("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;").unwrap();
        assert_eq!((pod.namespace.as_str(), pod.name.as_str()), ("ns", "p"));
        assert_eq!(pod.uid, None);

        let e = parse_cni_args("K8S_POD_NAME=p;FOO=bar").unwrap_err();
        assert_eq!(e.code(), 4);
        assert!(e.to_string().contains("FOO"));

        // IgnoreUnknown before or after, any case.
        for args in [
            "IgnoreUnknown=1;FOO=bar;K8S_POD_NAME=p",
            "FOO=bar;K8S_POD_NAME=p;IgnoreUnknown=TRUE",
            "IgnoreUnknown=true;FOO=bar;K8S_POD_NAME=p",
        ] {
            assert_eq!(parse_cni_args(args).unwrap().name, "p", "{args}");
        }
        assert_eq!(
            parse_cni_args("IgnoreUnknown=0;FOO=bar")
                .unwrap_err()
                .code(),
            4
        );
        assert_eq!(parse_cni_args("IgnoreUnknown=maybe").unwrap_err().code(), 4);

        let e = parse_cni_args("K8S_POD_NAME").unwrap_err();
        assert_eq!(e.code(), 4);
        assert!(e.to_string().contains("K8S_POD_NAME"));
        assert_eq!(parse_cni_args("=x").unwrap_err().code(), 4);
        // A value may itself hold '='.
        assert_eq!(parse_cni_args("K8S_POD_NAME=a=b").unwrap().name, "a=b");
    }

    #[test]
    fn bad_cni_args_fail_env() {
        let mut vars = full("ADD");
        vars.push(("CNI_ARGS", "NOPE"));
        assert!(msg_of(env_of(&vars)).contains("CNI_ARGS"));
    }
}
