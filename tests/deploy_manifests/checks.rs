//! The checks of the manifests against what enimd does.

use super::*;

/// The flags `enimd install-cni` takes.
const INSTALL_CNI_FLAGS: &[&str] = &[
    "--cni-bin-dir",
    "--net-d-dir",
    "--config",
    "--socket",
    "--plugin",
    "--conflist-name",
    "--network-name",
    // Not in enimd.toml: the manifest may pass never or always.
    "--portmap",
];

/// Everything but running install-cni.
pub(crate) fn check(m: &Manifests) -> Vec<String> {
    let mut p = Problems(check_agent(m));
    objects_in_place(m, &mut p);
    rbac::check(m, &mut p);
    operator::check(m, &mut p);
    p.0
}

/// Namespaced objects in enim's namespace, cluster-scoped ones in none,
/// and Pod Security that lets the agent run.
fn objects_in_place(m: &Manifests, p: &mut Problems) {
    let ns = one(&m.namespaces, "Namespace", p).and_then(|n| n.metadata.name.clone());
    let namespaced = m
        .service_accounts
        .iter()
        .map(|o| ("ServiceAccount", &o.metadata))
        .chain(m.config_maps.iter().map(|o| ("ConfigMap", &o.metadata)))
        .chain(m.daemon_sets.iter().map(|o| ("DaemonSet", &o.metadata)))
        .chain(m.deployments.iter().map(|o| ("Deployment", &o.metadata)))
        .chain(m.roles.iter().map(|o| ("Role", &o.metadata)))
        .chain(m.role_bindings.iter().map(|o| ("RoleBinding", &o.metadata)));
    for (kind, meta) in namespaced {
        p.check(meta.namespace == ns, || {
            format!(
                "{kind} {:?} is in namespace {:?}, not {ns:?}",
                meta.name, meta.namespace
            )
        });
    }
    let cluster_scoped = m
        .cluster_roles
        .iter()
        .map(|o| ("ClusterRole", &o.metadata))
        .chain(
            m.cluster_role_bindings
                .iter()
                .map(|o| ("ClusterRoleBinding", &o.metadata)),
        )
        .chain(
            m.policies
                .iter()
                .map(|o| ("ValidatingAdmissionPolicy", &o.metadata)),
        )
        .chain(
            m.policy_bindings
                .iter()
                .map(|o| ("ValidatingAdmissionPolicyBinding", &o.metadata)),
        )
        .chain(
            m.crds
                .iter()
                .chain(&m.policy_crds)
                .map(|o| ("CustomResourceDefinition", &o.metadata)),
        )
        .chain(
            m.device_classes
                .iter()
                .map(|o| ("DeviceClass", &o.metadata)),
        );
    for (kind, meta) in cluster_scoped {
        p.check(meta.namespace.is_none(), || {
            format!(
                "{kind} {:?} is cluster-scoped but names namespace {:?}",
                meta.name, meta.namespace
            )
        });
    }
    // EniPolicy: cluster-wide (it selects namespaces), with a status the
    // operator writes.
    if let Some(crd) = one(&m.policy_crds, "EniPolicy CustomResourceDefinition", p) {
        p.check(crd.spec.scope == "Cluster", || {
            format!("{POLICY_CRD} is {}-scoped, not Cluster", crd.spec.scope)
        });
        let status = crd
            .spec
            .versions
            .iter()
            .all(|v| v.subresources.as_ref().is_some_and(|s| s.status.is_some()));
        p.check(status, || format!("{POLICY_CRD} has no status subresource"));
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
}

/// The agent's DaemonSet and its ConfigMap.
fn check_agent(m: &Manifests) -> Vec<String> {
    let mut p = Problems::default();
    let names: BTreeSet<&str> = m
        .daemon_sets
        .iter()
        .filter_map(|d| d.metadata.name.as_deref())
        .collect();
    p.check(
        m.daemon_sets.len() == 2 && names == BTreeSet::from([AGENT_DS, PLUGIN_DS]),
        || format!("expected the DaemonSets {AGENT_DS} and {PLUGIN_DS}, found {names:?}"),
    );
    let Some(ds) = daemon_set(m, AGENT_DS) else {
        return p.0;
    };
    let Some(spec) = pod_spec(ds) else {
        p.0.push("DaemonSet has no pod spec".into());
        return p.0;
    };
    // Identity: the ServiceAccount the agent's RBAC is bound to, with its
    // token mounted: the `cluster` provider reads the node's NetResourceSet
    // and writes its status with it (rbac.rs checks what it may do).
    p.check(
        spec.service_account_name.as_deref() == Some(AGENT_SA),
        || {
            format!(
                "pod runs as {:?}, not ServiceAccount {AGENT_SA}",
                spec.service_account_name
            )
        },
    );
    match by_name(&m.service_accounts, AGENT_SA) {
        None => p.0.push(format!("no ServiceAccount {AGENT_SA}")),
        Some(sa) => p.check(sa.automount_service_account_token != Some(false), || {
            format!(
                "ServiceAccount {AGENT_SA} does not mount its token: \
                 the cluster provider needs the Kubernetes API"
            )
        }),
    }
    p.check(mounts_token(m, spec), || {
        "the agent's pod mounts no service account token: \
         the cluster provider needs the Kubernetes API"
            .into()
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
    // The cluster provider's node: the name of its NetResourceSet, and the
    // node the admission policy lets it write.
    let node = env_field(agent, "NODE_NAME");
    p.check(node == Some("spec.nodeName"), || {
        format!("{AGENT} env NODE_NAME comes from {node:?}, not the downward API's spec.nodeName")
    });
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
    // The kubelet finds the plugin's socket, and the plugin the kubelet's,
    // only in the node's own device plugin dir.
    if config.device_plugin.enabled {
        let dir = &config.device_plugin.dir;
        same_on_host(spec, agent, dir, "device_plugin.dir", true, &mut p);
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

    // The node's /proc/sys/net, for the IPv6 sysctls that have no netlink
    // form (secondary mode with IPv6): writable where the config says, for
    // the agent only. The pod's own /proc/sys is read-only, and secondary
    // mode with IPv6 writes proxy_ndp, accept_dad and forwarding there.
    on_node_at(
        spec,
        agent,
        &config.secondary.proc_sys_net,
        Path::new(PROC_SYS_NET),
        "[secondary] proc_sys_net",
        true,
        &mut p,
    );

    // Nothing of the node beyond what enimd uses: each hostPath is one of
    // these exact dirs (a parent such as /run or /proc would grant more).
    let parent = |path: &Path| path.parent().unwrap_or(Path::new("/")).to_path_buf();
    let mut needed: BTreeMap<PathBuf, &str> = BTreeMap::from([
        (parent(&config.socket), "the API socket"),
        (parent(&config.checkpoint), "the checkpoint"),
        (parent(Path::new(SAMPLE_NETNS)), "pods' network namespaces"),
        (PathBuf::from(PROC_SYS_NET), "IPv6 sysctls"),
        (PathBuf::from(HOST_CNI_BIN_DIR), "install-cni"),
        (PathBuf::from(HOST_NET_D_DIR), "install-cni"),
    ]);
    if config.device_plugin.enabled {
        needed.insert(config.device_plugin.dir.clone(), "the device plugin");
    }
    let dra = super::dra::settings(&config);
    needed.extend(super::dra::check_mounts(spec, agent, &dra, &mut p));
    super::dra::check_class(m, &dra, &mut p);
    for v in spec.volumes.iter().flatten() {
        if let Some(hp) = &v.host_path {
            p.check(needed.contains_key(Path::new(&hp.path)), || {
                format!(
                    "hostPath {} (volume {}) is not one enimd needs; it uses only {:?}",
                    hp.path,
                    v.name,
                    needed.keys().collect::<Vec<_>>()
                )
            });
        }
    }
    // install-cni, which has no capabilities, gets only the CNI dirs.
    for mnt in mounts(init) {
        let hp = volume(spec, &mnt.name).and_then(|v| v.host_path.as_ref());
        if let Some(hp) = hp {
            p.check(
                hp.path == HOST_CNI_BIN_DIR || hp.path == HOST_NET_D_DIR,
                || {
                    format!(
                        "install-cni mounts hostPath {}: it needs only the CNI dirs",
                        hp.path
                    )
                },
            );
        }
    }

    // install-cni: same image, same binary, host CNI dirs, same socket.
    p.check(init.image.is_some() && init.image == agent.image, || {
        format!(
            "install-cni image {:?} differs from the agent's {:?}: plugin and agent must match",
            init.image, agent.image
        )
    });
    let agent_line = command_line(agent);
    let flags = enimd_flags(
        INSTALLER,
        init,
        agent,
        "install-cni",
        INSTALL_CNI_FLAGS,
        &mut p,
    );
    if let Some(f) = flags {
        for (flag, default, host) in [
            (
                "--cni-bin-dir",
                install::DEFAULT_CNI_BIN_DIR,
                HOST_CNI_BIN_DIR,
            ),
            ("--net-d-dir", install::DEFAULT_NET_D_DIR, HOST_NET_D_DIR),
        ] {
            let path = flag_path(&f, flag, default);
            let what = format!("install-cni {flag}");
            on_node_at(spec, init, &path, Path::new(host), &what, true, &mut p);
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
            (None, None) => p.check(config.socket == Path::new(enim_api::DEFAULT_SOCKET), || {
                "install-cni writes the default socket, but the agent's is not".into()
            }),
        }
        p.check(!f.contains_key("--plugin"), || {
            "install-cni --plugin: the image keeps enim next to enimd, the default".into()
        });
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

    // The kubelet's device plugin, beside the agent.
    super::plugin::check(m, spec, agent, &config, &mut p);

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
pub(crate) fn run_install_cni(m: &Manifests) -> Vec<String> {
    let mut p = Problems::default();
    let ds = daemon_set(m, AGENT_DS).unwrap();
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
    let f = flags(&line[2..], INSTALL_CNI_FLAGS).unwrap();
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
