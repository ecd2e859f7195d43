//! A real Kubernetes control plane on loopback for tests that need only the
//! API: etcd and kube-apiserver (and, on request, kube-controller-manager,
//! whose garbage collector follows owner references), the upstream v1.34
//! binaries `scripts/cluster/build.sh` builds from Go modules.
//!
//! Each [`ControlPlane`] has its own directory, ports, PKI (the cluster
//! rig's `pki.sh`) and etcd data, and is stopped and removed on drop, pass
//! or fail. The API server runs as the cluster rig's does: Node and RBAC
//! authorisation, NodeRestriction, bound service-account tokens.
//!
//! Where the binaries are: `ENIM_K8S_BIN`, else `build.sh --print-dir`.
//! Missing binaries skip the test with a message, or fail it under CI=true
//! (`.ci/run` builds them before the tests run).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::succeeded;
use crate::ports::{free_port, listens_on};

/// Overrides where the upstream binaries are.
pub const BIN_ENV: &str = "ENIM_K8S_BIN";

/// The service CIDR's first address (the `kubernetes` Service).
const SERVICE_CIDR: &str = "10.96.0.0/16";
const SERVICE_IP: &str = "10.96.0.1";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The directory of the upstream binaries, if they are built.
pub fn bin_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os(BIN_ENV) {
        Some(d) => PathBuf::from(d),
        None => {
            let out = Command::new(workspace_root().join("scripts/cluster/build.sh"))
                .arg("--print-dir")
                .output()
                .ok()?;
            PathBuf::from(String::from_utf8(out.stdout).ok()?.trim())
        }
    };
    ["etcd", "kube-apiserver", "kubectl"]
        .iter()
        .all(|b| dir.join(b).is_file())
        .then_some(dir)
}

/// etcd + kube-apiserver (+ kube-controller-manager, kube-scheduler),
/// killed on drop.
pub struct ControlPlane {
    dir: PathBuf,
    bin: PathBuf,
    etcd_port: u16,
    port: u16,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    controllers: Option<Child>,
    scheduler: Option<Child>,
}

impl ControlPlane {
    /// Starts etcd and the API server and waits until it is ready. `None`
    /// (with a message) when the binaries are not built; a panic instead
    /// under CI=true.
    pub fn start() -> Option<ControlPlane> {
        Self::start_with_etcd_on(free_port())
    }

    /// [`ControlPlane::start`], etcd first tried on `etcd_port`.
    fn start_with_etcd_on(etcd_port: u16) -> Option<ControlPlane> {
        let Some(bin) = bin_dir() else {
            let msg = "the upstream Kubernetes binaries are not built (scripts/cluster/build.sh)";
            assert!(!crate::ci(), "CI=true: {msg}");
            eprintln!("SKIPPED: {msg}");
            return None;
        };
        let dir = std::env::temp_dir().join(crate::unique("enim-apiserver"));
        std::fs::create_dir_all(&dir).expect("control plane dir");
        let mut cp = ControlPlane {
            dir,
            bin,
            etcd_port,
            port: free_port(),
            etcd: None,
            apiserver: None,
            controllers: None,
            scheduler: None,
        };
        cp.make_pki();
        cp.start_etcd_listening();
        cp.start_apiserver();
        Some(cp)
    }

    /// Also runs kube-controller-manager (the garbage collector, the
    /// service-account token controller, and the ServiceCIDR controller,
    /// which lets a deleted ServiceCIDR go once no Service holds an
    /// address in it).
    pub fn with_controllers(mut self) -> ControlPlane {
        let kc = self.pki().join("controller-manager.kubeconfig");
        let mut cmd = Command::new(self.bin.join("kube-controller-manager"));
        cmd.arg(format!("--kubeconfig={}", kc.display()))
            .arg(format!("--authentication-kubeconfig={}", kc.display()))
            .arg(format!("--authorization-kubeconfig={}", kc.display()))
            .arg(format!(
                "--service-account-private-key-file={}",
                self.pki().join("sa.key").display()
            ))
            .arg(format!(
                "--root-ca-file={}",
                self.pki().join("ca.crt").display()
            ))
            .args([
                "--use-service-account-credentials=true",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--profiling=false",
                "--controllers=garbage-collector-controller,serviceaccount-controller,serviceaccount-token-controller,service-cidr-controller",
            ]);
        self.controllers = Some(self.spawn("kube-controller-manager", cmd));
        self
    }

