//! deploy/ as Kubernetes would read it: every manifest parsed into typed
//! objects, then checked against what enimd really does (its config, its
//! paths, its privileges, its probes, its install-cni command line).
//!
//! The checks collect problems instead of panicking, so the tests at the
//! bottom can break the manifests on purpose and see each check fail.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use enim::daemon::config::Config;
use enim::daemon::install;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Probe, ServiceAccount, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde_json::Value;

/// Until enimd's config has `metrics_address`, the address the probes are
/// written for (README, "Operating enim").
const ASSUMED_METRICS_ADDRESS: &str = "127.0.0.1:9464";
/// Where the runtime on the node looks for plugins and network configs.
const HOST_CNI_BIN_DIR: &str = install::DEFAULT_CNI_BIN_DIR;
const HOST_NET_D_DIR: &str = install::DEFAULT_NET_D_DIR;
/// A CNI_NETNS as containerd and CRI-O pass it.
const SAMPLE_NETNS: &str = "/var/run/netns/cni-0b9a3f2e-1c7d-4e55-a1f0-2d6c9b8e7a10";
const AGENT: &str = "enimd";
const INSTALLER: &str = "install-cni";

#[derive(Debug, Clone, Default)]
struct Manifests {
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    config_maps: Vec<ConfigMap>,
    daemon_sets: Vec<DaemonSet>,
    containerfile: String,
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn load() -> Manifests {
    let mut m = Manifests::default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in deploy/");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        if let Err(e) = parse_into(&mut m, &text) {
            panic!("{}: {e}", file.display());
        }
    }
    m.containerfile = std::fs::read_to_string(deploy_dir().join("Containerfile")).unwrap();
    m
}

/// Parses every document of one file into `m`. A kind this test does not
/// know is an error (a Role would need a reason: the agent uses no
/// Kubernetes API), and so is any field the typed object does not have: a
/// typo like `mountPropogation` would otherwise vanish silently, here and
/// in the API server's lenient decoding.
fn parse_into(m: &mut Manifests, text: &str) -> Result<(), String> {
    for doc in serde_yaml::Deserializer::from_str(text) {
        let yaml = serde_yaml::Value::deserialize(doc).map_err(|e| e.to_string())?;
        if yaml.is_null() {
            continue;
        }
        let raw = serde_json::to_value(&yaml).map_err(|e| e.to_string())?;
        let api = raw["apiVersion"].as_str().unwrap_or_default().to_owned();
        let kind = raw["kind"].as_str().unwrap_or_default().to_owned();
        let back = match (api.as_str(), kind.as_str()) {
            ("v1", "Namespace") => typed(&raw, &mut m.namespaces)?,
            ("v1", "ServiceAccount") => typed(&raw, &mut m.service_accounts)?,
            ("v1", "ConfigMap") => typed(&raw, &mut m.config_maps)?,
            ("apps/v1", "DaemonSet") => typed(&raw, &mut m.daemon_sets)?,
            _ => {
                return Err(format!(
                    "unexpected object {api}/{kind}: enimd needs no Kubernetes API access, \
                     so deploy/ holds no RBAC; extend this test with the reason if that changes"
                ))
            }
        };
        let diffs = diff("", &raw, &back);
        if !diffs.is_empty() {
            return Err(format!(
                "{kind}: fields the {kind} type does not have or reads differently: {}",
                diffs.join(", ")
            ));
        }
    }
    Ok(())
}

fn typed<T>(raw: &Value, into: &mut Vec<T>) -> Result<Value, String>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let obj: T = serde_json::from_value(raw.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&obj).map_err(|e| e.to_string())?;
    into.push(obj);
    Ok(back)
}

/// Paths where `raw` (the file) and `back` (the typed object) differ.
fn diff(at: &str, raw: &Value, back: &Value) -> Vec<String> {
    match (raw, back) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter()
                .flat_map(|k| {
                    let sub = format!("{at}.{k}");
                    match (a.get(k), b.get(k)) {
                        (Some(x), Some(y)) => diff(&sub, x, y),
                        (Some(_), None) => vec![format!("{sub} (unknown)")],
                        (None, Some(_)) => vec![format!("{sub} (added)")],
                        (None, None) => vec![],
                    }
                })
                .collect()
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .flat_map(|(i, (x, y))| diff(&format!("{at}[{i}]"), x, y))
            .collect(),
        _ if raw == back => vec![],
        _ => vec![format!("{at} ({raw} read as {back})")],
    }
}

/// Problems found, each a sentence naming the manifest part.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }
}

fn one<'a, T>(items: &'a [T], what: &str, p: &mut Problems) -> Option<&'a T> {
    p.check(items.len() == 1, || {
        format!("expected exactly one {what}, found {}", items.len())
    });
    items.first()
}

