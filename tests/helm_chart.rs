//! The Helm chart (charts/enim) with the real `helm` v3 that
//! scripts/cluster/build.sh builds: deploy/ is its rendering, the settings
//! a user must give fail `helm template` with a message, values.schema.json
//! and the templates refuse what enimd refuses at start, and each pool's
//! enimd.toml is one enimd accepts, in the pool's mode.
//!
//! Without helm the tests skip with a message; under CI=true they fail.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use enim::daemon::config::{Config, Mode};
use serde_yaml::Value;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The helm build.sh built, beside the Kubernetes binaries.
fn helm() -> Option<PathBuf> {
    let found = enim_testkit::apiserver::bin_dir()
        .map(|dir| dir.join("helm"))
        .filter(|helm| helm.is_file());
    if found.is_none() {
        let msg = "helm is not built (scripts/cluster/build.sh)";
        assert!(!enim_testkit::ci(), "CI=true: {msg}");
        eprintln!("SKIPPED: {msg}");
    }
    found
}

/// `helm template` of the chart with `values` (YAML) over its defaults.
fn template(helm: &Path, values: &str) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    Command::new(helm)
        .args(["template", "enim"])
        .arg(repo().join("charts/enim"))
        .args(["--namespace", "enim-system", "--values"])
        .arg(&file)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Each (name, values, needle) fails `helm template` with needle in its
/// message.
fn each_fails_naming(helm: &Path, cases: &[(&str, String, &str)]) {
    for (name, values, needle) in cases {
        let out = template(helm, values);
        assert!(!out.status.success(), "{name}: rendered");
        assert!(
            stderr(&out).contains(needle),
            "{name}: expected {needle:?} in {}",
            stderr(&out)
        );
    }
}

/// The least a working install gives: Service CIDRs and the operator's
/// cloud, cluster, subnet and region.
const REQUIRED: &str = r#"
serviceCIDRs: ["10.100.0.0/16"]
operator:
  config:
    operator: {cluster: c1, subnets: [subnet-1], security_groups: [sg-1]}
    cloud: {type: aws, region: us-east-1}
"#;

/// The cloud run's pools (scripts/cluster/cloud.sh): one of each mode, and
/// one on its own `aws` provider with keys from a Secret.
const POOLS: &str = r#"
pools:
  - {name: primary, mode: primary, nodeSelector: {enim.io/pool: primary}}
  - {name: secondary, mode: secondary, nodeSelector: {enim.io/pool: secondary}}
  - {name: primary-dra, mode: primary-dra, nodeSelector: {enim.io/pool: primary-dra}}
  - name: per-node
    mode: primary
    nodeSelector: {enim.io/pool: per-node}
    envFromSecret: enim-node-cloud
    config:
      provider: {type: aws, region: us-east-1, subnet_id: subnet-1, security_group_ids: [sg-1], cluster: c1}
"#;

#[test]
fn deploy_is_the_charts_rendering() {
    let Some(helm) = helm() else { return };
    let out = Command::new(repo().join("scripts/render-deploy.sh"))
        .arg("--check")
        .env("HELM", &helm)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "deploy/ is not charts/enim rendered with ci/deploy-values.yaml (run scripts/render-deploy.sh):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
}