    /// Also runs kube-scheduler (as `system:masters`, no leader
    /// election): pods get nodes and DRA claims get devices from the
    /// ResourceSlices, as in a cluster.
    pub fn with_scheduler(mut self) -> ControlPlane {
        let kc = self.admin_kubeconfig();
        let mut cmd = Command::new(self.bin.join("kube-scheduler"));
        cmd.arg(format!("--kubeconfig={}", kc.display()))
            .arg(format!("--authentication-kubeconfig={}", kc.display()))
            .arg(format!("--authorization-kubeconfig={}", kc.display()))
            .args([
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--profiling=false",
            ]);
        self.scheduler = Some(self.spawn("kube-scheduler", cmd));
        self
    }

    fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }

    /// The API server's URL (loopback).
    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The cluster CA's certificate.
    pub fn ca(&self) -> PathBuf {
        self.pki().join("ca.crt")
    }

    /// A kubeconfig of `system:masters`.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.pki().join("admin.kubeconfig")
    }

    /// The directory of this control plane (logs: `*.log`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn make_pki(&self) {
        let pki = self.pki();
        let script = format!(
            "set -e; . {rig}/pki.sh; pki_make {pki} node 127.0.0.1 {SERVICE_IP}; \
             for n in admin controller-manager; do pki_kubeconfig {pki} $n {server}; done",
            rig = workspace_root().join("scripts/cluster").display(),
            pki = pki.display(),
            server = self.server(),
        );
        crate::sh(&["bash", "-c", &script]);
    }

    fn spawn(&self, name: &str, mut cmd: Command) -> Child {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).expect("log file");
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"))
    }

    /// Starts etcd and waits until it listens on its client port itself.
    /// Should another test's server have taken the port since it was
    /// picked, ours fails to bind while theirs answers there, and our API
    /// server would share their etcd: so a new port is picked and etcd
    /// started again (its port goes only into the API server's flags).
    fn start_etcd_listening(&mut self) {
        for _ in 0..5 {
            self.start_etcd();
            let pid = self.etcd.as_ref().map_or(0, Child::id);
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if listens_on(pid, self.etcd_port) {
                    return;
                }
                if let Some(Ok(Some(_))) = self.etcd.as_mut().map(Child::try_wait) {
                    break; // could not bind, most likely
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!(
                "etcd did not listen on port {}; another port:\n{}",
                self.etcd_port,
                self.log_tail("etcd")
            );
            if let Some(mut c) = self.etcd.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            let _ = std::fs::remove_dir_all(self.dir.join("etcd"));
            self.etcd_port = free_port();
        }
        panic!("etcd never listened on a port of its own");
    }

    fn start_etcd(&mut self) {
        let peer = free_port();
        let client = format!("http://127.0.0.1:{}", self.etcd_port);
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut cmd = Command::new(self.bin.join("etcd"));
        cmd.args(["--name", "e2e", "--unsafe-no-fsync"])
            .arg(format!("--data-dir={}", self.dir.join("etcd").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=e2e={peer_url}"));
        self.etcd = Some(self.spawn("etcd", cmd));
    }

    /// Starts the API server (again, after [`stop_apiserver`]) and waits
    /// until `/readyz` answers.
    ///
    /// [`stop_apiserver`]: ControlPlane::stop_apiserver
    pub fn start_apiserver(&mut self) {
        let p = self.pki();
        let f = |name: &str| p.join(name).display().to_string();
        let mut cmd = Command::new(self.bin.join("kube-apiserver"));
        cmd.arg(format!(
            "--etcd-servers=http://127.0.0.1:{}",
            self.etcd_port
        ))
        .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
        .arg(format!("--secure-port={}", self.port))
        .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
        .arg(format!("--client-ca-file={}", f("ca.crt")))
        .arg(format!("--tls-cert-file={}", f("apiserver.crt")))
        .arg(format!("--tls-private-key-file={}", f("apiserver.key")))
        .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
        .arg(format!("--service-account-key-file={}", f("sa.pub")))
        .arg(format!(
            "--service-account-signing-key-file={}",
            f("sa.key")
        ))
        .args([
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--profiling=false",
            "--endpoint-reconciler-type=none",
        ]);
        self.apiserver = Some(self.spawn("kube-apiserver", cmd));
        self.wait_ready(Duration::from_secs(120));
    }

    /// Kills the API server (etcd keeps the state): what agents see when
    /// the control plane is unreachable.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut c) = self.apiserver.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn wait_ready(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let out = self.kubectl_output(&["get", "--raw", "/readyz"]);
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "kube-apiserver not ready after {limit:?}: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.log_tail("kube-apiserver")
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The last lines of a component's log.
    pub fn log_tail(&self, name: &str) -> String {
        let log = std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// `kubectl ARGS` as admin, whatever its outcome.
    pub fn kubectl_output(&self, args: &[&str]) -> Output {
        Command::new(self.bin.join("kubectl"))
            .arg(format!(
                "--kubeconfig={}",
                self.admin_kubeconfig().display()
            ))
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// `kubectl ARGS` as admin; panics unless it succeeds.
    pub fn kubectl(&self, args: &[&str]) -> String {
        succeeded(args, self.kubectl_output(args))
    }

    /// `kubectl apply -f -` of `yaml`, as admin.
    pub fn apply(&self, yaml: &str) {
        use std::io::Write;
        let mut child = Command::new(self.bin.join("kubectl"))
            .arg(format!(
                "--kubeconfig={}",
                self.admin_kubeconfig().display()
            ))
            .args(["apply", "--server-side", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl apply");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(yaml.as_bytes())
            .expect("write manifest");
        let out = child.wait_with_output().expect("kubectl apply");
        assert!(
            out.status.success(),
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `kubectl apply` of a CustomResourceDefinition's `yaml`, then waits
    /// (60 s at most) until `crd` (`crd/PLURAL.GROUP`) is Established;
    /// panics unless both succeed.
    pub fn apply_crd(&self, yaml: &str, crd: &str) {
        self.apply(yaml);
        self.kubectl(&["wait", "--for=condition=established", "--timeout=60s", crd]);
    }

    /// A kubeconfig that authenticates with `token` (a service account's).
    pub fn token_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let path = self.dir.join(format!("{name}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: {name}}}\ncurrent-context: e2e\n",
            server = self.server(),
            ca = self.ca().display(),
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for child in [
            &mut self.scheduler,
            &mut self.controllers,
            &mut self.apiserver,
            &mut self.etcd,
        ] {
            if let Some(mut c) = child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if std::env::var_os("ENIM_KEEP_APISERVER").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another server holds the port picked for etcd (as when another
    /// test's server takes it after it was picked): ours, unable to bind,
    /// is started again on another port, and the API server works on it.
    #[test]
    fn etcd_moves_off_a_port_another_server_took() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let Some(cp) = ControlPlane::start_with_etcd_on(port) else {
            return;
        };
        assert_ne!(cp.etcd_port, port);
        assert!(listens_on(cp.etcd.as_ref().unwrap().id(), cp.etcd_port));
        let out = cp.kubectl_output(&["get", "namespaces", "-o", "name"]);
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("namespace/default"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
