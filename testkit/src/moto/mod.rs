//! Test rig for the AWS backend, all on loopback: a moto EC2/IAM server
//! (signatures checked), a fake IMDSv2 that serves the instance's
//! interfaces from moto's state, and a fault-injecting proxy in front of
//! moto. Every server is stopped on drop, pass or fail.

mod imds;
mod proxy;

pub use imds::{CardKey, FakeImds, NewInterfaceHook};
pub use proxy::{FaultProxy, Outage};

use std::collections::{HashMap, HashSet};
use std::net::{Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_credential_types::Credentials;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use enim_core::ratelimit::RateLimit;
use enim_provider_aws::client::{Ec2Client, Items, NetworkInterface, QueryClient, RetryPolicy};
use enim_provider_aws::credentials::CredentialsProvider;
use enim_provider_aws::{ApiConfig, AwsConfig, TAG_MANAGED, TAG_NODE};
use ipnet::{Ipv4Net, Ipv6Net};
use serde::Deserialize;
use tokio::task::JoinHandle;

use crate::ports::{free_port, listens_on};

pub const REGION: &str = "us-east-1";
/// A client-side rate no test notices.
pub const FAST: RateLimit = RateLimit::new(Duration::from_micros(10), 1_000_000);
pub const INSTANCE_TYPE: &str = "m5.xlarge";
/// DescribeInstanceTypes in moto: m5.xlarge takes 4 interfaces.
pub const INSTANCE_ENI_LIMIT: usize = 4;

/// moto's server with unique, unreserved IPv4 addresses, as EC2 gives
/// (see the script's header).
const LAUNCHER: &str = include_str!("launch.py");

/// Whether moto can run here. Without it the tests skip with a message,
/// except under CI=true, where a skip would hide a broken setup.
pub fn moto_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import moto.server, flask, flask_cors"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        if crate::ci() {
            panic!("CI=true but moto is not installed: python3 -m pip install 'moto[server]'");
        }
        eprintln!("SKIPPED: moto is not installed (python3 -m pip install 'moto[server]')");
    }
    ok
}

/// A moto server process, killed on drop.
pub struct Moto {
    child: Child,
    pub url: String,
    log: PathBuf,
}

