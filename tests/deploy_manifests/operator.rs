//! enim-operator's Deployment: two replicas on different nodes, on the
//! host network with no privilege, with the token it watches and writes
//! with, its config from its ConfigMap, and the agent's image.

use super::*;

/// The flags the operator's command line may carry: its settings live in
/// operator.toml, where this test finds them.
const OPERATOR_FLAGS: &[&str] = &["--config", "--log-format"];
/// Where its config is mounted, and the file (the ConfigMap's key).
const OPERATOR_CONFIG_DIR: &str = "/etc/enim";
const OPERATOR_CONFIG_KEY: &str = "operator.toml";
/// The container port of its /healthz and /readyz.
const HEALTH_PORT: &str = "health";
const HOSTNAME: &str = "kubernetes.io/hostname";

pub(crate) fn check(m: &Manifests, p: &mut Problems) {
    p.check(by_name(&m.service_accounts, OPERATOR).is_some(), || {
        format!("no ServiceAccount {OPERATOR}")
    });
    let names: Vec<_> = m
        .deployments
        .iter()
        .map(|d| d.metadata.name.as_deref().unwrap_or_default())
        .collect();
    p.check(names == [OPERATOR], || {
        format!("expected the one Deployment {OPERATOR}, found {names:?}")
    });
    let Some(d) = by_name(&m.deployments, OPERATOR) else {
        return;
    };
    let (Some(ds), Some(spec)) = (
        d.spec.as_ref(),
        d.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
    ) else {
        p.0.push(format!("Deployment {OPERATOR} has no pod spec"));
        return;
    };
    let what = format!("Deployment {OPERATOR}");
    let labels = ds
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();

    // Two replicas, one leading and one warm, never on the same node:
    // their health port is a host port, and one node's loss must not take
    // both.
    p.check(ds.replicas == Some(2), || {
        format!(
            "{what}: replicas {:?}, not 2 (a leader and a warm follower)",
            ds.replicas
        )
    });
    let selector = ds.selector.match_labels.as_ref();
    p.check(selects(selector, &labels), || {
        format!("{what}: selector does not match its pod template's labels")
    });
    for other in &m.daemon_sets {
        let theirs = other
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.as_ref());
        p.check(
            !selects(selector, &plugin::template_labels(other)) && !selects(theirs, &labels),
            || {
                format!(
                    "{what} and DaemonSet {:?} select each other's pods",
                    other.metadata.name
                )
            },
        );
    }
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let apart = terms.into_iter().flatten().any(|t| {
        t.topology_key == HOSTNAME
            && t.namespaces.is_none()
            && t.namespace_selector.is_none()
            && selects(
                t.label_selector
                    .as_ref()
                    .and_then(|s| s.match_labels.as_ref()),
                &labels,
            )
    });
    p.check(apart, || {
        format!(
            "{what}: no required pod anti-affinity on {HOSTNAME} against its own pods, \
             so both replicas may land on one node"
        )
    });

    // Identity: its own ServiceAccount, whose token it watches Nodes and
    // writes NetResourceSets and its Lease with (rbac.rs: what it may do).
    p.check(
        spec.service_account_name.as_deref() == Some(OPERATOR),
        || {
            format!(
                "{what}: serviceAccountName {:?}, not {OPERATOR}",
                spec.service_account_name
            )
        },
    );
    p.check(mounts_token(m, spec), || {
        format!("{what} mounts no service account token: it lives on the Kubernetes API")
    });

    // The host's network: the pod network it would otherwise need is the
    // one it provides. Nothing else of the node.
    p.check(spec.host_network == Some(true), || {
        format!("{what}: hostNetwork is not true, so it would wait for the pod network it provides")
    });
    p.check(
        spec.host_pid != Some(true) && spec.host_ipc != Some(true),
        || format!("{what}: hostPID or hostIPC is not needed"),
    );
    p.check(
        spec.containers.len() == 1 && spec.init_containers.as_ref().is_none_or(Vec::is_empty),
        || format!("{what}: expected the one container {OPERATOR}"),
    );
    let Some(c) = container(Some(&spec.containers), OPERATOR) else {
        p.0.push(format!("{what}: no container {OPERATOR}"));
        return;
    };
    for v in spec.volumes.iter().flatten() {
        p.check(v.host_path.is_none(), || {
            format!(
                "{what}: hostPath volume {}: it needs nothing of the node",
                v.name
            )
        });
        let used = mounts(c).iter().any(|mnt| mnt.name == v.name);
        p.check(used, || {
            format!("{what}: volume {} is mounted nowhere", v.name)
        });
    }
    for mnt in mounts(c) {
        p.check(volume(spec, &mnt.name).is_some(), || {
            format!("{what}: mount {} has no volume", mnt.name)
        });
    }

    // The agent's image: the two speak the NetResourceSet of one build.
    let agent = daemon_set(m, AGENT_DS)
        .and_then(pod_spec)
        .and_then(|s| container(Some(&s.containers), AGENT));
    if let Some(agent) = agent {
        p.check(c.image.is_some() && c.image == agent.image, || {
            format!(
                "{what} image {:?} differs from the agent's {:?}",
                c.image, agent.image
            )
        });
        p.check(c.image_pull_policy == agent.image_pull_policy, || {
            format!(
                "{what} imagePullPolicy {:?} is not the agent's {:?}",
                c.image_pull_policy, agent.image_pull_policy
            )
        });
    }

    // No privilege: a non-root user, nothing to write, no capability.
    let sc = c.security_context.clone().unwrap_or_default();
    let pod_sc = spec.security_context.clone().unwrap_or_default();
    let non_root = sc.run_as_non_root.or(pod_sc.run_as_non_root);
    p.check(non_root == Some(true), || {
        format!("{what}: runAsNonRoot is {non_root:?}, not true")
    });
    let uid = sc.run_as_user.or(pod_sc.run_as_user);
    p.check(uid != Some(0), || {
        format!("{what} runs as uid 0, which runAsNonRoot refuses")
    });
    p.check(sc.privileged != Some(true), || {
        format!("{what} is privileged")
    });
    p.check(sc.read_only_root_filesystem == Some(true), || {
        format!("{what} has a writable root filesystem")
    });
    p.check(caps(c, |c| c.drop.as_ref()).contains("ALL"), || {
        format!("{what} does not drop ALL capabilities")
    });
    let added = caps(c, |c| c.add.as_ref());
    p.check(added.is_empty(), || {
        format!("{what} adds capabilities {added:?}: API and cloud calls need none")
    });
    p.check(sc.allow_privilege_escalation == Some(false), || {
        format!("{what} allows privilege escalation")
    });
    let seccomp = sc
        .seccomp_profile
        .or(pod_sc.seccomp_profile)
        .map(|s| s.type_);
    p.check(seccomp.as_deref() == Some("RuntimeDefault"), || {
        format!("{what} runs with seccomp {seccomp:?}, not RuntimeDefault")
    });

    // The Lease's holder identity and namespace, from the downward API.
    for (var, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let got = env_field(c, var);
        p.check(got == Some(field), || {
            format!("{what} env {var} comes from {got:?}, not the downward API's {field}")
        });
    }

    // Probes on the named health port.
    let named = c
        .ports
        .iter()
        .flatten()
        .any(|cp| cp.name.as_deref() == Some(HEALTH_PORT));
    p.check(named, || {
        format!("{what}: no container port named {HEALTH_PORT}")
    });
    for (which, probe, path) in [
        ("readinessProbe", &c.readiness_probe, "/readyz"),
        ("livenessProbe", &c.liveness_probe, "/healthz"),
    ] {
        let Some(get) = probe.as_ref().and_then(|pr| pr.http_get.as_ref()) else {
            p.0.push(format!("{what} {which}: no httpGet probe"));
            continue;
        };
        p.check(get.port == IntOrString::String(HEALTH_PORT.into()), || {
            format!(
                "{what} {which} port {:?} is not the named port {HEALTH_PORT}",
                get.port
            )
        });
        p.check(get.path.as_deref() == Some(path), || {
            format!("{what} {which} path {:?}, not {path}", get.path)
        });
        p.check(matches!(get.scheme.as_deref(), None | Some("HTTP")), || {
            format!(
                "{what} {which} scheme {:?}: the health listener is plain HTTP",
                get.scheme
            )
        });
    }

    check_config(m, spec, c, &what, p);
}