fn pod_spec(ds: &DaemonSet) -> Option<&PodSpec> {
    ds.spec.as_ref()?.template.spec.as_ref()
}

fn container<'a>(list: Option<&'a Vec<Container>>, name: &str) -> Option<&'a Container> {
    list?.iter().find(|c| c.name == name)
}

fn mounts(c: &Container) -> &[VolumeMount] {
    c.volume_mounts.as_deref().unwrap_or_default()
}

fn volume<'a>(spec: &'a PodSpec, name: &str) -> Option<&'a Volume> {
    spec.volumes.as_ref()?.iter().find(|v| v.name == name)
}

/// The mount `path` falls under in `c` (the deepest one), and the rest of
/// the path below it.
fn mount_of<'a>(c: &'a Container, path: &Path) -> Option<(&'a VolumeMount, PathBuf)> {
    mounts(c)
        .iter()
        .filter(|m| path.starts_with(&m.mount_path))
        .max_by_key(|m| Path::new(&m.mount_path).components().count())
        .map(|m| {
            let rest = path.strip_prefix(&m.mount_path).unwrap().to_path_buf();
            (m, rest)
        })
}

/// Where `path` in container `c` lives on the node, if on a hostPath.
fn host_path_of<'a>(
    spec: &PodSpec,
    c: &'a Container,
    path: &Path,
) -> Option<(PathBuf, &'a VolumeMount)> {
    let (m, rest) = mount_of(c, path)?;
    let hp = volume(spec, &m.name)?.host_path.as_ref()?;
    let sub = m.sub_path.as_deref().unwrap_or("");
    Some((Path::new(&hp.path).join(sub).join(rest), m))
}

/// The ConfigMap name and key that file `path` in `c` comes from.
fn config_map_file(spec: &PodSpec, c: &Container, path: &Path) -> Option<(String, String)> {
    let (m, rest) = mount_of(c, path)?;
    let cm = volume(spec, &m.name)?.config_map.as_ref()?;
    let file = match &m.sub_path {
        Some(sub) => Path::new(sub).join(&rest),
        None => rest,
    };
    let file = file.to_str()?.to_owned();
    let key = match &cm.items {
        None => file,
        Some(items) => items.iter().find(|i| i.path == file)?.key.clone(),
    };
    Some((cm.name.clone(), key))
}

fn writable(m: &VolumeMount) -> bool {
    m.read_only != Some(true)
}

/// A command line split into its flags and their values; `None` for any
/// flag not in `known` (value-taking flags only).
fn flags(args: &[String], known: &[&str]) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, value) = match a.split_once('=') {
            Some((f, v)) => (f.to_owned(), v.to_owned()),
            None => (
                a.clone(),
                it.next().cloned().ok_or(format!("{a} has no value"))?,
            ),
        };
        let flag = if flag == "-c" {
            "--config".into()
        } else {
            flag
        };
        if !known.contains(&flag.as_str()) {
            return Err(format!(
                "{flag}: keep settings in the ConfigMap, where this test checks them"
            ));
        }
        out.insert(flag, value);
    }
    Ok(out)
}

fn command_line(c: &Container) -> Vec<String> {
    let mut v = c.command.clone().unwrap_or_default();
    v.extend(c.args.clone().unwrap_or_default());
    v
}

/// The config the agent will run with, from the ConfigMap its `--config`
/// points at.
fn agent_config(m: &Manifests, p: &mut Problems) -> Option<(Config, String)> {
    let ds = m.daemon_sets.first()?;
    let spec = pod_spec(ds)?;
    let agent = container(Some(&spec.containers), AGENT)?;
    let line = command_line(agent);
    let f = match flags(
        line.get(1..).unwrap_or_default(),
        &["--config", "--log-format"],
    ) {
        Ok(f) => f,
        Err(e) => {
            p.0.push(format!("agent command: {e}"));
            return None;
        }
    };
    let path = f
        .get("--config")
        .cloned()
        .unwrap_or_else(|| "/etc/enim/enimd.toml".into());
    let Some((cm_name, key)) = config_map_file(spec, agent, Path::new(&path)) else {
        p.0.push(format!(
            "agent config {path} is not mounted from a ConfigMap"
        ));
        return None;
    };
    let Some(cm) = m
        .config_maps
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(&cm_name))
    else {
        p.0.push(format!("agent config: no ConfigMap {cm_name} in deploy/"));
        return None;
    };
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(&key)) else {
        p.0.push(format!("ConfigMap {cm_name} has no key {key}"));
        return None;
    };
    match Config::parse(text) {
        Ok(c) => Some((c, path)),
        Err(e) => {
            p.0.push(format!(
                "ConfigMap {cm_name} {key} is not a config enimd accepts: {e}"
            ));
            None
        }
    }
}