#[test]
fn required_settings_fail_with_a_message() {
    let Some(helm) = helm() else { return };
    let with_cidrs = "serviceCIDRs: [10.100.0.0/16]\n";
    let cases: &[(&str, String, &str)] = &[
        (
            "the defaults",
            String::new(),
            "operator.config.cloud.type is required",
        ),
        (
            "no cloud",
            with_cidrs.into(),
            "operator.config.cloud.type is required",
        ),
        (
            "no cluster name",
            format!("{with_cidrs}operator: {{config: {{cloud: {{type: aws, region: r}}}}}}\n"),
            "operator.config.operator.cluster is required",
        ),
        (
            "no subnet",
            format!(
                "{with_cidrs}operator: {{config: {{operator: {{cluster: c}}, cloud: {{type: aws, region: r}}}}}}\n"
            ),
            "operator.config.operator.subnets is required with cloud aws",
        ),
        (
            "no region on aws",
            format!(
                "{with_cidrs}operator: {{config: {{operator: {{cluster: c, subnets: [s]}}, cloud: {{type: aws}}}}}}\n"
            ),
            "operator.config.cloud.region is required",
        ),
        (
            "no operator and no provider",
            format!("{with_cidrs}operator: {{enabled: false}}\n"),
            "pool default has no provider",
        ),
        (
            "two pools, one without a nodeSelector",
            format!(
                "{REQUIRED}pools: [{{name: a, mode: primary}}, {{name: b, mode: secondary, nodeSelector: {{zone: b}}}}]\n"
            ),
            "pool a has no nodeSelector",
        ),
    ];
    each_fails_naming(&helm, cases);
    let out = template(&helm, REQUIRED);
    assert!(
        out.status.success(),
        "the required settings: {}",
        stderr(&out)
    );
}

#[test]
fn wrong_values_and_what_enimd_refuses_fail() {
    let Some(helm) = helm() else { return };
    let one_pool = |pool: &str| format!("{REQUIRED}pools: [{pool}]\n");
    let cases: &[(&str, String, &str)] = &[
        (
            "a pull policy that is none",
            format!("{REQUIRED}image: {{pullPolicy: Sometimes}}\n"),
            "pullPolicy",
        ),
        (
            "a port as a string",
            format!("{REQUIRED}metrics: {{port: \"9464\"}}\n"),
            "port",
        ),
        (
            "a mode that is none",
            one_pool("{name: a, mode: dra}"),
            "mode",
        ),
        (
            "a Service CIDR that is not one",
            REQUIRED.replace("10.100.0.0/16", "10.100.0.0"),
            "serviceCIDRs",
        ),
        (
            "an enimd key that is none",
            one_pool("{name: a, mode: primary, config: {sokcet: /run/enim/x.sock}}"),
            "sokcet",
        ),
        (
            "the mode in a pool's config",
            one_pool("{name: a, mode: primary, config: {mode: secondary}}"),
            "pools/0/config",
        ),
        (
            "DRA and the device plugin on one node",
            one_pool("{name: a, mode: primary-dra, config: {device_plugin: {enabled: true}}}"),
            "device_plugin",
        ),
        (
            "DRA and the device plugin, through agent.config",
            format!(
                "{REQUIRED}agent: {{config: {{device_plugin: {{enabled: true}}}}}}\npools: [{{name: a, mode: primary-dra}}]\n"
            ),
            "[dra] and [device_plugin] both enabled",
        ),
        (
            "DRA in secondary mode",
            one_pool("{name: a, mode: secondary, config: {dra: {enabled: true}}}"),
            "dra",
        ),
        (
            "host_stack_cidrs without the host path",
            REQUIRED.replace("[\"10.100.0.0/16\"]", "[]")
                + "pools: [{name: a, mode: primary, config: {host_path: {host_stack_cidrs: [169.254.20.10/32]}}}]\n",
            "host_stack_cidrs",
        ),
        (
            "an IMDS block of every address",
            format!("{REQUIRED}imds: {{blocked: [0.0.0.0/0]}}\n"),
            "blocked",
        ),
        (
            "an IMDS opt-in that is no namespace",
            format!("{REQUIRED}imds: {{allowedNamespaces: [Kube_System]}}\n"),
            "allowedNamespaces",
        ),
        (
            "an IMDS block that is a host path prefix",
            format!("{REQUIRED}imds: {{blocked: [10.100.0.0/16]}}\n"),
            "also in serviceCIDRs",
        ),
        (
            "a cloud that is none",
            REQUIRED.replace("type: aws", "type: gcp"),
            "type",
        ),
        (
            "a PodMonitor of the node's loopback",
            format!("{REQUIRED}metrics: {{podMonitor: {{enabled: true}}}}\n"),
            "metrics.address 0.0.0.0",
        ),
    ];
    each_fails_naming(&helm, cases);
}