/// `enim-operator --config /etc/enim/operator.toml`, that file from its
/// ConfigMap, and the ConfigMap's text TOML.
fn check_config(m: &Manifests, spec: &PodSpec, c: &Container, what: &str, p: &mut Problems) {
    let line = command_line(c);
    let exe = line.first().map(PathBuf::from).unwrap_or_default();
    p.check(exe.file_name().is_some_and(|n| n == OPERATOR), || {
        format!("{what} runs {}, not {OPERATOR}", exe.display())
    });
    let want = Path::new(OPERATOR_CONFIG_DIR).join(OPERATOR_CONFIG_KEY);
    match flags(line.get(1..).unwrap_or_default(), OPERATOR_FLAGS) {
        Err(e) => p.0.push(format!("{what} command: {e}")),
        // What `kubectl logs` and log collectors read: JSON lines, as
        // enimd's, not text with terminal colours.
        Ok(f) if f.get("--log-format").map(String::as_str) != Some("json") => p.0.push(format!(
            "{what} logs {}, not json",
            f.get("--log-format")
                .map_or("text (the default)", String::as_str)
        )),
        Ok(f) => match f.get("--config") {
            None => p.0.push(format!("{what} command has no --config")),
            Some(path) => {
                p.check(Path::new(path) == want, || {
                    format!("{what} --config {path} is not {}", want.display())
                });
                let from = config_map_file(spec, c, Path::new(path));
                let expected = (OPERATOR.to_owned(), OPERATOR_CONFIG_KEY.to_owned());
                p.check(from.as_ref() == Some(&expected), || {
                    format!(
                        "{what} --config {path} comes from {from:?}, not ConfigMap {OPERATOR} \
                         key {OPERATOR_CONFIG_KEY}"
                    )
                });
                if let Some((mnt, _)) = mount_of(c, Path::new(path)) {
                    p.check(mnt.mount_path == OPERATOR_CONFIG_DIR, || {
                        format!(
                            "{what}: its config is mounted at {}, not {OPERATOR_CONFIG_DIR}",
                            mnt.mount_path
                        )
                    });
                    p.check(!writable(mnt), || {
                        format!("{what}: its config mount is writable")
                    });
                }
            }
        },
    }
    let text = by_name(&m.config_maps, OPERATOR)
        .and_then(|cm| cm.data.as_ref())
        .and_then(|d| d.get(OPERATOR_CONFIG_KEY));
    match text {
        None => p.0.push(format!(
            "no ConfigMap {OPERATOR} with the key {OPERATOR_CONFIG_KEY}"
        )),
        Some(t) => {
            if let Err(e) = t.parse::<toml::Table>() {
                p.0.push(format!(
                    "ConfigMap {OPERATOR} {OPERATOR_CONFIG_KEY} is not TOML: {e}"
                ));
            }
        }
    }
}