/// The metrics listener's address: enimd's own (default or configured)
/// once its config has the key, else the assumed one.
fn metrics_address(config: &Config, p: &mut Problems) -> Option<SocketAddr> {
    let v = serde_json::to_value(config).unwrap();
    match v.get("metrics_address") {
        None => {
            eprintln!(
                "note: enimd's config has no metrics_address yet; probes checked against \
                 {ASSUMED_METRICS_ADDRESS}"
            );
            Some(ASSUMED_METRICS_ADDRESS.parse().unwrap())
        }
        Some(Value::String(s)) => match s.parse() {
            Ok(a) => Some(a),
            Err(e) => {
                p.0.push(format!("metrics_address {s:?}: {e}"));
                None
            }
        },
        Some(other) => {
            p.0.push(format!(
                "metrics_address is {other}: the probes need the metrics listener on"
            ));
            None
        }
    }
}

fn check_probe(
    c: &Container,
    probe: Option<&Probe>,
    which: &str,
    path: &str,
    addr: SocketAddr,
    p: &mut Problems,
) {
    let Some(get) = probe.and_then(|pr| pr.http_get.as_ref()) else {
        p.0.push(format!("{which}: no httpGet probe"));
        return;
    };
    p.check(get.path.as_deref() == Some(path), || {
        format!("{which} path is {:?}, not {path}", get.path)
    });
    p.check(matches!(get.scheme.as_deref(), None | Some("HTTP")), || {
        format!(
            "{which} scheme {:?}: the metrics listener is plain HTTP",
            get.scheme
        )
    });
    let port = match &get.port {
        IntOrString::Int(n) => Some(*n),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|cp| cp.name.as_deref() == Some(name))
            .map(|cp| cp.container_port),
    };
    p.check(port == Some(i32::from(addr.port())), || {
        format!(
            "{which} port {:?} is not the metrics port {}",
            get.port,
            addr.port()
        )
    });
    // kubelet probes the pod IP (the node's, with hostNetwork) unless told
    // otherwise: a listener on loopback only answers a loopback host.
    if addr.ip().is_loopback() {
        p.check(get.host.as_deref() == Some(&addr.ip().to_string()), || {
            format!(
                "{which} host {:?}: the listener is on {}, so the probe must use it",
                get.host,
                addr.ip()
            )
        });
    } else if !addr.ip().is_unspecified() {
        p.check(
            get.host.is_none() || get.host.as_deref() == Some(&addr.ip().to_string()),
            || format!("{which} host {:?} is not {}", get.host, addr.ip()),
        );
    }
}

fn caps(
    c: &Container,
    which: fn(&k8s_openapi::api::core::v1::Capabilities) -> Option<&Vec<String>>,
) -> BTreeSet<String> {
    c.security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .and_then(which)
        .into_iter()
        .flatten()
        .map(|s| s.trim_start_matches("CAP_").to_owned())
        .collect()
}

/// The `COPY` destination dir of each file in the Containerfile, and
/// whether it has instructions that fetch or run anything.
fn containerfile_layout(text: &str, p: &mut Problems) -> BTreeMap<String, PathBuf> {
    let mut placed = BTreeMap::new();
    let mut from = 0;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let instr = words.next().unwrap_or_default().to_ascii_uppercase();
        let rest: Vec<&str> = words.filter(|w| !w.starts_with("--")).collect();
        match instr.as_str() {
            "FROM" => from += 1,
            "COPY" => {
                if let Some((dest, srcs)) = rest.split_last() {
                    for s in srcs {
                        let name = Path::new(s).file_name().unwrap().to_str().unwrap();
                        placed.insert(name.to_owned(), PathBuf::from(dest));
                    }
                }
            }
            // Packaging only: the binaries come from `cargo build --release`.
            "RUN" | "ADD" => p.0.push(format!(
                "Containerfile: {line:?}: the image only packages prebuilt binaries"
            )),
            _ => {}
        }
    }
    p.check(from == 1, || {
        format!("Containerfile: {from} FROM lines, expected one base image")
    });
    placed
}

/// Checks that `path` in `c` is the same path on the node (a hostPath
/// mount), writable if `rw`; returns its mount.
fn same_on_host<'a>(
    spec: &PodSpec,
    c: &'a Container,
    path: &Path,
    what: &str,
    rw: bool,
    p: &mut Problems,
) -> Option<&'a VolumeMount> {
    let Some((host, mount)) = host_path_of(spec, c, path) else {
        p.0.push(format!(
            "{what} {} is not on a hostPath mount of {}",
            path.display(),
            c.name
        ));
        return None;
    };
    p.check(host == path, || {
        format!(
            "{what} {} is {} on the node, not the same path",
            path.display(),
            host.display()
        )
    });
    p.check(!rw || writable(mount), || {
        format!("{what} {} is mounted read-only", path.display())
    });
    Some(mount)
}

