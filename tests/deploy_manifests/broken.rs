//! The checks must fail when the manifests are broken: each case breaks one
//! thing in the parsed manifests and expects a problem naming it.

use super::*;
use k8s_openapi::api::core::v1::{Capabilities, HTTPGetAction, SecurityContext};

fn agent_mut(m: &mut Manifests) -> &mut Container {
    spec_mut(m)
        .containers
        .iter_mut()
        .find(|c| c.name == AGENT)
        .unwrap()
}

fn agent_mounts_mut(m: &mut Manifests) -> &mut Vec<VolumeMount> {
    agent_mut(m).volume_mounts.as_mut().unwrap()
}

fn agent_security_mut(m: &mut Manifests) -> &mut SecurityContext {
    agent_mut(m).security_context.as_mut().unwrap()
}

fn agent_caps_mut(m: &mut Manifests) -> &mut Capabilities {
    agent_security_mut(m).capabilities.as_mut().unwrap()
}

/// The item called `name` in a list the manifests must have.
pub(crate) fn named_mut<'a, T>(
    list: &'a mut Option<Vec<T>>,
    name: &str,
    name_of: fn(&T) -> &str,
) -> &'a mut T {
    list.as_mut()
        .unwrap()
        .iter_mut()
        .find(|t| name_of(t) == name)
        .unwrap()
}

fn volume_mut<'a>(m: &'a mut Manifests, name: &str) -> &'a mut Volume {
    named_mut(&mut spec_mut(m).volumes, name, |v| &v.name)
}

fn http_get_mut(probe: &mut Option<Probe>) -> &mut HTTPGetAction {
    probe.as_mut().unwrap().http_get.as_mut().unwrap()
}

fn init_mut(m: &mut Manifests) -> &mut Container {
    named_mut(&mut spec_mut(m).init_containers, INSTALLER, |c| &c.name)
}

fn mount_mut<'a>(c: &'a mut Container, name: &str) -> &'a mut VolumeMount {
    named_mut(&mut c.volume_mounts, name, |v| &v.name)
}

fn daemon_set_mut<'a>(m: &'a mut Manifests, name: &str) -> &'a mut DaemonSet {
    m.daemon_sets
        .iter_mut()
        .find(|d| d.metadata.name.as_deref() == Some(name))
        .unwrap()
}

fn pod_spec_mut<'a>(m: &'a mut Manifests, name: &str) -> &'a mut PodSpec {
    daemon_set_mut(m, name)
        .spec
        .as_mut()
        .unwrap()
        .template
        .spec
        .as_mut()
        .unwrap()
}

fn spec_mut(m: &mut Manifests) -> &mut PodSpec {
    pod_spec_mut(m, AGENT_DS)
}

fn plugin_spec_mut(m: &mut Manifests) -> &mut PodSpec {
    pod_spec_mut(m, PLUGIN_DS)
}

fn plugin_mut(m: &mut Manifests) -> &mut Container {
    &mut plugin_spec_mut(m).containers[0]
}

fn plugin_security_mut(m: &mut Manifests) -> &mut SecurityContext {
    plugin_mut(m).security_context.as_mut().unwrap()
}

fn toml_mut(m: &mut Manifests) -> &mut String {
    m.config_maps
        .iter_mut()
        .find(|c| c.metadata.name.as_deref() == Some("enimd-config"))
        .unwrap()
        .data
        .as_mut()
        .unwrap()
        .get_mut("enimd.toml")
        .unwrap()
}

pub(crate) fn sa_mut<'a>(m: &'a mut Manifests, name: &str) -> &'a mut ServiceAccount {
    m.service_accounts
        .iter_mut()
        .find(|s| s.metadata.name.as_deref() == Some(name))
        .unwrap()
}