/// serviceCIDRs unset: every pool's enimd follows the API's ServiceCIDRs,
/// and only then may the agent list them; given, they are used as they
/// are; `[]` turns the host path off.
#[test]
fn service_cidrs_come_from_the_api_unless_given() {
    let Some(helm) = helm() else { return };
    let from_api = REQUIRED.replace("serviceCIDRs: [\"10.100.0.0/16\"]\n", "");
    assert_ne!(from_api, REQUIRED);
    let reads_servicecidrs = |docs: &[Value]| {
        let rules = named(docs, "ClusterRole", "enim:agent")["rules"].clone();
        rules
            .as_sequence()
            .unwrap()
            .iter()
            .any(|r| r["resources"][0] == "servicecidrs")
    };
    for (values, api, cidrs, listed) in [
        (from_api.clone(), true, vec![], true),
        (
            REQUIRED.to_string(),
            false,
            vec!["10.100.0.0/16".to_string()],
            false,
        ),
        (
            format!("{from_api}serviceCIDRs: []\n"),
            false,
            vec![],
            false,
        ),
    ] {
        let out = template(&helm, &format!("{values}{POOLS}"));
        assert!(out.status.success(), "{}", stderr(&out));
        let docs = documents(&out);
        for config_map in [
            "enimd-config",
            "enimd-config-secondary",
            "enimd-config-per-node",
        ] {
            let text = named(&docs, "ConfigMap", config_map)["data"]["enimd.toml"]
                .as_str()
                .unwrap();
            let config = Config::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            let hp = &config.host_path;
            assert_eq!(hp.service_cidrs_from_api, api, "{config_map}: {text}");
            let given: Vec<String> = hp.service_cidrs.iter().map(|c| c.to_string()).collect();
            assert_eq!(given, cidrs, "{config_map}");
        }
        assert_eq!(reads_servicecidrs(&docs), listed, "{values}");
    }
}

/// Every document of `helm template`'s output.
fn documents(out: &Output) -> Vec<Value> {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_yaml::Deserializer::from_str(&text)
        .map(Value::deserialize)
        .filter_map(Result::ok)
        .filter(|v| !v.is_null())
        .collect()
}