/// Everything but running install-cni.
fn check(m: &Manifests) -> Vec<String> {
    let mut p = Problems::default();
    let Some(ds) = one(&m.daemon_sets, "DaemonSet", &mut p) else {
        return p.0;
    };
    let Some(spec) = pod_spec(ds) else {
        p.0.push("DaemonSet has no pod spec".into());
        return p.0;
    };
    let ns = one(&m.namespaces, "Namespace", &mut p).and_then(|n| n.metadata.name.clone());
    let sa = one(&m.service_accounts, "ServiceAccount", &mut p);

    // Namespace: all objects in it; Pod Security must let the agent run.
    let objects = m
        .service_accounts
        .iter()
        .map(|o| ("ServiceAccount", &o.metadata))
        .chain(m.config_maps.iter().map(|o| ("ConfigMap", &o.metadata)))
        .chain(m.daemon_sets.iter().map(|o| ("DaemonSet", &o.metadata)));
    for (kind, meta) in objects {
        p.check(meta.namespace == ns, || {
            format!(
                "{kind} {:?} is in namespace {:?}, not {ns:?}",
                meta.name, meta.namespace
            )
        });
    }
    if let Some(n) = m.namespaces.first() {
        let level = n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("pod-security.kubernetes.io/enforce"));
        p.check(level.map(String::as_str) == Some("privileged"), || {
            format!(
                "Namespace enforces Pod Security {level:?}: \
                 hostNetwork, hostPath and NET_ADMIN need \"privileged\""
            )
        });
    }

    // Identity: a ServiceAccount with no token, and nothing granted.
    if let Some(sa) = sa {
        p.check(
            spec.service_account_name.is_some() && spec.service_account_name == sa.metadata.name,
            || {
                format!(
                    "pod runs as {:?}, not ServiceAccount {:?}",
                    spec.service_account_name, sa.metadata.name
                )
            },
        );
        p.check(sa.automount_service_account_token == Some(false), || {
            "ServiceAccount mounts a token: the agent uses no Kubernetes API".into()
        });
    }
    p.check(spec.automount_service_account_token == Some(false), || {
        "pod mounts a service account token: the agent uses no Kubernetes API".into()
    });

    // Selector and scheduling.
    let ds_spec = ds.spec.as_ref().unwrap();
    let labels = ds_spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let selector = ds_spec.selector.match_labels.clone().unwrap_or_default();
    p.check(
        !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        || "DaemonSet selector does not match its pod template's labels".into(),
    );
    let tolerates_all =
        spec.tolerations.iter().flatten().any(|t| {
            t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()
        });
    p.check(tolerates_all, || {
        "no catch-all toleration: a new node stays NotReady until its CNI runs".into()
    });

    // Host namespaces.
    p.check(spec.host_network == Some(true), || {
        "hostNetwork is not true: ENIs live in the host network namespace".into()
    });
    p.check(spec.host_pid != Some(true), || {
        "hostPID: netns paths are under /var/run/netns, no host PIDs are needed".into()
    });
    p.check(spec.host_ipc != Some(true), || {
        "hostIPC is not needed".into()
    });
    p.check(spec.dns_policy.as_deref() == Some("Default"), || {
        format!(
            "dnsPolicy {:?}: the node's resolver, since cluster DNS may wait for pod networking",
            spec.dns_policy
        )
    });

    let Some(agent) = container(Some(&spec.containers), AGENT) else {
        p.0.push(format!("no container {AGENT}"));
        return p.0;
    };
    let Some(init) = container(spec.init_containers.as_ref(), INSTALLER) else {
        p.0.push(format!("no init container {INSTALLER}"));
        return p.0;
    };
    let Some((config, config_path)) = agent_config(m, &mut p) else {
        return p.0;
    };

    // Paths: each of the agent's paths is on the node, at the same path.
    // The plugin on the host connects to the path in the conflist.
    same_on_host(spec, agent, &config.socket, "socket", true, &mut p);
    // The checkpoint survives restarts and upgrades only on the node.
    same_on_host(spec, agent, &config.checkpoint, "checkpoint", true, &mut p);
    if let Some(netns) = &config.host_netns {
        same_on_host(spec, agent, netns, "host_netns", false, &mut p);
    }
    if let Some(mount) = same_on_host(
        spec,
        agent,
        Path::new(SAMPLE_NETNS),
        "pod netns",
        false,
        &mut p,
    ) {
        // Bidirectional would need privileged; without propagation, pods
        // created after the agent started would be invisible to it.
        let propagation = mount.mount_propagation.as_deref();
        p.check(propagation == Some("HostToContainer"), || {
            format!("netns mount propagation {propagation:?}, not HostToContainer")
        });
    }
    // Every hostPath is used, and every mount has a volume.
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        for mnt in mounts(c) {
            p.check(volume(spec, &mnt.name).is_some(), || {
                format!("{}: mount {} has no volume", c.name, mnt.name)
            });
        }
    }
    for v in spec.volumes.iter().flatten() {
        let used = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .any(|c| mounts(c).iter().any(|mnt| mnt.name == v.name));
        p.check(used, || format!("volume {} is mounted nowhere", v.name));
    }

    // install-cni: same image, same binary, host CNI dirs, same socket.
    p.check(init.image.is_some() && init.image == agent.image, || {
        format!(
            "install-cni image {:?} differs from the agent's {:?}: plugin and agent must match",
            init.image, agent.image
        )
    });
    let agent_line = command_line(agent);
    let init_line = command_line(init);
    p.check(init_line.first() == agent_line.first(), || {
        format!(
            "install-cni runs {:?}, the agent {:?}",
            init_line.first(),
            agent_line.first()
        )
    });
    p.check(
        init_line.get(1).map(String::as_str) == Some("install-cni"),
        || format!("init container command {init_line:?} is not `enimd install-cni`"),
    );
    match flags(
        init_line.get(2..).unwrap_or_default(),
        &[
            "--cni-bin-dir",
            "--net-d-dir",
            "--config",
            "--socket",
            "--plugin",
            "--conflist-name",
            "--network-name",
        ],
    ) {
        Err(e) => p.0.push(format!("install-cni: {e}")),
        Ok(f) => {
            let dir = |flag: &str, default: &str| {
                PathBuf::from(f.get(flag).map(String::as_str).unwrap_or(default))
            };
            for (flag, default, host) in [
                (
                    "--cni-bin-dir",
                    install::DEFAULT_CNI_BIN_DIR,
                    HOST_CNI_BIN_DIR,
                ),
                ("--net-d-dir", install::DEFAULT_NET_D_DIR, HOST_NET_D_DIR),
            ] {
                let path = dir(flag, default);
                match host_path_of(spec, init, &path) {
                    Some((on_host, mount)) => {
                        p.check(on_host == Path::new(host), || {
                            format!(
                                "install-cni {flag} {} is {} on the node, not {host}",
                                path.display(),
                                on_host.display()
                            )
                        });
                        p.check(writable(mount), || {
                            format!("install-cni {flag} is mounted read-only")
                        });
                    }
                    None => p.0.push(format!(
                        "install-cni {flag} {} is not on a hostPath mount",
                        path.display()
                    )),
                }
            }
            // The conflist's socket must be the agent's.
            match (f.get("--socket"), f.get("--config")) {
                (Some(s), _) => p.check(Path::new(s) == config.socket, || {
                    format!(
                        "install-cni --socket {s} is not the agent's {}",
                        config.socket.display()
                    )
                }),
                (None, Some(c)) => {
                    let theirs = config_map_file(spec, init, Path::new(c));
                    let ours = config_map_file(spec, agent, Path::new(&config_path));
                    p.check(theirs.is_some() && theirs == ours, || {
                        format!("install-cni reads config {theirs:?}, the agent {ours:?}")
                    });
                }
                (None, None) => p.check(
                    config.socket == Path::new(enim::api::DEFAULT_SOCKET),
                    || "install-cni writes the default socket, but the agent's is not".into(),
                ),
            }
            p.check(!f.contains_key("--plugin"), || {
                "install-cni --plugin: the image keeps enim next to enimd, the default".into()
            });
        }
    }

    // Image layout: enim next to the enimd the pod runs, nothing fetched.
    let placed = containerfile_layout(&m.containerfile, &mut p);
    let exe = agent_line.first().map(PathBuf::from).unwrap_or_default();
    for bin in ["enimd", "enim", "enimctl"] {
        p.check(
            placed.get(bin).map(PathBuf::as_path) == exe.parent(),
            || {
                format!(
                    "Containerfile puts {bin} in {:?}, the pod runs {}",
                    placed.get(bin),
                    exe.display()
                )
            },
        );
    }
    p.check(exe.file_name().is_some_and(|n| n == "enimd"), || {
        format!("agent runs {}, not enimd", exe.display())
    });

    // Privileges.
    let agent_sc = agent.security_context.clone().unwrap_or_default();
    let init_sc = init.security_context.clone().unwrap_or_default();
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let sc = c.security_context.clone().unwrap_or_default();
        p.check(sc.privileged != Some(true), || {
            format!("{} is privileged", c.name)
        });
        p.check(caps(c, |c| c.drop.as_ref()).contains("ALL"), || {
            format!("{} does not drop ALL capabilities", c.name)
        });
        p.check(sc.read_only_root_filesystem == Some(true), || {
            format!("{} has a writable root filesystem", c.name)
        });
        let seccomp = sc
            .seccomp_profile
            .or_else(|| spec.security_context.as_ref()?.seccomp_profile.clone())
            .map(|s| s.type_);
        p.check(seccomp.as_deref() == Some("RuntimeDefault"), || {
            format!(
                "{} runs with seccomp {seccomp:?}, not RuntimeDefault",
                c.name
            )
        });
    }
    let mut need: BTreeSet<String> = ["NET_ADMIN", "SYS_ADMIN"].map(String::from).into();
    if config.socket_group.is_some() {
        // chown of the socket to a group root is not in.
        need.insert("CHOWN".into());
    }
    let added = caps(agent, |c| c.add.as_ref());
    p.check(added == need, || {
        format!(
            "agent adds capabilities {added:?}, needs exactly {need:?} \
             (NET_ADMIN: netlink; SYS_ADMIN: setns)"
        )
    });
    // Added capabilities only reach uid 0 (Kubernetes has no ambient ones).
    p.check(agent_sc.run_as_user == Some(0), || {
        format!(
            "agent runs as {:?}: its capabilities only take effect as uid 0",
            agent_sc.run_as_user
        )
    });
    // The API server rejects this combination.
    p.check(
        !(added.contains("SYS_ADMIN") && agent_sc.allow_privilege_escalation == Some(false)),
        || "agent: allowPrivilegeEscalation false with SYS_ADMIN is rejected by the API".into(),
    );
    p.check(caps(init, |c| c.add.as_ref()).is_empty(), || {
        "install-cni adds capabilities: writing root-owned dirs as root needs none".into()
    });
    p.check(init_sc.allow_privilege_escalation == Some(false), || {
        "install-cni allows privilege escalation".into()
    });

    // Probes on the metrics listener.
    if let Some(addr) = metrics_address(&config, &mut p) {
        check_probe(
            agent,
            agent.readiness_probe.as_ref(),
            "readinessProbe",
            "/readyz",
            addr,
            &mut p,
        );
        check_probe(
            agent,
            agent.liveness_probe.as_ref(),
            "livenessProbe",
            "/healthz",
            addr,
            &mut p,
        );
    }
    p.0
}