impl Moto {
    pub async fn start() -> Moto {
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        for _ in 0..5 {
            let port = free_port();
            let log =
                std::env::temp_dir().join(format!("enim-moto-{}-{port}.log", std::process::id()));
            let out = std::fs::File::create(&log).unwrap();
            let child = Command::new("python3")
                .args(["-c", LAUNCHER, "-H", "127.0.0.1", "-p", &port.to_string()])
                // Check signatures from the first request on.
                .env("INITIAL_NO_AUTH_ACTION_COUNT", "0")
                .env("PYTHONUNBUFFERED", "1")
                .stdin(Stdio::null())
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .spawn()
                .expect("spawning moto's server (python3)");
            let mut moto = Moto {
                child,
                url: format!("http://127.0.0.1:{port}"),
                log,
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = moto.child.try_wait() {
                    break; // port taken, most likely: try another
                }
                if let Ok(r) = http
                    .get(format!("{}/moto-api/data.json", moto.url))
                    .send()
                    .await
                {
                    if r.status().is_success() {
                        if listens_on(moto.child.id(), port) {
                            return moto;
                        }
                        // Another test's moto took the port between
                        // `free_port` and ours binding it (ours would fail
                        // to bind and exit): try another.
                        let _ = moto.child.kill();
                        let _ = moto.child.wait();
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            eprintln!("moto did not come up on port {port}:\n{}", moto.log_tail());
        }
        panic!("could not start moto");
    }

    pub fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Turns signature checking off (`None`) or on after `n` more actions.
    pub async fn set_auth_after(&self, n: Option<u32>) {
        let body = n.map_or("inf".to_string(), |n| n.to_string());
        let r = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(format!("{}/moto-api/reset-auth", self.url))
            .header("content-type", "text/plain")
            .body(body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "reset-auth: {}", r.status());
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

#[derive(Deserialize)]
struct CreateAccessKeyResponse {
    #[serde(rename = "CreateAccessKeyResult")]
    result: CreateAccessKeyResult,
}
#[derive(Deserialize)]
struct CreateAccessKeyResult {
    #[serde(rename = "AccessKey")]
    key: AccessKey,
}
#[derive(Deserialize)]
struct AccessKey {
    #[serde(rename = "AccessKeyId")]
    id: String,
    #[serde(rename = "SecretAccessKey")]
    secret: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateVpcResponse {
    vpc: Vpc,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Vpc {
    vpc_id: String,
    #[serde(default)]
    ipv6_cidr_block_association_set: Items<Ipv6Assoc>,
}
#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
struct Ipv6Assoc {
    ipv6_cidr_block: String,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DescribeSubnetsResponse {
    subnet_set: Items<Subnet>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateSubnetResponse {
    subnet: Subnet,
}
#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Subnet {
    pub subnet_id: String,
    pub cidr_block: String,
    #[serde(default)]
    ipv6_cidr_block_association_set: Items<Ipv6Assoc>,
}
impl Subnet {
    fn ipv6(&self) -> Option<String> {
        self.ipv6_cidr_block_association_set
            .item
            .first()
            .map(|a| a.ipv6_cidr_block.clone())
    }
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RunInstancesResponse {
    instances_set: Items<Instance>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Instance {
    instance_id: String,
    network_interface_set: Items<PrimaryNic>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PrimaryNic {
    network_interface_id: String,
}

fn xml<T: for<'de> Deserialize<'de>>(s: &str) -> T {
    quick_xml::de::from_str(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}

fn p(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn fixed(creds: &Credentials) -> Arc<CredentialsProvider> {
    Arc::new(CredentialsProvider::fixed(creds.clone()))
}

/// moto, an instance in a dual-stack subnet, the fake IMDS and the proxy.
pub struct Env {
    pub moto: Moto,
    /// Full EC2 rights, for the rig itself.
    pub admin: Credentials,
    /// Only the actions enim documents it needs.
    pub node: Credentials,
    pub admin_ec2: Ec2Client,
    pub iam: QueryClient,
    pub vpc_id: String,
    /// The VPC's IPv6 block (the rig's subnet has its second /64).
    pub vpc_v6: Ipv6Net,
    pub subnet_id: String,
    pub subnet_v4: Ipv4Net,
    pub subnet_v6: Ipv6Net,
    pub instance_id: String,
    pub primary_eni: String,
    pub imds: FakeImds,
    pub proxy: FaultProxy,
}

impl Env {
    /// `None` when moto is not installed (and CI is not set).
    pub async fn start() -> Option<Env> {
        if !moto_available() {
            return None;
        }
        let moto = Moto::start().await;

        // IAM users first, with checks off; then checks on for good.
        moto.set_auth_after(None).await;
        let bootstrap = Credentials::new("AKIABOOTSTRAP", "bootstrap", None, None, "test");
        let iam = QueryClient::new(
            &moto.url,
            REGION,
            "iam",
            "2010-05-08",
            fixed(&bootstrap),
            RetryPolicy::default(),
        )
        .unwrap();
        let admin = iam_user(&iam, "enim-admin", &["ec2:*", "iam:*"]).await;
        let node = iam_user(&iam, "enim-node", enim_provider_aws::REQUIRED_IAM_ACTIONS).await;
        moto.set_auth_after(Some(0)).await;

        let admin_ec2 =
            Ec2Client::new(&moto.url, REGION, fixed(&admin), RetryPolicy::default()).unwrap();
        let iam = QueryClient::new(
            &moto.url,
            REGION,
            "iam",
            "2010-05-08",
            fixed(&admin),
            RetryPolicy::default(),
        )
        .unwrap();
        let q = admin_ec2.query();
        let vpc: CreateVpcResponse = xml(&q
            .call(
                "CreateVpc",
                &p(&[
                    ("CidrBlock", "10.0.0.0/16"),
                    ("AmazonProvidedIpv6CidrBlock", "true"),
                ]),
            )
            .await
            .unwrap());
        let vpc_v6: Ipv6Net = vpc.vpc.ipv6_cidr_block_association_set.item[0]
            .ipv6_cidr_block
            .parse()
            .unwrap();
        let subnet_v6 = vpc_v6.subnets(64).unwrap().nth(1).unwrap();
        let subnet = create_subnet(&admin_ec2, &vpc.vpc.vpc_id, "10.0.1.0/24", subnet_v6).await;
        let (instance_id, primary_eni) = run_instance(&admin_ec2, &subnet.subnet_id).await;

        let imds = FakeImds::start(
            Ec2Client::new(&moto.url, REGION, fixed(&admin), RetryPolicy::default()).unwrap(),
            instance_id.clone(),
        )
        .await;
        let proxy = FaultProxy::start(&moto.url).await;
        Some(Env {
            admin,
            node,
            admin_ec2,
            iam,
            vpc_id: vpc.vpc.vpc_id,
            vpc_v6,
            subnet_id: subnet.subnet_id,
            subnet_v4: "10.0.1.0/24".parse().unwrap(),
            subnet_v6,
            instance_id,
            primary_eni,
            imds,
            proxy,
            moto,
        })
    }

    /// A backend config pointing at the proxy and the fake IMDS, with
    /// short waits so failures show quickly.
    pub fn config(&self) -> AwsConfig {
        AwsConfig {
            imds_endpoint: self.imds.url.clone(),
            metadata_wait: Duration::from_secs(10),
            detach_timeout: Duration::from_secs(10),
            api: self.api(),
            ..AwsConfig::default()
        }
    }

    /// EC2 through the proxy, with short retries; the buckets out of the
    /// way (the tests of the buckets set their own).
    pub fn api(&self) -> ApiConfig {
        ApiConfig {
            endpoint: Some(self.proxy.url.clone()),
            max_attempts: 4,
            backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(200),
            mutating_rate: FAST,
            read_rate: FAST,
        }
    }

    /// A new IAM user allowed exactly `actions`.
    pub async fn iam_user(&self, name: &str, actions: &[&str]) -> Credentials {
        iam_user(&self.iam, name, actions).await
    }

    /// A new IAM role trusted for web identities (IRSA), allowed exactly
    /// `actions`; its ARN.
    pub async fn iam_role(&self, name: &str, actions: &[&str]) -> String {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct R {
            create_role_result: CreateRoleResult,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct CreateRoleResult {
            role: Role,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Role {
            arn: String,
        }
        let trust = serde_json::json!({
            "Version": "2012-10-17",
            "Statement": [{
                "Effect": "Allow",
                "Principal": {"Federated": "arn:aws:iam::123456789012:oidc-provider/kubernetes.default.svc"},
                "Action": "sts:AssumeRoleWithWebIdentity",
            }],
        });
        let created: R = xml(&self
            .iam
            .call(
                "CreateRole",
                &p(&[
                    ("RoleName", name),
                    ("AssumeRolePolicyDocument", &trust.to_string()),
                ]),
            )
            .await
            .unwrap());
        put_policy(&self.iam, "PutRolePolicy", ("RoleName", name), actions).await;
        created.create_role_result.role.arn
    }

    /// Every ENI moto holds (the rig's view, not through the proxy).
    pub async fn all_enis(&self) -> Vec<NetworkInterface> {
        self.admin_ec2
            .describe_network_interfaces(&[])
            .await
            .unwrap()
    }

    /// The ENI `id` as moto holds it; panics when there is none.
    pub async fn eni(&self, id: &str) -> NetworkInterface {
        self.all_enis()
            .await
            .into_iter()
            .find(|e| e.network_interface_id == id)
            .unwrap_or_else(|| panic!("no ENI {id} in moto"))
    }

    /// ENIs tagged for this node.
    pub async fn tagged_ids(&self) -> HashSet<String> {
        self.all_enis()
            .await
            .into_iter()
            .filter(|e| {
                e.tag(TAG_NODE) == Some(&self.instance_id) && e.tag(TAG_MANAGED) == Some("true")
            })
            .map(|e| e.network_interface_id)
            .collect()
    }

    /// ENIs attached to the instance, by id, with their device index.
    pub async fn attached(&self) -> HashMap<String, u32> {
        self.all_enis()
            .await
            .into_iter()
            .filter(|e| e.attached_instance() == Some(&self.instance_id))
            .map(|e| {
                let idx = e.attachment.as_ref().and_then(|a| a.device_index).unwrap();
                (e.network_interface_id, idx)
            })
            .collect()
    }

    /// A new security group in the rig's VPC; its id.
    pub async fn create_security_group(&self, name: &str) -> String {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct R {
            group_id: String,
        }
        let r: R = xml(&self
            .admin_ec2
            .query()
            .call(
                "CreateSecurityGroup",
                &p(&[
                    ("GroupName", name),
                    ("GroupDescription", "enim test"),
                    ("VpcId", &self.vpc_id),
                ]),
            )
            .await
            .unwrap());
        r.group_id
    }

    /// Gives the instance's primary interface exactly `groups` (as the
    /// node's own security groups): what ENIs made with no configured
    /// groups take.
    pub async fn set_primary_groups(&self, groups: &[&str]) {
        let mut params = vec![("NetworkInterfaceId", self.primary_eni.as_str())];
        let keys: Vec<String> = (1..=groups.len())
            .map(|i| format!("SecurityGroupId.{i}"))
            .collect();
        params.extend(keys.iter().map(String::as_str).zip(groups.iter().copied()));
        self.admin_ec2
            .query()
            .call("ModifyNetworkInterfaceAttribute", &p(&params))
            .await
            .unwrap();
    }

    /// Creates an ENI as enim would (tagged for this node) without attaching
    /// it: what a crash between create and attach leaves behind.
    pub async fn create_tagged_eni(&self) -> NetworkInterface {
        self.create_eni_with_tags(&[(TAG_MANAGED, "true"), (TAG_NODE, &self.instance_id)])
            .await
    }

    /// Creates an unattached ENI with exactly `tags` (none: untagged), as
    /// any node of any cluster, or someone by hand, may have left it.
    pub async fn create_eni_with_tags(&self, tags: &[(&str, &str)]) -> NetworkInterface {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct R {
            network_interface: NetworkInterface,
        }
        let mut params = vec![("SubnetId".to_string(), self.subnet_id.clone())];
        if !tags.is_empty() {
            params.push((
                "TagSpecification.1.ResourceType".into(),
                "network-interface".into(),
            ));
        }
        for (i, (k, v)) in tags.iter().enumerate() {
            params.push((
                format!("TagSpecification.1.Tag.{}.Key", i + 1),
                k.to_string(),
            ));
            params.push((
                format!("TagSpecification.1.Tag.{}.Value", i + 1),
                v.to_string(),
            ));
        }
        let r: R = xml(&self
            .admin_ec2
            .query()
            .call("CreateNetworkInterface", &params)
            .await
            .unwrap());
        r.network_interface
    }

    /// A new subnet of the rig's VPC: `v4` (a CIDR inside 10.0.0.0/16) and
    /// the IPv6 block `v6` (a /64 of [`Env::vpc_v6`]).
    pub async fn create_subnet(&self, v4: &str, v6: Ipv6Net) -> Subnet {
        create_subnet(&self.admin_ec2, &self.vpc_id, v4, v6).await
    }

    /// Runs one more instance in `subnet_id`: its id and its primary ENI's.
    pub async fn run_instance(&self, subnet_id: &str) -> (String, String) {
        run_instance(&self.admin_ec2, subnet_id).await
    }

    /// Attaches `eni_id` to the rig's instance at `device_index` (as the
    /// rig's admin, not through enim).
    pub async fn attach_as_admin(&self, eni_id: &str, device_index: u32) {
        self.admin_ec2
            .attach_network_interface(eni_id, &self.instance_id, device_index, 0)
            .await
            .unwrap();
    }
}

async fn create_subnet(ec2: &Ec2Client, vpc_id: &str, v4: &str, v6: Ipv6Net) -> Subnet {
    let r: CreateSubnetResponse = xml(&ec2
        .query()
        .call(
            "CreateSubnet",
            &p(&[
                ("VpcId", vpc_id),
                ("CidrBlock", v4),
                ("Ipv6CidrBlock", &v6.to_string()),
                ("AvailabilityZone", "us-east-1a"),
            ]),
        )
        .await
        .unwrap());
    r.subnet
}

async fn run_instance(ec2: &Ec2Client, subnet_id: &str) -> (String, String) {
    let run: RunInstancesResponse = xml(&ec2
        .query()
        .call(
            "RunInstances",
            &p(&[
                ("ImageId", "ami-12c6146b"),
                ("MinCount", "1"),
                ("MaxCount", "1"),
                ("InstanceType", INSTANCE_TYPE),
                ("SubnetId", subnet_id),
            ]),
        )
        .await
        .unwrap());
    let instance = &run.instances_set.item[0];
    (
        instance.instance_id.clone(),
        instance.network_interface_set.item[0]
            .network_interface_id
            .clone(),
    )
}

async fn iam_user(iam: &QueryClient, name: &str, actions: &[&str]) -> Credentials {
    iam.call("CreateUser", &p(&[("UserName", name)]))
        .await
        .unwrap();
    let key: CreateAccessKeyResponse = xml(&iam
        .call("CreateAccessKey", &p(&[("UserName", name)]))
        .await
        .unwrap());
    put_policy(iam, "PutUserPolicy", ("UserName", name), actions).await;
    Credentials::new(key.result.key.id, key.result.key.secret, None, None, "test")
}

/// `action` (PutUserPolicy, PutRolePolicy) of a policy allowing exactly
/// `actions` to `whom` (its key and name).
async fn put_policy(iam: &QueryClient, action: &str, whom: (&str, &str), actions: &[&str]) {
    let policy = serde_json::json!({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}],
    });
    iam.call(
        action,
        &p(&[
            whom,
            ("PolicyName", "enim"),
            ("PolicyDocument", &policy.to_string()),
        ]),
    )
    .await
    .unwrap();
}

/// A loopback fake (the IMDS, the fault proxy): its URL, the state its
/// handler serves from, and its server, stopped on drop (pass or fail).
pub struct Fake<S> {
    pub url: String,
    state: Arc<S>,
    server: JoinHandle<()>,
}

impl<S> Drop for Fake<S> {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl<S: Send + Sync + 'static> Fake<S> {
    /// Serves `handler` over `state` on a free loopback port, every
    /// request to it.
    async fn serve<H, T>(state: S, handler: H) -> Fake<S>
    where
        H: axum::handler::Handler<T, Arc<S>>,
        T: 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        Fake::serve_on(listener, state, handler)
    }

    /// Serves `handler` over `state` on `listener` (bound wherever the
    /// caller chose, another namespace included). Handlers may extract the
    /// caller's address (`ConnectInfo<SocketAddr>`).
    fn serve_on<H, T>(listener: tokio::net::TcpListener, state: S, handler: H) -> Fake<S>
    where
        H: axum::handler::Handler<T, Arc<S>>,
        T: 'static,
    {
        let state = Arc::new(state);
        let router = axum::Router::new()
            .fallback(handler)
            .with_state(state.clone());
        let addr: SocketAddr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let service = router.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, service).await.unwrap();
        });
        Fake {
            url: format!("http://{addr}"),
            state,
            server,
        }
    }
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (status, [("content-type", "text/plain")], body.into()).into_response()
}

fn not_found() -> Response {
    text(StatusCode::NOT_FOUND, "<html>404 - Not Found</html>")
}

/// Polls `f` until it is true, at most `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    crate::cloud::poll_until(within, Duration::from_millis(50), || {
        let done = f();
        async move {
            if done.await {
                Ok(())
            } else {
                Err(format!("timed out waiting for {what}"))
            }
        }
    })
    .await
}

pub fn ipv6_in(net: Ipv6Net, a: Ipv6Addr) -> bool {
    net.contains(&a)
}
