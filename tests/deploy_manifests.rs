//! deploy/ as Kubernetes would read it: every manifest parsed into typed
//! objects, then checked against what enimd really does (its config, its
//! paths, its privileges, its probes, its install-cni command line), what
//! the agent and the operator may do in the API, and how the operator runs.
//! That includes the DRA kubelet plugin's side: its DeviceClass, the
//! kubelet dirs it needs and what it may write in the API.
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
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Probe, ServiceAccount, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde_json::Value;

/// The checks on manifests broken on purpose.
#[path = "deploy_manifests/broken.rs"]
mod broken;
/// The same for the control plane's objects.
#[path = "deploy_manifests/broken_api.rs"]
mod broken_api;
/// What the manifests must agree with: the checks, and install-cni run.
#[path = "deploy_manifests/checks.rs"]
mod checks;
/// The DRA kubelet plugin: its DeviceClass and the kubelet dirs enimd mounts.
#[path = "deploy_manifests/dra.rs"]
mod dra;
/// enim-operator's Deployment.
#[path = "deploy_manifests/operator.rs"]
mod operator;
/// The device plugin's DaemonSet, checked against enimd's.
#[path = "deploy_manifests/plugin.rs"]
mod plugin;
/// What each ServiceAccount may do in the API, and the admission policy
/// that keeps each agent to its own node's NetResourceSet.
#[path = "deploy_manifests/rbac.rs"]
mod rbac;

use checks::{check, run_install_cni};

/// Until enimd's config has `metrics_address`, the address the probes are
/// written for (docs/deploy.md, "Kubernetes: deploy/").
const ASSUMED_METRICS_ADDRESS: &str = "127.0.0.1:9464";
/// Where the runtime on the node looks for plugins and network configs.
const HOST_CNI_BIN_DIR: &str = install::DEFAULT_CNI_BIN_DIR;
const HOST_NET_D_DIR: &str = install::DEFAULT_NET_D_DIR;
/// A CNI_NETNS as containerd and CRI-O pass it.
const SAMPLE_NETNS: &str = "/var/run/netns/cni-0b9a3f2e-1c7d-4e55-a1f0-2d6c9b8e7a10";
/// Where the node's net sysctls are.
const PROC_SYS_NET: &str = enim::netlink::sysctl::PROC_SYS_NET;
const AGENT: &str = "enimd";
const INSTALLER: &str = "install-cni";
/// The DaemonSets: enimd's, and the kubelet's device plugin's.
const AGENT_DS: &str = "enimd";
const PLUGIN_DS: &str = "enim-device-plugin";
/// The device plugin's container.
const PLUGIN: &str = "device-plugin";
/// The agent's ServiceAccount (the `cluster` provider's identity).
const AGENT_SA: &str = "enimd";
/// enim-operator's ServiceAccount, Deployment, container and ConfigMap.
const OPERATOR: &str = "enim-operator";
/// The NetResourceSet CRD: one object per node, named after it.
const CRD_GROUP: &str = "enim.io";
const CRD_PLURAL: &str = "netresourcesets";
/// DRA: the driver enimd publishes its ENIs as, the DeviceClass that
/// selects them, and the API group of slices and claims.
const DRA_DRIVER: &str = "enim.io";
const DEVICE_CLASS: &str = "eni.enim.io";
const DRA_GROUP: &str = "resource.k8s.io";
/// The extra the API server puts in a token bound to a pod on a node.
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

