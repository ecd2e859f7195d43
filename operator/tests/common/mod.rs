//! The rig of the operator's end-to-end tests: a real etcd +
//! kube-apiserver (testkit's ControlPlane) with deploy/'s namespace, CRD,
//! service accounts and RBAC; moto's EC2 behind the fault proxy (testkit's
//! moto Env, one instance); and the real `enim-operator` binary as a
//! process, authenticated with a service-account token of `enim-operator`
//! (so the tests also prove its RBAC is enough) and an IAM user limited to
//! `fleet_iam_actions()`.
//!
//! Without the upstream binaries or moto the tests skip; under CI=true they
//! fail (the rigs' own rule).

#![allow(dead_code)] // Each test file uses a part of the rig.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use enim_crd::{NetResourceSet, FINALIZER};
use enim_provider::cloud::{TAG_CLUSTER, TAG_CREATED_AT};
use enim_provider::fleet::TAG_INTENT;
use enim_provider_aws::client::NetworkInterface;
use enim_provider_aws::{fleet_iam_actions, TAG_MANAGED, TAG_NODE};
use enim_provider_cluster::{ClusterProvider, Mode};
use enim_testkit::apiserver::ControlPlane;
use enim_testkit::moto::{Env, INSTANCE_TYPE, REGION};
use k8s_openapi::api::events::v1::Event;
use kube::Api;

pub const NS: &str = "enim-system";
pub const CLUSTER: &str = "optest";
pub const ZONE: &str = "us-east-1a";

/// Blocking control-plane steps, off the runtime's worker.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn deploy(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The RBAC documents of 50-operator.yaml (its service account, roles and
/// bindings), not its ConfigMap and Deployment: the tests run the binary.
fn operator_rbac() -> String {
    const KINDS: [&str; 5] = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    let docs: Vec<String> = deploy("50-operator.yaml")
        .split("\n---\n")
        .filter(|doc| {
            let v: serde_yaml::Value = serde_yaml::from_str(doc).expect("a YAML document");
            v.get("kind")
                .and_then(|k| k.as_str())
                .is_some_and(|k| KINDS.contains(&k))
        })
        .map(str::to_string)
        .collect();
    assert_eq!(docs.len(), KINDS.len(), "50-operator.yaml's RBAC documents");
    docs.join("\n---\n")
}

/// Two ENIs at least, one free ahead of demand, no free one tolerated
/// above that: m5.xlarge has room for three besides the primary. (A crash
/// in the first create leaves the second's intent unstarted too.)
pub const TWO: Marks = Marks {
    pre: 1,
    min: 2,
    above: 0,
};

/// The pool's watermarks in the operator's config.
#[derive(Debug, Clone, Copy)]
pub struct Marks {
    pub pre: u32,
    pub min: u32,
    pub above: u32,
}

/// The rig: control plane, moto, and what the operator authenticates with.
pub struct Rig {
    // Dropped in this order: the operators (held by tests) first, then the
    // API server, then moto.
    pub cp: ControlPlane,
    pub env: Env,
    pub dir: PathBuf,
    /// The operator's kubeconfig: a token of its service account.
    pub operator_kubeconfig: PathBuf,
    access_key_id: String,
    secret_access_key: String,
    pub admin: kube::Client,
}

impl Rig {
    /// `None` (skipped) without the upstream binaries or moto. With
    /// `controllers`, kube-controller-manager runs too (the garbage
    /// collector), started once the CRD is established so that it knows
    /// NetResourceSets from the start.
    pub async fn start(controllers: bool) -> Option<Rig> {
        let cp = blocking(ControlPlane::start)?;
        let env = Env::start().await?;
        let cp = blocking(|| {
            cp.apply(&deploy("00-namespace.yaml"));
            cp.apply_crd(
                &deploy("05-crd-netresourceset.yaml"),
                "crd/netresourcesets.enim.io",
            );
            for file in ["10-serviceaccount.yaml", "11-rbac-agent.yaml"] {
                cp.apply(&deploy(file));
            }
            cp.apply(&operator_rbac());
            if controllers {
                cp.with_controllers()
            } else {
                cp
            }
        });
        let token = blocking(|| {
            cp.kubectl(&[
                "create",
                "token",
                "enim-operator",
                "-n",
                NS,
                "--duration=2h",
            ])
        });
        let operator_kubeconfig = cp.token_kubeconfig("enim-operator", token.trim());
        let creds = env.iam_user("enim-operator", &fleet_iam_actions()).await;
        let admin = client(&cp.admin_kubeconfig()).await;
        let dir = cp.dir().join("optest");
        std::fs::create_dir_all(&dir).unwrap();
        Some(Rig {
            access_key_id: creds.access_key_id().into(),
            secret_access_key: creds.secret_access_key().into(),
            cp,
            env,
            dir,
            operator_kubeconfig,
            admin,
        })
    }