use serde::Deserialize;

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The uninstall hook's grants: exactly what `enimctl uninstall` calls
/// (s_cloud_helm_uninstall runs it with them), the operator's parts only
/// with an operator; and every object of it is a pre-delete hook, so no
/// install or upgrade ever runs it.
#[test]
fn the_uninstall_hook_grants_what_enimctl_uninstall_uses_and_no_more() {
    let Some(helm) = helm() else { return };
    let rules = |doc: &Value| serde_json::to_value(&doc["rules"]).unwrap();
    let out = template(&helm, REQUIRED);
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = documents(&out);
    let hook: Vec<&Value> = docs
        .iter()
        .filter(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "uninstall")
        .collect();
    let kinds: Vec<&str> = hook.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "DaemonSet",
            "Job"
        ]
    );
    for d in &hook {
        assert_eq!(
            d["metadata"]["annotations"]["helm.sh/hook"], "pre-delete",
            "{d:?}"
        );
    }
    assert_eq!(
        rules(named(&docs, "ClusterRole", "enim:uninstall")),
        serde_json::json!([{"apiGroups": ["enim.io"], "resources": ["netresourcesets"],
            "verbs": ["get", "list", "patch", "delete"]}])
    );
    assert_eq!(
        rules(named(&docs, "Role", "enim:uninstall")),
        serde_json::json!([
            {"apiGroups": ["apps"], "resources": ["daemonsets"],
             "resourceNames": ["enim-uninstall-cni"], "verbs": ["get"]},
            {"apiGroups": ["apps"], "resources": ["deployments"],
             "resourceNames": ["enim-operator"], "verbs": ["get"]},
            {"apiGroups": ["apps"], "resources": ["deployments/scale"],
             "resourceNames": ["enim-operator"], "verbs": ["patch"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": ["enim-operator"], "verbs": ["get"]},
        ])
    );
    let job = &named(&docs, "Job", "enim-uninstall")["spec"]["template"]["spec"];
    let command = serde_json::to_value(&job["containers"][0]["command"]).unwrap();
    assert_eq!(
        command,
        serde_json::json!([
            "/usr/local/bin/enimctl",
            "uninstall",
            "--namespace",
            "enim-system",
            "--node-cleanup",
            "enim-uninstall-cni",
            "--operator",
            "enim-operator",
            "--within",
            "4m"
        ])
    );
    let ds = &named(&docs, "DaemonSet", "enim-uninstall-cni")["spec"]["template"]["spec"];
    // On the host network: a pod on the pod network would take an ENI.
    assert_eq!(ds["hostNetwork"], true);
    assert_eq!(ds["automountServiceAccountToken"], false);
    // The init container marks the agent's run dir (its next SIGTERM is
    // an uninstall); the container that holds the pod does not.
    let args = |c: &Value| -> Vec<String> {
        c["command"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect()
    };
    let init = args(&ds["initContainers"][0]);
    let at = init.iter().position(|a| a == "--mark-run-dir").unwrap();
    assert_eq!(init[at + 1], "/host/run/enim");
    assert!(!args(&ds["containers"][0]).contains(&"--mark-run-dir".to_string()));
    let run = ds["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["hostPath"]["path"] == "/run/enim")
        .unwrap();
    let mounted = ds["initContainers"][0]["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|m| m["name"] == run["name"] && m["mountPath"] == "/host/run/enim");
    assert!(mounted);

    // Without the operator: no sets to touch, so no grant for them.
    let out = template(
        &helm,
        "serviceCIDRs: [\"10.100.0.0/16\"]\noperator: {enabled: false}\n\
         pools: [{name: solo, mode: primary, config: {provider: {type: static}}}]\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = documents(&out);
    assert!(!docs
        .iter()
        .any(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "enim:uninstall"));
    assert_eq!(
        rules(named(&docs, "Role", "enim:uninstall")),
        serde_json::json!([{"apiGroups": ["apps"], "resources": ["daemonsets"],
            "resourceNames": ["enim-uninstall-cni"], "verbs": ["get"]}])
    );
    let job = &named(&docs, "Job", "enim-uninstall")["spec"]["template"]["spec"];
    let command = serde_json::to_value(&job["containers"][0]["command"]).unwrap();
    assert!(!command.to_string().contains("--operator"), "{command}");

    // Off: nothing of it.
    let out = template(&helm, &format!("{REQUIRED}uninstall: {{enabled: false}}\n"));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("enim-uninstall"));
}

#[test]
fn each_pool_gets_an_agent_with_a_config_enimd_accepts() {
    let Some(helm) = helm() else { return };
    let out = template(&helm, &format!("{REQUIRED}{POOLS}"));
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = documents(&out);
    let pools = [
        ("primary", "enimd", "enimd-config", Mode::Primary, false),
        (
            "secondary",
            "enimd-secondary",
            "enimd-config-secondary",
            Mode::Secondary,
            false,
        ),
        (
            "primary-dra",
            "enimd-primary-dra",
            "enimd-config-primary-dra",
            Mode::Primary,
            true,
        ),
        (
            "per-node",
            "enimd-per-node",
            "enimd-config-per-node",
            Mode::Primary,
            false,
        ),
    ];
    for (pool, agent, config_map, mode, dra) in pools {
        let text = named(&docs, "ConfigMap", config_map)["data"]["enimd.toml"]
            .as_str()
            .unwrap();
        let config = Config::parse(text).unwrap_or_else(|e| panic!("{pool}: {e}\n{text}"));
        assert_eq!(config.mode, mode, "{pool}");
        assert_eq!(config.dra.enabled, dra, "{pool}");
        let cluster = matches!(
            config.provider,
            enim::daemon::config::ProviderConfig::Cluster(_)
        );
        assert_eq!(
            cluster,
            pool != "per-node",
            "{pool}: the operator's pools run `cluster`"
        );
        assert_eq!(
            config
                .host_path
                .service_cidrs
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>(),
            ["10.100.0.0/16"],
            "{pool}"
        );
        let spec = &named(&docs, "DaemonSet", agent)["spec"]["template"]["spec"];
        assert_eq!(spec["nodeSelector"]["enim.io/pool"], pool, "{pool}");
        let volumes = spec["volumes"].as_sequence().unwrap();
        assert!(
            volumes.iter().any(|v| v["configMap"]["name"] == config_map),
            "{pool}: its DaemonSet mounts {config_map}"
        );
        let env_from = &spec["containers"][0]["envFrom"];
        assert_eq!(
            env_from[0]["secretRef"]["name"].as_str(),
            (pool == "per-node").then_some("enim-node-cloud"),
            "{pool}"
        );
    }
    // The device plugin on every pool's nodes but the DRA pool's.
    let plugin = &named(&docs, "DaemonSet", "enim-device-plugin")["spec"]["template"]["spec"];
    let terms = plugin["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        .as_sequence()
        .unwrap();
    let served: Vec<&str> = terms
        .iter()
        .map(|t| t["matchExpressions"][0]["values"][0].as_str().unwrap())
        .collect();
    assert_eq!(served, ["primary", "secondary", "per-node"]);
    // The operator's config, and no Secret of its own: none was named.
    let operator = named(&docs, "ConfigMap", "enim-operator")["data"]["operator.toml"]
        .as_str()
        .unwrap();
    let parsed: toml::Table = operator.parse().unwrap();
    assert_eq!(parsed["operator"]["subnets"][0].as_str(), Some("subnet-1"));
    assert_eq!(
        parsed["operator"]["watermarks"]["min_allocate"].as_integer(),
        Some(1),
        "integers stay integers:\n{operator}"
    );
    let deployment = &named(&docs, "Deployment", "enim-operator")["spec"]["template"]["spec"];
    assert!(deployment["containers"][0]["envFrom"].is_null());
    // The chart makes no Namespace unless asked: helm needs it first.
    assert!(!docs.iter().any(|d| d["kind"] == "Namespace"));
}

/// `helm` on the control plane `cp`, as its admin, with its own state in
/// `home`.
fn helm_on(
    helm: &Path,
    cp: &enim_testkit::apiserver::ControlPlane,
    home: &Path,
    args: &[&str],
) -> Output {
    Command::new(helm)
        .arg(format!("--kubeconfig={}", cp.admin_kubeconfig().display()))
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .unwrap()
}

/// The images of a namespaced object's pod template, as the API has them.
fn images(cp: &enim_testkit::apiserver::ControlPlane, kind: &str, name: &str) -> String {
    cp.kubectl(&[
        "-n",
        "enim-system",
        "get",
        kind,
        name,
        "-o",
        "jsonpath={.spec.template.spec.initContainers[*].image} {.spec.template.spec.containers[*].image}",
    ])
    .trim()
    .to_string()
}

/// Install, upgrade and uninstall against a real API server (no nodes: the
/// objects, not their pods): the API accepts every object the cloud run's
/// values render (admission policies' CEL included), an upgrade changes the
/// image of every workload, and an uninstall removes all but the CRD.
#[test]
fn the_release_installs_upgrades_and_uninstalls_on_a_real_api_server() {
    let Some(helm) = helm() else { return };
    let Some(cp) = enim_testkit::apiserver::ControlPlane::start() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let values = home.path().join("values.yaml");
    std::fs::write(&values, format!("{REQUIRED}{POOLS}")).unwrap();
    let values = values.to_str().unwrap();
    let chart = repo().join("charts/enim");
    let chart = chart.to_str().unwrap();
    cp.kubectl(&["create", "namespace", "enim-system"]);
    let run = |args: &[&str]| {
        let out = helm_on(&helm, &cp, home.path(), args);
        assert!(out.status.success(), "helm {args:?}: {}", stderr(&out));
    };
    run(&["install", "enim", chart, "-n", "enim-system", "-f", values]);
    let workloads = [
        ("daemonset", "enimd"),
        ("daemonset", "enimd-secondary"),
        ("daemonset", "enimd-primary-dra"),
        ("daemonset", "enimd-per-node"),
        ("daemonset", "enim-device-plugin"),
        ("deployment", "enim-operator"),
    ];
    for (kind, name) in workloads {
        let got = images(&cp, kind, name);
        assert!(
            got.split_whitespace().all(|i| i == "enim:0.1.0"),
            "{kind} {name}: {got}"
        );
    }
    run(&[
        "upgrade",
        "enim",
        chart,
        "-n",
        "enim-system",
        "-f",
        values,
        "--set",
        "image.tag=0.2.0",
    ]);
    for (kind, name) in workloads {
        let got = images(&cp, kind, name);
        assert!(
            !got.is_empty() && got.split_whitespace().all(|i| i == "enim:0.2.0"),
            "{kind} {name} after the upgrade: {got}"
        );
    }
    // No hooks: the uninstall hook's Job needs a node to run on (the cloud
    // e2e's s_cloud_helm_uninstall runs it).
    run(&[
        "uninstall",
        "enim",
        "-n",
        "enim-system",
        "--wait",
        "--no-hooks",
    ]);
    let left = cp.kubectl(&[
        "get",
        "daemonset,deployment,configmap,serviceaccount,role,rolebinding,clusterrole,clusterrolebinding,\
         validatingadmissionpolicy,validatingadmissionpolicybinding,deviceclass",
        "-A",
        "-l",
        "app.kubernetes.io/name=enim",
        "-o",
        "name",
    ]);
    assert_eq!(left.trim(), "", "left after helm uninstall");
    // The CRD stays: helm never deletes what crds/ installed.
    cp.kubectl(&["get", "crd", "netresourcesets.enim.io"]);
}

/// The chart ships the alerts and the dashboard: off by default; on, the
/// PrometheusRule's spec is exactly the rules file and the ConfigMap holds
/// exactly the dashboard, each with the labels asked for.
#[test]
fn the_chart_ships_the_alerts_and_the_dashboard_when_asked() {
    let Some(helm) = helm() else { return };
    let out = template(&helm, REQUIRED);
    assert!(out.status.success(), "{}", stderr(&out));
    let kinds: Vec<String> = documents(&out)
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(!kinds.iter().any(|k| k == "PrometheusRule"), "{kinds:?}");
    assert!(!documents(&out)
        .iter()
        .any(|d| d["metadata"]["name"] == "enim-grafana-dashboard"));

    let values = format!(
        "{REQUIRED}metrics:\n  prometheusRule: {{enabled: true, labels: {{release: prom}}}}\n  \
         grafanaDashboard: {{enabled: true}}\n"
    );
    let out = template(&helm, &values);
    assert!(out.status.success(), "{}", stderr(&out));
    let docs = documents(&out);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/enim/files");
    let rules: Value =
        serde_yaml::from_str(&std::fs::read_to_string(root.join("prometheus-rules.yaml")).unwrap())
            .unwrap();
    let rule = named(&docs, "PrometheusRule", "enim");
    assert_eq!(rule["spec"], rules);
    assert_eq!(rule["metadata"]["labels"]["release"], "prom");
    assert_eq!(rule["metadata"]["namespace"], "enim-system");
    let dashboard = named(&docs, "ConfigMap", "enim-grafana-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: serde_json::Value =
        serde_json::from_str(dashboard["data"]["enim.json"].as_str().unwrap()).unwrap();
    let file: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(shipped, file);

    // A key the schema does not know fails the install.
    let wrong = format!("{REQUIRED}metrics:\n  prometheusRule: {{enable: true}}\n");
    let out = template(&helm, &wrong);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("enable"), "{}", stderr(&out));
}