#[derive(Debug, Clone, Default)]
struct Manifests {
    namespaces: Vec<Namespace>,
    service_accounts: Vec<ServiceAccount>,
    config_maps: Vec<ConfigMap>,
    daemon_sets: Vec<DaemonSet>,
    deployments: Vec<Deployment>,
    cluster_roles: Vec<ClusterRole>,
    cluster_role_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    policies: Vec<ValidatingAdmissionPolicy>,
    policy_bindings: Vec<ValidatingAdmissionPolicyBinding>,
    crds: Vec<CustomResourceDefinition>,
    /// The EniPolicy CRD (docs/policy.md), apart from NetResourceSet's,
    /// which the RBAC and admission checks are about.
    policy_crds: Vec<CustomResourceDefinition>,
    device_classes: Vec<DeviceClass>,
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
/// know is an error (a Secret, a Service or a webhook would need a reason
/// and checks of its own), and so is any field the typed object does not
/// have: a typo like `mountPropogation` would otherwise vanish silently,
/// here and in the API server's lenient decoding.
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
            ("apps/v1", "Deployment") => typed(&raw, &mut m.deployments)?,
            (RBAC, "ClusterRole") => typed(&raw, &mut m.cluster_roles)?,
            (RBAC, "ClusterRoleBinding") => typed(&raw, &mut m.cluster_role_bindings)?,
            (RBAC, "Role") => typed(&raw, &mut m.roles)?,
            (RBAC, "RoleBinding") => typed(&raw, &mut m.role_bindings)?,
            (ADMISSION, "ValidatingAdmissionPolicy") => typed(&raw, &mut m.policies)?,
            (ADMISSION, "ValidatingAdmissionPolicyBinding") => typed(&raw, &mut m.policy_bindings)?,
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
                if raw["metadata"]["name"] == POLICY_CRD =>
            {
                typed(&raw, &mut m.policy_crds)?
            }
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => typed(&raw, &mut m.crds)?,
            ("resource.k8s.io/v1", "DeviceClass") => typed(&raw, &mut m.device_classes)?,
            _ => {
                return Err(format!(
                    "unexpected object {api}/{kind}: deploy/ holds the agent, its device \
                     plugin, the operator, their RBAC and admission policies, the CRD and \
                     the DRA DeviceClass; extend this test with what this object is for, \
                     and check it"
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

const RBAC: &str = "rbac.authorization.k8s.io/v1";
/// The EniPolicy CRD's name.
const POLICY_CRD: &str = "enipolicies.enim.io";
const ADMISSION: &str = "admissionregistration.k8s.io/v1";

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

/// The DaemonSet called `name`.
fn daemon_set<'a>(m: &'a Manifests, name: &str) -> Option<&'a DaemonSet> {
    m.daemon_sets
        .iter()
        .find(|d| d.metadata.name.as_deref() == Some(name))
}

/// The object of kind `T` called `name`.
fn by_name<'a, T>(items: &'a [T], name: &str) -> Option<&'a T>
where
    T: k8s_openapi::Metadata<Ty = ObjectMeta>,
{
    items
        .iter()
        .find(|o| o.metadata().name.as_deref() == Some(name))
}

/// Whether a selector's `matchLabels` pick pods labelled `labels` (an empty
/// selector counts as none: every selector here names its labels).
fn selects(selector: Option<&BTreeMap<String, String>>, labels: &BTreeMap<String, String>) -> bool {
    selector.is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// Whether a pod with `spec` gets its service account's token: its own
/// setting, else its ServiceAccount's (when deploy/ has it), else yes.
fn mounts_token(m: &Manifests, spec: &PodSpec) -> bool {
    let sa_name = spec.service_account_name.as_deref().unwrap_or("default");
    let sa = by_name(&m.service_accounts, sa_name);
    spec.automount_service_account_token
        .or_else(|| sa?.automount_service_account_token)
        .unwrap_or(true)
}

/// The downward-API field env var `name` of `c` comes from.
fn env_field<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    let var = c.env.iter().flatten().find(|e| e.name == name)?;
    let field = var.value_from.as_ref()?.field_ref.as_ref()?;
    Some(&field.field_path)
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

/// The flags of `c`'s command line (`who` in problems), which must be
/// `enimd <sub>` on the agent's own binary with only `known` flags; None,
/// the problem noted, when they do not parse.
fn enimd_flags(
    who: &str,
    c: &Container,
    agent: &Container,
    sub: &str,
    known: &[&str],
    p: &mut Problems,
) -> Option<BTreeMap<String, String>> {
    let line = command_line(c);
    let agent_line = command_line(agent);
    p.check(line.first() == agent_line.first(), || {
        format!(
            "{who} runs {:?}, the agent {:?}",
            line.first(),
            agent_line.first()
        )
    });
    p.check(line.get(1).map(String::as_str) == Some(sub), || {
        format!("{who} command {line:?} is not `enimd {sub}`")
    });
    flags(line.get(2..).unwrap_or_default(), known)
        .map_err(|e| p.0.push(format!("{who}: {e}")))
        .ok()
}

/// The path `flag` has among `flags`, or `default`.
fn flag_path(flags: &BTreeMap<String, String>, flag: &str, default: &str) -> PathBuf {
    PathBuf::from(flags.get(flag).map(String::as_str).unwrap_or(default))
}

/// The config the agent will run with, from the ConfigMap its `--config`
/// points at.
fn agent_config(m: &Manifests, p: &mut Problems) -> Option<(Config, String)> {
    let ds = daemon_set(m, AGENT_DS)?;
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
    on_node_at(spec, c, path, path, what, rw, p)
}

/// Checks that `path` in `c` is `on_node` on the node (a hostPath mount),
/// writable if `rw`; returns its mount.
fn on_node_at<'a>(
    spec: &PodSpec,
    c: &'a Container,
    path: &Path,
    on_node: &Path,
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
    p.check(host == on_node, || {
        format!(
            "{what} {} is {} on the node, not {}",
            path.display(),
            host.display(),
            on_node.display()
        )
    });
    p.check(!rw || writable(mount), || {
        format!("{what} {} is mounted read-only", path.display())
    });
    Some(mount)
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