pub(crate) fn expect_problem(name: &str, m: &Manifests, needle: &str) {
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
            |m| agent_mounts_mut(m).retain(|v| v.mount_path != "/var/run/netns"),
            "pod netns",
        ),
        (
            "netns without propagation",
            |m| {
                for v in agent_mounts_mut(m) {
                    v.mount_propagation = None;
                }
            },
            "propagation",
        ),
        (
            "socket dir not mounted",
            |m| agent_mounts_mut(m).retain(|v| v.mount_path != "/run/enim"),
            "socket",
        ),
        (
            "state dir on an emptyDir",
            |m| {
                let v = volume_mut(m, "state");
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
        // A node hands its ENIs out through DRA or the device plugin.
        (
            "DRA and the device plugin both on",
            |m| {
                let on = toml_mut(m).replace(
                    "[device_plugin]\nenabled = false",
                    "[device_plugin]\nenabled = true",
                );
                assert_ne!(&on, toml_mut(m));
                *toml_mut(m) = format!("{on}\n[dra]\nenabled = true\n");
            },
            "[dra] enabled = true and [device_plugin] enabled = true",
        ),
        (
            "DRA in secondary mode",
            |m| {
                let secondary = toml_mut(m).replace("mode = \"primary\"", "mode = \"secondary\"");
                assert_ne!(&secondary, toml_mut(m));
                *toml_mut(m) = format!("{secondary}\n[dra]\nenabled = true\n");
            },
            "[dra] enabled = true needs mode = \"primary\"",
        ),
        (
            "privileged",
            |m| agent_security_mut(m).privileged = Some(true),
            "is privileged",
        ),
        (
            "SYS_ADMIN dropped",
            |m| {
                agent_caps_mut(m)
                    .add
                    .as_mut()
                    .unwrap()
                    .retain(|c| c != "SYS_ADMIN");
            },
            "capabilities",
        ),
        (
            "extra capability",
            |m| {
                agent_caps_mut(m)
                    .add
                    .as_mut()
                    .unwrap()
                    .push("SYS_PTRACE".into());
            },
            "capabilities",
        ),
        ("no drop ALL", |m| agent_caps_mut(m).drop = None, "drop ALL"),
        (
            "escalation off with SYS_ADMIN",
            |m| agent_security_mut(m).allow_privilege_escalation = Some(false),
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
                let v = volume_mut(m, "cni-net-d");
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
                http_get_mut(&mut agent_mut(m).readiness_probe).port = IntOrString::Int(8080);
            },
            "readinessProbe port",
        ),
        (
            "liveness on the wrong path",
            |m| {
                http_get_mut(&mut agent_mut(m).liveness_probe).path = Some("/readyz".into());
            },
            "livenessProbe path",
        ),
        (
            "probe on the pod IP",
            |m| {
                http_get_mut(&mut agent_mut(m).readiness_probe).host = None;
            },
            "readinessProbe host",
        ),
        (
            "named port renumbered",
            |m| agent_mut(m).ports.as_mut().unwrap()[0].container_port = 9000,
            "readinessProbe port",
        ),
        (
            "agent's pod without a token",
            |m| spec_mut(m).automount_service_account_token = Some(false),
            "the agent's pod mounts no service account token",
        ),
        (
            "agent's ServiceAccount without a token",
            |m| {
                let sa = sa_mut(m, AGENT_SA);
                sa.automount_service_account_token = Some(false);
                spec_mut(m).automount_service_account_token = None;
            },
            "ServiceAccount enimd does not mount its token",
        ),
        (
            "agent as another ServiceAccount",
            |m| spec_mut(m).service_account_name = Some("default".into()),
            "not ServiceAccount enimd",
        ),
        (
            "no NODE_NAME",
            |m| agent_mut(m).env = None,
            "env NODE_NAME comes from None",
        ),
        (
            "NODE_NAME from the pod's name",
            |m| {
                let env = agent_mut(m).env.as_mut().unwrap();
                let var = env.iter_mut().find(|e| e.name == "NODE_NAME").unwrap();
                let field = var.value_from.as_mut().unwrap().field_ref.as_mut().unwrap();
                field.field_path = "metadata.name".into();
            },
            "env NODE_NAME comes from Some(\"metadata.name\")",
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
                    "COPY enimd enim enimctl enim-operator /usr/local/bin/",
                    "COPY enimd enimctl enim-operator /usr/local/bin/\nCOPY enim /opt/",
                )
            },
            "puts enim",
        ),
        (
            "all of /proc for the sysctls",
            |m| {
                let v = volume_mut(m, "proc-sys-net");
                v.host_path.as_mut().unwrap().path = "/proc".into();
                // The config's /host/proc/sys/net is still the node's
                // /proc/sys/net, but all of /proc comes with it.
                mount_mut(agent_mut(m), "proc-sys-net").mount_path = "/host/proc".into();
            },
            "hostPath /proc (volume proc-sys-net) is not one enimd needs",
        ),
        (
            "sysctls mounted read-only",
            |m| mount_mut(agent_mut(m), "proc-sys-net").read_only = Some(true),
            "proc_sys_net /host/proc/sys/net is mounted read-only",
        ),
        (
            "sysctls at the pod's own read-only /proc/sys/net",
            |m| {
                *toml_mut(m) = toml_mut(m).replace(
                    "proc_sys_net = \"/host/proc/sys/net\"",
                    "proc_sys_net = \"/proc/sys/net\"",
                )
            },
            "proc_sys_net /proc/sys/net is not on a hostPath mount",
        ),
        (
            "sysctls for install-cni too",
            |m| {
                let mnt = mount_mut(agent_mut(m), "proc-sys-net").clone();
                init_mut(m).volume_mounts.as_mut().unwrap().push(mnt);
            },
            "install-cni mounts hostPath /proc/sys/net",
        ),
        (
            "an extra hostPath",
            |m| {
                let mut v = volume_mut(m, "state").clone();
                v.name = "etc".into();
                v.host_path.as_mut().unwrap().path = "/etc".into();
                spec_mut(m).volumes.as_mut().unwrap().push(v);
                let mut mnt = mount_mut(agent_mut(m), "state").clone();
                mnt.name = "etc".into();
                mnt.mount_path = "/host/etc".into();
                agent_mounts_mut(m).push(mnt);
            },
            "hostPath /etc (volume etc) is not one enimd needs",
        ),
        (
            "device plugin DaemonSet gone",
            |m| {
                m.daemon_sets
                    .retain(|d| d.metadata.name.as_deref() != Some(PLUGIN_DS))
            },
            "enim-device-plugin",
        ),
        (
            "enimd's own plugin on beside it",
            |m| {
                *toml_mut(m) = toml_mut(m).replace(
                    "[device_plugin]\nenabled = false",
                    "[device_plugin]\nenabled = true",
                )
            },
            "refuses to run beside it",
        ),
        (
            "device plugin with a capability",
            |m| {
                plugin_security_mut(m).capabilities.as_mut().unwrap().add =
                    Some(vec!["NET_ADMIN".into()]);
            },
            "enim-device-plugin adds capabilities",
        ),
        (
            "device plugin without drop ALL",
            |m| plugin_security_mut(m).capabilities = None,
            "enim-device-plugin does not drop ALL",
        ),
        (
            "device plugin with a writable root",
            |m| plugin_security_mut(m).read_only_root_filesystem = None,
            "enim-device-plugin has a writable root",
        ),
        (
            "device plugin may escalate",
            |m| plugin_security_mut(m).allow_privilege_escalation = None,
            "enim-device-plugin allows privilege escalation",
        ),
        (
            "device plugin as another user",
            |m| plugin_security_mut(m).run_as_user = Some(1000),
            "enim-device-plugin runs as Some(1000)",
        ),
        (
            "device plugin asks another socket",
            |m| {
                plugin_mut(m)
                    .command
                    .as_mut()
                    .unwrap()
                    .extend(["--socket".into(), "/run/other/enimd.sock".into()])
            },
            "enim-device-plugin asks the socket /run/other/enimd.sock",
        ),
        (
            "device plugin without enimd's socket dir",
            |m| {
                let c = plugin_mut(m);
                c.volume_mounts
                    .as_mut()
                    .unwrap()
                    .retain(|v| v.mount_path != "/run/enim");
            },
            "enim-device-plugin --socket /run/enim/enimd.sock is not on a hostPath mount",
        ),
        (
            "device plugin's kubelet dir read-only",
            |m| mount_mut(plugin_mut(m), "device-plugins").read_only = Some(true),
            "/var/lib/kubelet/device-plugins is mounted read-only",
        ),
        (
            "device plugin serving elsewhere than the kubelet's dir",
            |m| {
                let v = named_mut(&mut plugin_spec_mut(m).volumes, "device-plugins", |v| {
                    &v.name
                });
                v.host_path.as_mut().unwrap().path = "/var/lib/enim-plugins".into();
            },
            "enim-device-plugin --dir /var/lib/kubelet/device-plugins is /var/lib/enim-plugins",
        ),
        (
            "device plugin with the checkpoint's dir too",
            |m| {
                let state = volume_mut(m, "state").clone();
                let mut mnt = mount_mut(agent_mut(m), "state").clone();
                plugin_spec_mut(m).volumes.as_mut().unwrap().push(state);
                mnt.read_only = Some(true);
                plugin_mut(m).volume_mounts.as_mut().unwrap().push(mnt);
            },
            "enim-device-plugin: hostPath /var/lib/enim (volume state) is not one it needs",
        ),
        (
            "device plugin on the pod network",
            |m| plugin_spec_mut(m).host_network = None,
            "enim-device-plugin: hostNetwork",
        ),
        (
            "device plugin not on tainted nodes",
            |m| plugin_spec_mut(m).tolerations = None,
            "enim-device-plugin: no catch-all toleration",
        ),
        (
            "device plugin not node-critical",
            |m| plugin_spec_mut(m).priority_class_name = None,
            "enim-device-plugin: priorityClassName",
        ),
        (
            "device plugin with a token",
            |m| plugin_spec_mut(m).automount_service_account_token = None,
            "enim-device-plugin mounts a service account token",
        ),
        (
            "device plugin of another image",
            |m| plugin_mut(m).image = Some("enim:old".into()),
            "enim-device-plugin image",
        ),
        (
            "device plugin not running device-plugin",
            |m| plugin_mut(m).command.as_mut().unwrap()[1] = "install-cni".into(),
            "is not `enimd device-plugin`",
        ),
        (
            "device plugin with an unknown flag",
            |m| {
                plugin_mut(m)
                    .command
                    .as_mut()
                    .unwrap()
                    .extend(["--kubelet-dir".into(), "/x".into()])
            },
            "enim-device-plugin: --kubelet-dir",
        ),
        (
            "device plugin selecting enimd's pods",
            |m| {
                let ds = daemon_set_mut(m, PLUGIN_DS).spec.as_mut().unwrap();
                ds.selector.match_labels = Some(BTreeMap::from([(
                    "app.kubernetes.io/name".to_string(),
                    "enim".to_string(),
                )]));
            },
            "each selects the other's pods",
        ),
        // The kubelet's DRA dirs.
        (
            "DRA registration dir not mounted",
            |m| agent_mounts_mut(m).retain(|v| v.name != "plugins-registry"),
            "the DRA registration socket /var/lib/kubelet/plugins_registry/enim.io-reg.sock is \
             not on a hostPath mount of enimd",
        ),
        (
            "DRA registration dir elsewhere on the node",
            |m| {
                let hp = volume_mut(m, "plugins-registry")
                    .host_path
                    .as_mut()
                    .unwrap();
                hp.path = "/var/lib/enim/plugins_registry".into();
            },
            "the DRA registration socket /var/lib/kubelet/plugins_registry/enim.io-reg.sock is \
             /var/lib/enim/plugins_registry/enim.io-reg.sock on the node",
        ),
        (
            "DRA socket dir read-only",
            |m| mount_mut(agent_mut(m), "dra-plugin").read_only = Some(true),
            "the DRA socket /var/lib/kubelet/plugins/enim.io/dra.sock is mounted read-only",
        ),
        (
            "every driver's sockets mounted",
            |m| {
                mount_mut(agent_mut(m), "dra-plugin").mount_path =
                    "/var/lib/kubelet/plugins".into();
                let hp = volume_mut(m, "dra-plugin").host_path.as_mut().unwrap();
                hp.path = "/var/lib/kubelet/plugins".into();
            },
            "hostPath /var/lib/kubelet/plugins (volume dra-plugin) is not one enimd needs",
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

    let secret = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: x\n";
    let err = parse_into(&mut Manifests::default(), secret).unwrap_err();
    assert!(err.contains("unexpected object v1/Secret"), "{err}");

    // The new kinds are read as strictly: a misspelt field of each.
    for (file, from, to) in [
        ("11-rbac-agent.yaml", "  - apiGroups:", "  - apiGroup:"),
        (
            "11-rbac-agent.yaml",
            "validationActions:",
            "validationAction:",
        ),
        ("11-rbac-agent.yaml", "matchConditions:", "matchCondition:"),
        ("50-operator.yaml", "roleRef:", "roleref:"),
        ("50-operator.yaml", "podAntiAffinity:", "podAntiaffinity:"),
        (
            "05-crd-netresourceset.yaml",
            "subresources:",
            "subresource:",
        ),
        ("06-deviceclass.yaml", "selectors:", "selector:"),
    ] {
        let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
        let typo = text.replacen(from, to, 1);
        assert_ne!(typo, text, "{file}: no {from:?}");
        let err = parse_into(&mut Manifests::default(), &typo).unwrap_err();
        let field = to.trim().trim_start_matches("- ").trim_end_matches(':');
        assert!(
            err.contains(&format!(".{field} (unknown)")),
            "{file}: {err}"
        );
    }
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