/// Runs the init container's command line with the real enimd, in a temp
/// dir standing in for the container's root (ConfigMap files and hostPath
/// mounts at their mount paths), and checks the conflist it writes.
fn run_install_cni(m: &Manifests) -> Vec<String> {
    let mut p = Problems::default();
    let ds = &m.daemon_sets[0];
    let spec = pod_spec(ds).unwrap();
    let init = container(spec.init_containers.as_ref(), INSTALLER).unwrap();
    let Some((config, _)) = agent_config(m, &mut p) else {
        return p.0;
    };
    let root = tempfile::tempdir().unwrap();
    let inside = |path: &str| {
        let rel: PathBuf = Path::new(path)
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .collect();
        root.path().join(rel)
    };
    for mnt in mounts(init) {
        let dir = inside(&mnt.mount_path);
        std::fs::create_dir_all(&dir).unwrap();
        let Some(cm) = volume(spec, &mnt.name).and_then(|v| v.config_map.as_ref()) else {
            continue;
        };
        let data = m
            .config_maps
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(&cm.name))
            .and_then(|c| c.data.clone())
            .unwrap_or_default();
        for (key, text) in data {
            std::fs::write(dir.join(key), text).unwrap();
        }
    }
    let line = command_line(init);
    // Absolute paths are re-rooted; everything else passes as is.
    let args: Vec<PathBuf> = line[1..]
        .iter()
        .map(|a| {
            if a.starts_with('/') {
                inside(a)
            } else {
                PathBuf::from(a)
            }
        })
        .collect();
    let out = Command::new(env!("CARGO_BIN_EXE_enimd"))
        .args(&args)
        .output()
        .unwrap();
    if !out.status.success() {
        p.0.push(format!(
            "`{}` failed: {}",
            line.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
        return p.0;
    }
    let f = flags(
        &line[2..],
        &[
            "--cni-bin-dir",
            "--net-d-dir",
            "--config",
            "--socket",
            "--plugin",
            "--conflist-name",
            "--network-name",
        ],
    )
    .unwrap();
    let net_d = inside(
        f.get("--net-d-dir")
            .map(String::as_str)
            .unwrap_or(install::DEFAULT_NET_D_DIR),
    );
    let bin = inside(
        f.get("--cni-bin-dir")
            .map(String::as_str)
            .unwrap_or(install::DEFAULT_CNI_BIN_DIR),
    );
    let name = f
        .get("--conflist-name")
        .map(String::as_str)
        .unwrap_or(install::DEFAULT_CONFLIST_NAME);
    match std::fs::read(net_d.join(name)) {
        Err(e) => p.0.push(format!("no conflist {name} written: {e}")),
        Ok(bytes) => {
            let list: Value = serde_json::from_slice(&bytes).unwrap();
            let plugin = &list["plugins"][0];
            p.check(plugin["type"] == "enim", || {
                format!("conflist plugin type {}", plugin["type"])
            });
            p.check(plugin["socket"].as_str() == config.socket.to_str(), || {
                format!(
                    "conflist socket {} is not the agent's {}",
                    plugin["socket"],
                    config.socket.display()
                )
            });
        }
    }
    match std::fs::metadata(bin.join("enim")) {
        Ok(md) => p.check(md.permissions().mode() & 0o777 == 0o755, || {
            "plugin not 0755".into()
        }),
        Err(e) => p.0.push(format!("no plugin written: {e}")),
    }
    p.0
}

#[test]
fn deploy_manifests_match_what_enimd_does() {
    let m = load();
    let mut problems = check(&m);
    if problems.is_empty() {
        problems = run_install_cni(&m);
    }
    assert!(
        problems.is_empty(),
        "deploy/ problems:\n  {}",
        problems.join("\n  ")
    );
}

// The checks above must fail when the manifests are broken. Each case
// breaks one thing in the parsed manifests and expects a problem naming it.

fn agent_mut(m: &mut Manifests) -> &mut Container {
    spec_mut(m)
        .containers
        .iter_mut()
        .find(|c| c.name == AGENT)
        .unwrap()
}

fn init_mut(m: &mut Manifests) -> &mut Container {
    spec_mut(m)
        .init_containers
        .as_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c.name == INSTALLER)
        .unwrap()
}