    /// Writes an operator config file named `name` and returns its path.
    /// Short intervals; the cloud rates out of the way.
    pub fn config(&self, name: &str, marks: Marks, node_grace: &str) -> PathBuf {
        self.config_at(name, marks, node_grace, &self.env.proxy.url, "")
    }

    /// [`Rig::config`] with EC2 at `ec2_endpoint` (another proxy in front
    /// of the rig's moto, to tell one replica's calls from another's) and
    /// `extra` lines in `[operator]`.
    pub fn config_at(
        &self,
        name: &str,
        marks: Marks,
        node_grace: &str,
        ec2_endpoint: &str,
        extra: &str,
    ) -> PathBuf {
        let text = format!(
            r#"[operator]
cluster = "{CLUSTER}"
mode = "primary"
subnets = ["{subnet}"]
resync_interval = "1s"
node_grace = "{node_grace}"
drain_delay = "1s"
{extra}
api = {{ mutating_rate = {{ every = "5ms", burst = 100 }}, read_rate = {{ every = "5ms", burst = 100 }} }}

[operator.watermarks]
pre_allocate = {pre}
min_allocate = {min}
max_above_watermark = {above}

[cloud]
type = "aws"
region = "{REGION}"
detach_timeout = "10s"
credentials = {{ source = "static", access_key_id = "{key}", secret_access_key = "{secret}" }}

[cloud.api]
endpoint = "{endpoint}"
max_attempts = 4
backoff = "20ms"
max_backoff = "200ms"
mutating_rate = {{ every = "1ms", burst = 1000 }}
read_rate = {{ every = "1ms", burst = 1000 }}
"#,
            subnet = self.env.subnet_id,
            pre = marks.pre,
            min = marks.min,
            above = marks.above,
            endpoint = ec2_endpoint,
            key = self.access_key_id,
            secret = self.secret_access_key,
        );
        let path = self.dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// [`Rig::config`] with `tables` (e.g. `[[operator.pools]]`) at the
    /// end of the file.
    pub fn config_with_tables(
        &self,
        name: &str,
        marks: Marks,
        node_grace: &str,
        tables: &str,
    ) -> PathBuf {
        let path = self.config(name, marks, node_grace);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str(tables);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Starts an `enim-operator` process.
    pub fn operator(&self, opts: OperatorOpts<'_>) -> Operator {
        Operator::spawn(self, opts)
    }

    /// Starts an `enim-operator` process and waits (30 s at most) until
    /// it holds the lease.
    pub async fn operator_leading(&self, opts: OperatorOpts<'_>) -> Operator {
        let op = self.operator(opts.clone());
        self.wait_leader(opts.identity).await;
        op
    }

    pub fn sets(&self) -> Api<NetResourceSet> {
        Api::all(self.admin.clone())
    }

    pub async fn set(&self, node: &str) -> Option<NetResourceSet> {
        self.sets()
            .get_opt(node)
            .await
            .expect("read a NetResourceSet")
    }

    /// Creates Node `name` as the kubelet and the cloud controller would
    /// show it: providerID, instance type and zone. Returns its uid.
    pub fn node(&self, name: &str, instance: &str) -> String {
        let labels = [("node.kubernetes.io/instance-type", INSTANCE_TYPE)];
        self.node_labelled(name, instance, &labels)
    }

    /// Creates Node `name` with providerID and zone, and `labels` (the
    /// instance type only if among them). Returns its uid.
    pub fn node_labelled(&self, name: &str, instance: &str, labels: &[(&str, &str)]) -> String {
        let labels: String = labels
            .iter()
            .map(|(k, v)| format!("    {k}: {v}\n"))
            .collect();
        blocking(|| {
            self.cp.apply(&format!(
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n{labels}    topology.kubernetes.io/zone: {ZONE}\nspec:\n  providerID: aws:///{ZONE}/{instance}\n"
            ));
            self.cp
                .kubectl(&["get", "node", name, "-o", "jsonpath={.metadata.uid}"])
        })
    }

    /// The lease's holder, if any.
    pub fn leader(&self) -> String {
        let out = blocking(|| {
            self.cp.kubectl_output(&[
                "get",
                "lease",
                "enim-operator",
                "-n",
                NS,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ])
        });
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Waits (30 s at most) until `identity` holds the lease.
    pub async fn wait_leader(&self, identity: &str) {
        wait_for(
            &format!("{identity} leads"),
            Duration::from_secs(30),
            || async {
                let l = self.leader();
                (l == identity).then_some(()).ok_or(format!("holder {l:?}"))
            },
        )
        .await;
    }

    /// Every ENI in moto tagged for this cluster.
    pub async fn cluster_enis(&self) -> Vec<NetworkInterface> {
        self.env
            .all_enis()
            .await
            .into_iter()
            .filter(|e| e.tag(TAG_CLUSTER) == Some(CLUSTER))
            .collect()
    }

    /// Launches another instance in the rig's subnet (moto); its id.
    pub async fn run_instance(&self) -> String {
        let params: Vec<(String, String)> = [
            ("ImageId", "ami-12c6146b"),
            ("MinCount", "1"),
            ("MaxCount", "1"),
            ("InstanceType", INSTANCE_TYPE),
            ("SubnetId", self.env.subnet_id.as_str()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let xml = self
            .env
            .admin_ec2
            .query()
            .call("RunInstances", &params)
            .await
            .unwrap();
        let start = xml.find("<instanceId>").expect("an instance id") + "<instanceId>".len();
        let end = start + xml[start..].find('<').unwrap();
        xml[start..end].to_string()
    }

    /// Checks that node `node` on `instance` has converged: no intent, the
    /// spec's ENIs are exactly the cluster's ENIs in moto for this
    /// instance, each attached there at the spec's device index, tagged
    /// as enim tags them, none listed twice; `want` ENIs when given.
    pub async fn converged(
        &self,
        node: &str,
        instance: &str,
        want: Option<usize>,
    ) -> Result<Vec<String>, String> {
        let set = self.set(node).await.ok_or("no NetResourceSet")?;
        let spec = &set.spec;
        if !spec.intents.is_empty() {
            return Err(format!("intents left: {:?}", spec.intents));
        }
        if !spec.draining.is_empty() {
            return Err(format!("still draining: {:?}", spec.draining));
        }
        let ids: Vec<String> = spec.enis.iter().map(|e| e.id.clone()).collect();
        let unique: BTreeSet<&String> = ids.iter().collect();
        if unique.len() != ids.len() {
            return Err(format!("an ENI listed twice: {ids:?}"));
        }
        if let Some(n) = want {
            if ids.len() != n {
                return Err(format!("{} ENIs in the spec, want {n}: {ids:?}", ids.len()));
            }
        }
        let in_moto: BTreeMap<String, NetworkInterface> = self
            .cluster_enis()
            .await
            .into_iter()
            .filter(|e| {
                e.tag(TAG_NODE) == Some(instance) || e.attached_instance() == Some(instance)
            })
            .map(|e| (e.network_interface_id.clone(), e))
            .collect();
        let moto_ids: BTreeSet<&String> = in_moto.keys().collect();
        if moto_ids != unique {
            return Err(format!(
                "moto's ENIs {moto_ids:?} differ from the spec's {unique:?}"
            ));
        }
        for e in &spec.enis {
            let m = &in_moto[&e.id];
            if m.attached_instance() != Some(instance) {
                return Err(format!(
                    "{} not attached to {instance}: {:?}",
                    e.id, m.status
                ));
            }
            let ix = m.attachment.as_ref().and_then(|a| a.device_index);
            if ix != e.device_index {
                return Err(format!(
                    "{}: device index {ix:?} in moto, {:?} in the spec",
                    e.id, e.device_index
                ));
            }
            if m.mac_address != e.mac {
                return Err(format!("{}: MAC {} vs {}", e.id, m.mac_address, e.mac));
            }
            for (k, v) in [
                (TAG_MANAGED, "true"),
                (TAG_NODE, instance),
                (TAG_CLUSTER, CLUSTER),
            ] {
                if m.tag(k) != Some(v) {
                    return Err(format!("{}: tag {k} is {:?}", e.id, m.tag(k)));
                }
            }
            if m.tag(TAG_CREATED_AT).is_none() {
                return Err(format!("{}: no {TAG_CREATED_AT} tag", e.id));
            }
        }
        // One ENI per intent token, ever.
        let mut tokens: BTreeMap<&str, usize> = BTreeMap::new();
        for m in in_moto.values() {
            if let Some(t) = m.tag(TAG_INTENT) {
                *tokens.entry(t).or_default() += 1;
            }
        }
        if let Some((t, n)) = tokens.iter().find(|(_, n)| **n > 1) {
            return Err(format!("{n} ENIs for intent {t}"));
        }
        Ok(ids)
    }

    /// Checks the set's owner reference (the Node) and finalizer.
    pub async fn check_ownership(&self, node: &str, uid: &str) {
        let set = self.set(node).await.expect("the set");
        let owners = set.metadata.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.len(), 1, "{owners:?}");
        let o = &owners[0];
        assert_eq!(
            (
                o.api_version.as_str(),
                o.kind.as_str(),
                o.name.as_str(),
                o.uid.as_str()
            ),
            ("v1", "Node", node, uid)
        );
        let finalizers = set.metadata.finalizers.clone().unwrap_or_default();
        assert_eq!(finalizers, [FINALIZER.to_string()]);
    }

    /// An agent for `node`, in process: the `cluster` provider with a
    /// token of `enimd` bound to a pod on the node (as the kubelet gives
    /// it), so deploy/'s admission policy lets it write that node's status.
    pub async fn agent(&self, node: &str) -> ClusterProvider {
        self.agent_serving(node, false).await
    }

    /// [`Rig::agent`] with its DRA driver on, once its status says it
    /// serves claims: the operator makes claims' ENIs only on such nodes.
    /// Needs the node's NetResourceSet (the operator makes it).
    pub async fn dra_agent(&self, node: &str) -> ClusterProvider {
        let agent = self.agent_serving(node, true).await;
        wait_for(
            "the agent's status says it serves claims",
            Duration::from_secs(30),
            || async {
                let set = self.set(node).await.ok_or_else(|| "no set".to_string())?;
                set.status
                    .is_some_and(|s| s.serves_claims())
                    .then_some(())
                    .ok_or_else(|| "not yet".to_string())
            },
        )
        .await;
        agent
    }

    /// [`Rig::agent`], with its DRA driver on or off (`dra`): its status
    /// says whether it serves claims.
    pub async fn agent_serving(&self, node: &str, dra: bool) -> ClusterProvider {
        let pod = format!("enimd-{node}");
        let token = blocking(|| {
            self.cp.apply(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {pod}\n  namespace: {NS}\nspec:\n  nodeName: {node}\n  serviceAccountName: enimd\n  containers:\n  - name: enimd\n    image: enim:0.1.0\n"
            ));
            let uid = self.cp.kubectl(&[
                "get",
                "pod",
                &pod,
                "-n",
                NS,
                "-o",
                "jsonpath={.metadata.uid}",
            ]);
            self.cp.kubectl(&[
                "create",
                "token",
                "enimd",
                "-n",
                NS,
                "--duration=1h",
                "--bound-object-kind=Pod",
                &format!("--bound-object-name={pod}"),
                &format!("--bound-object-uid={uid}"),
            ])
        });
        let kc = self.cp.token_kubeconfig(&pod, token.trim());
        ClusterProvider::with_client(
            client(&kc).await,
            node.to_string(),
            self.dir.join(format!("{node}-cache.json")),
            Mode::Primary,
            Duration::from_millis(200),
            dra,
        )
    }
}

/// A client as `kubeconfig` says (the agent's own way of building one).
pub async fn client(kubeconfig: &Path) -> kube::Client {
    let config = enim_provider_cluster::ClusterConfig {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        ..enim_provider_cluster::ClusterConfig::for_node("unused")
    };
    enim_provider_cluster::client(&config).await.unwrap()
}

/// How to start one operator.
#[derive(Debug, Clone)]
pub struct OperatorOpts<'a> {
    pub identity: &'a str,
    pub config: &'a Path,
    /// `ENIMD_CRASH_AT` (needs the `fault-injection` build).
    pub crash_at: Option<&'a str>,
    /// `--lease-duration`, `--lease-grace` (whole seconds).
    pub lease: (u32, u32),
    /// Its kubeconfig; `None`: the rig's `operator_kubeconfig`.
    pub kubeconfig: Option<&'a Path>,
}

impl<'a> OperatorOpts<'a> {
    pub fn new(identity: &'a str, config: &'a Path) -> Self {
        OperatorOpts {
            identity,
            config,
            crash_at: None,
            lease: (3, 1),
            kubeconfig: None,
        }
    }

    /// [`OperatorOpts::new`] with the deployment's lease (the binary's
    /// defaults, which deploy/ keeps: 10 s, renewed 4 s before it ends),
    /// so that a takeover measured is the one production gets.
    pub fn deployed(identity: &'a str, config: &'a Path) -> Self {
        OperatorOpts {
            lease: (10, 4),
            ..OperatorOpts::new(identity, config)
        }
    }
}

/// An `enim-operator` process, killed on drop.
pub struct Operator {
    pub identity: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    pub exit: Option<(ExitStatus, Instant)>,
}

impl Operator {
    fn spawn(rig: &Rig, opts: OperatorOpts<'_>) -> Operator {
        let stdout = rig.dir.join(format!("{}.out", opts.identity));
        let stderr = rig.dir.join(format!("{}.err", opts.identity));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_enim-operator"));
        cmd.arg("--config")
            .arg(opts.config)
            .args(["--namespace", NS, "--health-addr", "127.0.0.1:0"])
            .arg(format!("--lease-duration={}s", opts.lease.0))
            .arg(format!("--lease-grace={}s", opts.lease.1))
            .env(
                "KUBECONFIG",
                opts.kubeconfig.unwrap_or(&rig.operator_kubeconfig),
            )
            .env("POD_NAME", opts.identity)
            .env("RUST_LOG", "info")
            .env_remove("ENIMD_CRASH_AT")
            .env_remove("ENIMD_DELAY_AT")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap());
        if let Some(point) = opts.crash_at {
            cmd.env("ENIMD_CRASH_AT", point);
        }
        let child = cmd.spawn().expect("start enim-operator");
        Operator {
            identity: opts.identity.to_string(),
            child,
            stdout,
            stderr,
            exit: None,
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// Both logs' last lines, for failure messages.
    pub fn tail(&self) -> String {
        let tail = |s: String| {
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(25)..].join("\n")
        };
        format!(
            "--- {} stdout ---\n{}\n--- stderr ---\n{}",
            self.identity,
            tail(self.stdout()),
            tail(self.stderr())
        )
    }

    /// Whether it has exited (and when it was first seen so).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                self.exit = Some((s, Instant::now()));
            }
        }
        self.exit.map(|(s, _)| s)
    }

    /// Waits (polling every 20 ms) until it exits; panics after `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.exited() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{} still running after {limit:?}\n{}",
                self.identity,
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Asserts it aborted at crash point `point` (SIGABRT, and its stderr
    /// names the point).
    pub async fn assert_crashed_at(&mut self, point: &str, limit: Duration) {
        use std::os::unix::process::ExitStatusExt;
        let status = self.wait_exit(limit).await;
        assert_eq!(
            status.signal(),
            Some(6),
            "{} did not abort: {status:?}\n{}",
            self.identity,
            self.tail()
        );
        let err = self.stderr();
        assert!(
            err.contains(&format!("crash point {point} reached: aborting")),
            "{} aborted elsewhere:\n{}",
            self.identity,
            self.tail()
        );
    }

    /// SIGTERM, then waits for a clean exit (the lease released).
    pub async fn stop(&mut self) {
        if self.exited().is_none() {
            let pid = self.child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
        }
        let s = self.wait_exit(Duration::from_secs(15)).await;
        assert!(
            s.success(),
            "{} stopped with {s:?}\n{}",
            self.identity,
            self.tail()
        );
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls `check` every 100 ms until it gives `Ok`, for at most `limit`;
/// panics with the last error (and `context()`) otherwise.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => {
                panic!("not within {limit:?}: {what}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// How many rigs (each an API server, etcd, moto and operators) the tests
/// of one file run at once. Two: a rig mostly waits (on leases, on its
/// operator's passes, on a crash), so two overlap well on two cores, and
/// more would starve their API servers' start-up.
const RIGS_AT_ONCE: usize = 2;

/// A permit the tests of one file take so that at most [`RIGS_AT_ONCE`]
/// rigs run at a time on a small machine. (A tokio semaphore: held across
/// awaits, and a failed test gives its permit back.)
pub async fn rig_slot() -> tokio::sync::SemaphorePermit<'static> {
    static RIGS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(RIGS_AT_ONCE);
    RIGS.acquire().await.expect("the semaphore is never closed")
}

/// A test's rig, started once [`rig_slot`] lets it: the slot's
/// guard (hold it for the whole test; the rig is dropped before it) and
/// the rig, or `None` where the rig cannot start (the test skips).
pub async fn slotted_rig(
    controllers: bool,
) -> Option<(tokio::sync::SemaphorePermit<'static>, Rig)> {
    let one = rig_slot().await;
    let rig = Rig::start(controllers).await?;
    Some((one, rig))
}

/// DRA: the DeviceClass (deploy/06-deviceclass.yaml) and a pending claim
/// `name` in `default` for an ENI with security group `group`: selected by
/// its attribute, and asked of the operator in the opaque `enim.io`
/// parameters. Returns the claim's uid.
pub fn apply_claim(rig: &Rig, name: &str, group: &str) -> String {
    let class = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/06-deviceclass.yaml");
    let selector = format!(
        "device.attributes[\"sg.enim.io\"].?{}.orValue(false)",
        group.replace('-', "_")
    );
    let claim = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": { "name": name, "namespace": "default" },
        "spec": { "devices": {
            "requests": [{ "name": "eni", "exactly": {
                "deviceClassName": "eni.enim.io",
                "selectors": [{ "cel": { "expression": selector } }],
            } }],
            "config": [{ "requests": ["eni"], "opaque": {
                "driver": "enim.io",
                "parameters": {
                    "apiVersion": "enim.io/v1alpha1",
                    "kind": "EniParameters",
                    "securityGroups": [group],
                },
            } }],
        } },
    });
    blocking(|| {
        rig.cp.apply(&std::fs::read_to_string(&class).unwrap());
        rig.cp.apply(&claim.to_string());
        rig.cp.kubectl(&[
            "get",
            "resourceclaim",
            name,
            "-n",
            "default",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
    })
}

/// `GET path` from an operator's health endpoint: (status line, body).
pub async fn http_get(addr: &str, path: &str) -> Result<(String, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("{addr}: {e}"))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .await
        .map_err(|e| e.to_string())?;
    let (head, body) = out.split_once("\r\n\r\n").ok_or("no body")?;
    Ok((head.lines().next().unwrap_or("").into(), body.into()))
}

/// Where an operator serves /metrics, from its log (it binds port 0).
pub fn health_addr(op: &Operator) -> Option<String> {
    let out = op.stdout();
    let line = out.lines().find(|l| l.contains("serving /healthz"))?;
    let at = line.find("127.0.0.1:")?;
    let rest = &line[at..];
    let end = rest
        .char_indices()
        .skip("127.0.0.1:".len())
        .find(|(_, c)| !c.is_ascii_digit())
        .map_or(rest.len(), |(i, _)| i);
    Some(rest[..end].to_string())
}

/// The events about `kind` `name` with `reason` in `namespace`, as the
/// admin lists them.
pub async fn told(rig: &Rig, namespace: &str, kind: &str, name: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(rig.admin.clone(), namespace);
    let all = api.list(&Default::default()).await.expect("list events");
    all.items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name))
        })
        .collect()
}

/// Waits (30 s at most) for one event about `kind` `name` with `reason`.
pub async fn wait_told(rig: &Rig, namespace: &str, kind: &str, name: &str, reason: &str) -> Event {
    let what = format!("a {reason} event on {kind} {namespace}/{name}");
    wait_for(&what, Duration::from_secs(30), || async {
        told(rig, namespace, kind, name, reason)
            .await
            .into_iter()
            .next()
            .ok_or_else(|| "none yet".to_string())
    })
    .await
}

/// The value of unlabelled metric `name` in `text`.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}