/// Whether deploy/Containerfile puts the binary the operator's Deployment
/// runs where its command says (the image is the agent's).
fn image_holds_operator(m: &Manifests) -> Vec<String> {
    let mut p = Problems::default();
    let exe = by_name(&m.deployments, OPERATOR)
        .and_then(|d| d.spec.as_ref()?.template.spec.as_ref())
        .and_then(|s| container(Some(&s.containers), OPERATOR))
        .and_then(|c| command_line(c).first().map(PathBuf::from))
        .unwrap_or_default();
    // Problems of the Containerfile itself are check()'s.
    let placed = containerfile_layout(&m.containerfile, &mut Problems::default());
    p.check(
        placed.get(OPERATOR).map(PathBuf::as_path) == exe.parent(),
        || {
            format!(
                "Containerfile puts {OPERATOR} in {:?}, the Deployment runs {}",
                placed.get(OPERATOR),
                exe.display()
            )
        },
    );
    p.0
}

/// Off until deploy/Containerfile copies enim-operator into the image
/// (scripts/build-image.sh already puts it in the build context, but the
/// `COPY` line names only enimd, enim and enimctl): the Deployment would
/// fail to start its container.
#[test]
fn the_image_holds_the_operator() {
    let problems = image_holds_operator(&load());
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn the_image_check_finds_the_operator_or_its_absence() {
    let mut m = load();
    m.containerfile = "FROM scratch\nCOPY enimd enim enimctl /usr/local/bin/\n".into();
    let problems = image_holds_operator(&m);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("puts enim-operator in None")),
        "{problems:?}"
    );
    m.containerfile =
        "FROM scratch\nCOPY enimd enim enimctl enim-operator /usr/local/bin/\n".into();
    assert_eq!(image_holds_operator(&m), Vec::<String>::new());
    m.containerfile =
        "FROM scratch\nCOPY enimd enim enimctl /usr/local/bin/\nCOPY enim-operator /opt/\n".into();
    assert_eq!(image_holds_operator(&m).len(), 1);
}
