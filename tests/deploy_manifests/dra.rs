//! The DRA kubelet plugin's side of deploy/: the DeviceClass that claims
//! name, and the kubelet dirs enimd's DaemonSet mounts for the plugin
//! (rbac.rs checks what it may write in the API).

use super::*;

/// Where the kubelet looks for plugins' registration sockets, and under
/// which dir each DRA driver keeps its own socket: the kubelet's defaults.
const REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
const PLUGIN_DIR: &str = "/var/lib/kubelet/plugins";

/// `[dra]` as enimd reads it.
pub(crate) struct Dra {
    driver: String,
    registry_dir: PathBuf,
    plugin_dir: PathBuf,
}

impl Dra {
    /// The socket the kubelet finds the plugin by (the name is the
    /// plugin's choice; this one is the kubelet plugin library's).
    fn registration(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver))
    }

    /// The socket the kubelet calls NodePrepareResources on.
    fn socket(&self) -> PathBuf {
        self.plugin_dir.join(&self.driver).join("dra.sock")
    }
}

/// enimd's own `[dra]` settings once its config has the table, else the
/// defaults the manifests are written for (docs/dra.md).
pub(crate) fn settings(config: &Config) -> Dra {
    let v = serde_json::to_value(config).unwrap();
    let dra = v.get("dra");
    if dra.is_none() {
        eprintln!(
            "note: enimd's config has no [dra] yet; the DRA mounts and the DeviceClass are \
             checked against driver {DRA_DRIVER}, {REGISTRY_DIR} and {PLUGIN_DIR}"
        );
    }
    let key = |k: &str, default: &str| {
        dra.and_then(|d| d.get(k))
            .and_then(Value::as_str)
            .unwrap_or(default)
            .to_owned()
    };
    Dra {
        driver: key("driver", DRA_DRIVER),
        registry_dir: key("registry_dir", REGISTRY_DIR).into(),
        plugin_dir: key("plugin_dir", PLUGIN_DIR).into(),
    }
}

/// The kubelet dirs in enimd's pod, whatever the ConfigMap says: turning
/// DRA on must be a ConfigMap change. Returns the hostPaths they need.
pub(crate) fn check_mounts(
    spec: &PodSpec,
    agent: &Container,
    dra: &Dra,
    p: &mut Problems,
) -> Vec<(PathBuf, &'static str)> {
    // The kubelet finds the plugin by the registration socket it makes in
    // the node's registry dir, and calls it on its socket at the path that
    // registration names: both the node's own paths, writable.
    let registration = dra.registration();
    same_on_host(
        spec,
        agent,
        &registration,
        "the DRA registration socket",
        true,
        p,
    );
    let socket = dra.socket();
    same_on_host(spec, agent, &socket, "the DRA socket", true, p);
    let own = socket.parent().unwrap().to_path_buf();
    vec![
        (dra.registry_dir.clone(), "the DRA plugin's registration"),
        // Its own dir, not the plugin dir: that holds every other CSI and
        // DRA driver's socket.
        (own, "the DRA plugin's socket"),
    ]
}

/// The DeviceClass claims name: enim's devices, all of them, and nothing
/// else about them (conditions are the claims').
pub(crate) fn check_class(m: &Manifests, dra: &Dra, p: &mut Problems) {
    let Some(class) = one(&m.device_classes, "DeviceClass", p) else {
        return;
    };
    let name = class.metadata.name.as_deref().unwrap_or_default();
    p.check(name == DEVICE_CLASS, || {
        format!("DeviceClass {name:?} is not {DEVICE_CLASS}, the class docs/dra.md's claims name")
    });
    let what = format!("DeviceClass {name}");
    let selectors = class.spec.selectors.as_deref().unwrap_or_default();
    let want = format!("device.driver==\"{}\"", dra.driver);
    let by_driver = selectors
        .iter()
        .filter_map(|s| s.cel.as_ref())
        .any(|c| rbac::squeeze(&c.expression) == want);
    // With no selector a class matches every driver's devices (a GPU's).
    p.check(by_driver, || {
        format!(
            "{what} has no selector `device.driver == \"{}\"`: it would offer other drivers' \
             devices, or none of enimd's",
            dra.driver
        )
    });
    p.check(selectors.len() == 1, || {
        format!(
            "{what} has {} selectors: it selects by driver alone, every further condition is \
             a claim's",
            selectors.len()
        )
    });
    let config = class.spec.config.as_deref().unwrap_or_default();
    p.check(config.is_empty(), || {
        format!("{what} passes opaque config, which enimd does not read")
    });
    // Alpha in 1.34 (DRAExtendedResource), off by default: the API server
    // drops the field, and enim.io/eni is the device plugin's resource.
    p.check(class.spec.extended_resource_name.is_none(), || {
        format!(
            "{what} sets extendedResourceName {:?}: pods ask for enim.io/eni from the device \
             plugin, or claim from this class, not both",
            class.spec.extended_resource_name
        )
    });
}
