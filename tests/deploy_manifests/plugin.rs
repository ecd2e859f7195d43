//! The device plugin's DaemonSet (`enimd device-plugin`): on every node
//! enimd is on, talking to enimd's socket, serving in the kubelet's dir, and
//! with no privilege beyond that.

use super::*;

/// The flags `enimd device-plugin` takes.
const DEVICE_PLUGIN_FLAGS: &[&str] = &[
    "--socket",
    "--dir",
    "--endpoint",
    "--kubelet-socket",
    "--poll",
    "--log-format",
];

/// Whether the DaemonSet's selector picks pods labelled `labels`.
fn ds_selects(ds: &DaemonSet, labels: &BTreeMap<String, String>) -> bool {
    let selector = ds
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.as_ref());
    selects(selector, labels)
}

pub(crate) fn template_labels(ds: &DaemonSet) -> BTreeMap<String, String> {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

/// Checks the device plugin's DaemonSet against the agent's pod `agent_spec`,
/// its container `agent` and its `config`.
pub(crate) fn check(
    m: &Manifests,
    agent_spec: &PodSpec,
    agent: &Container,
    config: &Config,
    p: &mut Problems,
) {
    let (Some(ds), Some(agent_ds)) = (daemon_set(m, PLUGIN_DS), daemon_set(m, AGENT_DS)) else {
        p.0.push(format!("no DaemonSet {PLUGIN_DS}"));
        return;
    };
    let Some(spec) = pod_spec(ds) else {
        p.0.push(format!("{PLUGIN_DS} has no pod spec"));
        return;
    };
    // The refusal rule: beside enimd's own plugin it would exit at once.
    p.check(!config.device_plugin.enabled, || {
        format!(
            "the ConfigMap turns enimd's own device plugin on ([device_plugin] enabled), \
             and {PLUGIN_DS} refuses to run beside it"
        )
    });

    // Its own pods only, and not enimd's (each would count the other's).
    let labels = template_labels(ds);
    p.check(ds_selects(ds, &labels), || {
        format!("{PLUGIN_DS}: selector does not match its pod template's labels")
    });
    p.check(
        !ds_selects(ds, &template_labels(agent_ds)) && !ds_selects(agent_ds, &labels),
        || format!("{PLUGIN_DS} and {AGENT_DS} each selects the other's pods"),
    );

    // Wherever enimd runs, as critical as enimd.
    p.check(spec.node_selector == agent_spec.node_selector, || {
        format!(
            "{PLUGIN_DS} nodeSelector {:?} is not enimd's {:?}",
            spec.node_selector, agent_spec.node_selector
        )
    });
    let tolerates_all =
        spec.tolerations.iter().flatten().any(|t| {
            t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()
        });
    p.check(tolerates_all, || {
        format!("{PLUGIN_DS}: no catch-all toleration, so not on every node enimd is on")
    });
    p.check(
        spec.priority_class_name.as_deref() == Some("system-node-critical"),
        || {
            format!(
                "{PLUGIN_DS}: priorityClassName {:?}, not system-node-critical",
                spec.priority_class_name
            )
        },
    );

    // Identity: enimd's ServiceAccount, but no token: the plugin uses no
    // Kubernetes API, so it must not carry the agent's grants. It says so
    // itself, as the ServiceAccount mounts the token for the agent.
    p.check(
        spec.service_account_name.is_some()
            && spec.service_account_name == agent_spec.service_account_name,
        || {
            format!(
                "{PLUGIN_DS} runs as {:?}, not enimd's ServiceAccount {:?}",
                spec.service_account_name, agent_spec.service_account_name
            )
        },
    );
    p.check(spec.automount_service_account_token == Some(false), || {
        format!("{PLUGIN_DS} mounts a service account token: it uses no Kubernetes API")
    });

    // The host's network only so that its pod needs no CNI: enim's ADD
    // would otherwise wait for enimd and give the pod an ENI of its own.
    p.check(spec.host_network == Some(true), || {
        format!("{PLUGIN_DS}: hostNetwork is not true, so its pod would need enim (and an ENI)")
    });
    p.check(
        spec.host_pid != Some(true) && spec.host_ipc != Some(true),
        || format!("{PLUGIN_DS}: hostPID or hostIPC is not needed"),
    );

    // One container, `enimd device-plugin` from enimd's image.
    p.check(
        spec.containers.len() == 1 && spec.init_containers.as_ref().is_none_or(Vec::is_empty),
        || format!("{PLUGIN_DS}: expected the one container {PLUGIN}"),
    );
    let Some(c) = container(Some(&spec.containers), PLUGIN) else {
        p.0.push(format!("{PLUGIN_DS}: no container {PLUGIN}"));
        return;
    };
    p.check(c.image.is_some() && c.image == agent.image, || {
        format!(
            "{PLUGIN_DS} image {:?} differs from enimd's {:?}: the API they speak must match",
            c.image, agent.image
        )
    });
    p.check(c.image_pull_policy == agent.image_pull_policy, || {
        format!(
            "{PLUGIN_DS} imagePullPolicy {:?} is not enimd's {:?}",
            c.image_pull_policy, agent.image_pull_policy
        )
    });
    let flags = enimd_flags(PLUGIN_DS, c, agent, "device-plugin", DEVICE_PLUGIN_FLAGS, p);
    if let Some(f) = flags {
        // enimd's socket, reached through the node.
        let socket = flag_path(&f, "--socket", enim_api::DEFAULT_SOCKET);
        p.check(socket == config.socket, || {
            format!(
                "{PLUGIN_DS} asks the socket {}, enimd serves {}",
                socket.display(),
                config.socket.display()
            )
        });
        let what = format!("{PLUGIN_DS} --socket");
        same_on_host(spec, c, &socket, &what, false, p);
        // The kubelet looks for plugins only in its own dir.
        let dir = flag_path(&f, "--dir", enim::deviceplugin::DEFAULT_DIR);
        let kubelet = Path::new(enim::deviceplugin::DEFAULT_DIR);
        let what = format!("{PLUGIN_DS} --dir");
        on_node_at(spec, c, &dir, kubelet, &what, true, p);
        if let Some(poll) = f.get("--poll") {
            let ok = humantime::parse_duration(poll).is_ok_and(|d| !d.is_zero());
            p.check(ok, || {
                format!("{PLUGIN_DS} --poll {poll:?} is not a duration above 0")
            });
        }
        // Nothing of the node but those two dirs.
        let needed = [config.socket.parent().unwrap_or(Path::new("/")), kubelet];
        for v in spec.volumes.iter().flatten() {
            let used = mounts(c).iter().any(|mnt| mnt.name == v.name);
            p.check(used, || {
                format!("{PLUGIN_DS}: volume {} is mounted nowhere", v.name)
            });
            if let Some(hp) = &v.host_path {
                p.check(needed.contains(&Path::new(&hp.path)), || {
                    format!(
                        "{PLUGIN_DS}: hostPath {} (volume {}) is not one it needs; \
                             it uses only {needed:?}",
                        hp.path, v.name
                    )
                });
            }
        }
        for mnt in mounts(c) {
            p.check(volume(spec, &mnt.name).is_some(), || {
                format!("{PLUGIN_DS}: mount {} has no volume", mnt.name)
            });
        }
    }

    // No privilege at all: root (the owner of both sockets' dirs), nothing
    // else.
    let sc = c.security_context.clone().unwrap_or_default();
    p.check(sc.privileged != Some(true), || {
        format!("{PLUGIN_DS} is privileged")
    });
    p.check(caps(c, |c| c.drop.as_ref()).contains("ALL"), || {
        format!("{PLUGIN_DS} does not drop ALL capabilities")
    });
    let added = caps(c, |c| c.add.as_ref());
    p.check(added.is_empty(), || {
        format!("{PLUGIN_DS} adds capabilities {added:?}: connecting to a socket needs none")
    });
    p.check(sc.allow_privilege_escalation == Some(false), || {
        format!("{PLUGIN_DS} allows privilege escalation")
    });
    p.check(sc.read_only_root_filesystem == Some(true), || {
        format!("{PLUGIN_DS} has a writable root filesystem")
    });
    // enimd's socket is 0600 root's; the kubelet's dir is root's.
    p.check(sc.run_as_user == Some(0), || {
        format!(
            "{PLUGIN_DS} runs as {:?}: enimd's socket and the kubelet's dir are root's",
            sc.run_as_user
        )
    });
    let seccomp = sc
        .seccomp_profile
        .or_else(|| spec.security_context.as_ref()?.seccomp_profile.clone())
        .map(|s| s.type_);
    p.check(seccomp.as_deref() == Some("RuntimeDefault"), || {
        format!("{PLUGIN_DS} runs with seccomp {seccomp:?}, not RuntimeDefault")
    });
}