fn spec_mut(m: &mut Manifests) -> &mut PodSpec {
    m.daemon_sets[0]
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
}

fn toml_mut(m: &mut Manifests) -> &mut String {
    m.config_maps[0]
        .data
        .as_mut()
        .unwrap()
        .get_mut("enimd.toml")
        .unwrap()
}

fn expect_problem(name: &str, m: &Manifests, needle: &str) {
    let problems = check(m);
    assert!(
        problems.iter().any(|p| p.contains(needle)),
        "{name}: expected a problem mentioning {needle:?}, got {problems:?}"
    );
}

#[test]
fn each_check_fails_on_a_broken_manifest() {
    let good = load();
    type Break = fn(&mut Manifests);
    let cases: &[(&str, Break, &str)] = &[
        (
            "netns mount gone",
            |m| {
                agent_mut(m)
                    .volume_mounts
                    .as_mut()
                    .unwrap()
                    .retain(|v| v.mount_path != "/var/run/netns")
            },
            "pod netns",
        ),
        (
            "netns without propagation",
            |m| {
                for v in agent_mut(m).volume_mounts.as_mut().unwrap() {
                    v.mount_propagation = None;
                }
            },
            "propagation",
        ),
        (
            "socket dir not mounted",
            |m| {
                agent_mut(m)
                    .volume_mounts
                    .as_mut()
                    .unwrap()
                    .retain(|v| v.mount_path != "/run/enim")
            },
            "socket",
        ),
        (
            "state dir on an emptyDir",
            |m| {
                let v = spec_mut(m)
                    .volumes
                    .as_mut()
                    .unwrap()
                    .iter_mut()
                    .find(|v| v.name == "state")
                    .unwrap();
                v.host_path = None;
                v.empty_dir = Some(Default::default());
            },
            "checkpoint",
        ),
        (
            "socket moved in config only",
            |m| {
                *toml_mut(m) =
                    toml_mut(m).replace("/run/enim/enimd.sock", "/run/elsewhere/enimd.sock")
            },
            "socket",
        ),
        (
            "checkpoint moved in config only",
            |m| {
                *toml_mut(m) = toml_mut(m).replace(
                    "/var/lib/enim/checkpoint.json",
                    "/var/lib/other/checkpoint.json",
                )
            },
            "checkpoint",
        ),
        (
            "unknown config key",
            |m| toml_mut(m).insert_str(0, "sokcet = \"/x\"\n"),
            "not a config enimd accepts",
        ),
        (
            "privileged",
            |m| agent_mut(m).security_context.as_mut().unwrap().privileged = Some(true),
            "is privileged",
        ),
        (
            "SYS_ADMIN dropped",
            |m| {
                let c = agent_mut(m)
                    .security_context
                    .as_mut()
                    .unwrap()
                    .capabilities
                    .as_mut()
                    .unwrap();
                c.add.as_mut().unwrap().retain(|c| c != "SYS_ADMIN");
            },
            "capabilities",
        ),
        (
            "extra capability",
            |m| {
                let c = agent_mut(m)
                    .security_context
                    .as_mut()
                    .unwrap()
                    .capabilities
                    .as_mut()
                    .unwrap();
                c.add.as_mut().unwrap().push("SYS_PTRACE".into());
            },
            "capabilities",
        ),
        (
            "no drop ALL",
            |m| {
                agent_mut(m)
                    .security_context
                    .as_mut()
                    .unwrap()
                    .capabilities
                    .as_mut()
                    .unwrap()
                    .drop = None
            },
            "drop ALL",
        ),
        (
            "escalation off with SYS_ADMIN",
            |m| {
                agent_mut(m)
                    .security_context
                    .as_mut()
                    .unwrap()
                    .allow_privilege_escalation = Some(false)
            },
            "allowPrivilegeEscalation",
        ),
        ("hostPID", |m| spec_mut(m).host_pid = Some(true), "hostPID"),
        (
            "no hostNetwork",
            |m| spec_mut(m).host_network = None,
            "hostNetwork",
        ),
        (
            "init writes the wrong net.d",
            |m| {
                let v = spec_mut(m)
                    .volumes
                    .as_mut()
                    .unwrap()
                    .iter_mut()
                    .find(|v| v.name == "cni-net-d")
                    .unwrap();
                v.host_path.as_mut().unwrap().path = "/etc/cni/net.d.old".into();
            },
            "--net-d-dir",
        ),
        (
            "init cni bin dir outside its mount",
            |m| {
                let c = init_mut(m).command.as_mut().unwrap();
                let i = c.iter().position(|a| a == "--cni-bin-dir").unwrap();
                c[i + 1] = "/opt/cni/bin".into();
            },
            "--cni-bin-dir",
        ),
        (
            "init socket differs",
            |m| {
                init_mut(m)
                    .command
                    .as_mut()
                    .unwrap()
                    .extend(["--socket".into(), "/run/x.sock".into()])
            },
            "--socket",
        ),
        (
            "init image differs",
            |m| init_mut(m).image = Some("enim:old".into()),
            "image",
        ),
        (
            "init not install-cni",
            |m| init_mut(m).command.as_mut().unwrap()[1] = "run".into(),
            "install-cni",
        ),
        (
            "readiness on the wrong port",
            |m| {
                let get = agent_mut(m)
                    .readiness_probe
                    .as_mut()
                    .unwrap()
                    .http_get
                    .as_mut()
                    .unwrap();
                get.port = IntOrString::Int(8080);
            },
            "readinessProbe port",
        ),
        (
            "liveness on the wrong path",
            |m| {
                let get = agent_mut(m)
                    .liveness_probe
                    .as_mut()
                    .unwrap()
                    .http_get
                    .as_mut()
                    .unwrap();
                get.path = Some("/readyz".into());
            },
            "livenessProbe path",
        ),
        (
            "probe on the pod IP",
            |m| {
                let get = agent_mut(m)
                    .readiness_probe
                    .as_mut()
                    .unwrap()
                    .http_get
                    .as_mut()
                    .unwrap();
                get.host = None;
            },
            "readinessProbe host",
        ),
        (
            "named port renumbered",
            |m| agent_mut(m).ports.as_mut().unwrap()[0].container_port = 9000,
            "readinessProbe port",
        ),
        (
            "token mounted",
            |m| spec_mut(m).automount_service_account_token = None,
            "token",
        ),
        (
            "image fetches at build time",
            |m| m.containerfile.push_str("RUN apt-get update\n"),
            "prebuilt",
        ),
        (
            "plugin not next to enimd",
            |m| {
                m.containerfile = m.containerfile.replace(
                    "COPY enimd enim enimctl /usr/local/bin/",
                    "COPY enimd enimctl /usr/local/bin/\nCOPY enim /opt/",
                )
            },
            "puts enim",
        ),
    ];
    assert!(check(&good).is_empty(), "the unbroken manifests must pass");
    for (name, break_it, needle) in cases {
        let mut m = good.clone();
        break_it(&mut m);
        expect_problem(name, &m, needle);
    }
}

#[test]
fn unknown_fields_and_kinds_are_refused() {
    let text = std::fs::read_to_string(deploy_dir().join("30-daemonset.yaml")).unwrap();
    let typo = text.replace("mountPropagation:", "mountPropogation:");
    assert_ne!(typo, text);
    let err = parse_into(&mut Manifests::default(), &typo).unwrap_err();
    assert!(err.contains("mountPropogation"), "{err}");

    let role =
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: x\n";
    let err = parse_into(&mut Manifests::default(), role).unwrap_err();
    assert!(err.contains("ClusterRole"), "{err}");
}

#[test]
fn a_broken_install_cni_command_fails_when_run() {
    let mut m = load();
    let c = init_mut(&mut m).command.as_mut().unwrap();
    let i = c.iter().position(|a| a == "--net-d-dir").unwrap();
    c[i] = "--netd-dir".into();
    let problems = run_install_cni(&m);
    assert!(
        problems.iter().any(|p| p.contains("failed")),
        "{problems:?}"
    );
}
