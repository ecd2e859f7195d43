//! EniPolicy admission against the real kube-apiserver: the operator's
//! webhook runs in this process on 127.0.0.1 with its self-made
//! certificate, and a MutatingWebhookConfiguration points the API server
//! at it by URL. The pods are only created (no scheduler, no nodes): what
//! is checked is what the API server stores.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use enim_crd::{EniPolicy, EniPolicySpec, Mode};
use enim_operator::index::PoolPolicy;
use enim_operator::policy::certs::{self, CertResolver, Pem};
use enim_operator::policy::claims;
use enim_operator::policy::keeper::{self, Keeper};
use enim_operator::policy::status;
use enim_operator::policy::webhook::{self, ClusterView};
use enim_operator::policy::DefaultPolicy;
use enim_testkit::apiserver::ControlPlane;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The API server with the EniPolicy CRD, and an admin client.
async fn control_plane() -> Option<(ControlPlane, Client)> {
    let cp = blocking(ControlPlane::start)?;
    blocking(|| {
        cp.apply_crd(
            &enim_crd::policy::policy_crd_yaml(),
            "crd/enipolicies.enim.io",
        )
    });
    let kubeconfig = kube::config::Kubeconfig::read_from(cp.admin_kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();
    Some((cp, client))
}

/// One webhook server, stopped when dropped.
struct Server {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    /// Each review's time, as the operator's metric has it.
    metrics: webhook::WebhookMetrics,
}

impl Server {
    async fn start(
        addr: SocketAddr,
        resolver: &Arc<CertResolver>,
        client: &Client,
        default: DefaultPolicy,
    ) -> Server {
        let listener = TcpListener::bind(addr).await.unwrap();
        let (view, watches) = ClusterView::watch(client.clone(), default, pools())
            .await
            .unwrap();
        let (stop, stopped) = watch::channel(false);
        let tls = Arc::new(resolver.server_config());
        let metrics = webhook::WebhookMetrics::new();
        let observed = metrics.clone();
        let task = tokio::spawn(async move {
            webhook::serve(listener, tls, view, metrics, stopped)
                .await
                .unwrap();
            watches.abort();
        });
        Server {
            stop,
            task,
            metrics: observed,
        }
    }

    async fn stop(self) {
        self.stop.send_replace(true);
        self.task.await.unwrap();
    }
}

/// The operator's node pools the webhook knows: a primary pool, and a
/// secondary one whose ENIs carry `sg-web`, on the label `enim.io/pool`.
fn pools() -> Arc<[PoolPolicy]> {
    let pool = |name: &str, mode, groups: &[&str]| PoolPolicy {
        name: name.into(),
        node_selector: [("enim.io/pool".to_string(), name.to_string())].into(),
        mode,
        subnets: vec!["subnet-1".into()],
        security_groups: groups.iter().map(|g| g.to_string()).collect(),
        ..PoolPolicy::default()
    };
    [
        pool("big", Mode::Primary, &["sg-1"]),
        pool("web", Mode::Secondary, &["sg-web"]),
    ]
    .into()
}

/// The webhook's registration as the chart writes it, but by URL; no CA:
/// an empty caBundle, as the chart leaves it for the operator.
async fn register(client: &Client, port: u16, ca: Option<&Pem>) {
    let url = format!("https://127.0.0.1:{port}{}", webhook::PATH);
    let config = enim_operator::testing::webhook_by_url(&url, ca.map(|ca| ca.cert.as_bytes()));
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
}

/// A namespace with these labels and its default ServiceAccount (no
/// controller manager makes it here, and pods need it).
async fn namespace(client: &Client, name: &str, labels: serde_json::Value) {
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), name)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
}

fn policy(name: &str, mode: Mode, priority: i32, team: &str) -> EniPolicy {
    EniPolicy::new(
        name,
        EniPolicySpec {
            namespace_selector: Some(LabelSelector {
                match_labels: Some([("team".to_string(), team.to_string())].into()),
                match_expressions: None,
            }),
            mode,
            priority,
            ..EniPolicySpec::default()
        },
    )
}

fn pod(name: &str, resources: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": resources}]},
    }))
    .unwrap()
}

/// What the API server returns for a created pod: its policy annotation and
/// the first container's resources.
fn outcome(p: &Pod) -> (Option<String>, serde_json::Value) {
    let c = &p.spec.as_ref().unwrap().containers[0];
    (
        p.annotations().get("enim.io/policy").cloned(),
        serde_json::to_value(&c.resources).unwrap(),
    )
}

/// Dry-run creates until the webhook's watches show `annotation` (they
/// follow the API server a moment behind), then the real create.
async fn create_expecting(pods: &Api<Pod>, p: &Pod, annotation: &str) -> Pod {
    let deadline = Instant::now() + Duration::from_secs(20);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    loop {
        let seen = pods.create(&dry, p).await.map(|p| outcome(&p).0);
        if seen.as_ref().ok().and_then(|s| s.as_deref()) == Some(annotation) {
            break;
        }
        assert!(Instant::now() < deadline, "never {annotation}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pods.create(&PostParams::default(), p).await.unwrap()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentiles(mut v: Vec<Duration>) -> String {
    v.sort();
    // The nearest rank below, in whole percents.
    let at = |percent: usize| ms(v[(v.len() - 1) * percent / 100]);
    format!(
        "p50 {:.1} ms, p99 {:.1} ms over {}",
        at(50),
        at(99),
        v.len()
    )
}

/// A control plane with the namespace team-a (labelled team=a) and the
/// policy "fast" (whole ENIs) that selects it.
async fn with_fast_policy() -> Option<(ControlPlane, Client)> {
    let (cp, client) = control_plane().await?;
    namespace(&client, "team-a", json!({"team": "a"})).await;
    Api::<EniPolicy>::all(client.clone())
        .create(
            &PostParams::default(),
            &policy("fast", Mode::Primary, 0, "a"),
        )
        .await
        .unwrap();
    Some((cp, client))
}

/// A port of 127.0.0.1 free a moment ago.
async fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A webhook with a new CA's certificate for 127.0.0.1, valid for
/// `lifetime`, registered with that CA.
struct Registered {
    ca: Pem,
    resolver: Arc<CertResolver>,
    addr: SocketAddr,
    server: Server,
}

async fn serve_registered(client: &Client, lifetime: Duration) -> Registered {
    let ca = certs::new_ca().unwrap();
    let serving = certs::new_serving(&ca, &["127.0.0.1".into()], lifetime).unwrap();
    let resolver = Arc::new(CertResolver::new(&serving).unwrap());
    let addr = free_addr().await;
    let server = Server::start(addr, &resolver, client, DefaultPolicy::None).await;
    register(client, addr.port(), Some(&ca)).await;
    Registered {
        ca,
        resolver,
        addr,
        server,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_pick_the_network_of_new_pods_and_the_webhook_fails_closed() {
    let Some((_cp, client)) = with_fast_policy().await else {
        return;
    };
    namespace(&client, "other", json!({})).await;
    namespace(
        &client,
        "quiet",
        json!({"team": "a", "enim.io/admission": "ignore"}),
    )
    .await;
    let policies = Api::<EniPolicy>::all(client.clone());
    let Registered {
        resolver,
        addr,
        server,
        ..
    } = serve_registered(&client, Duration::from_secs(3600)).await;
    let team_a = Api::<Pod>::namespaced(client.clone(), "team-a");
    let other = Api::<Pod>::namespaced(client.clone(), "other");

    // A namespace a policy selects: the whole ENI, in limits and requests.
    let created = create_expecting(&team_a, &pod("p1", json!({})), "fast").await;
    let (_, r) = outcome(&created);
    assert_eq!(r["limits"]["enim.io/eni"], "1", "{r}");
    assert_eq!(r["requests"]["enim.io/eni"], "1", "{r}");

    // Two policies: the higher priority wins; deleted, the other again.
    policies
        .create(
            &PostParams::default(),
            &policy("wide", Mode::Secondary, 5, "a"),
        )
        .await
        .unwrap();
    let created = create_expecting(&team_a, &pod("p2", json!({})), "wide").await;
    assert_eq!(outcome(&created).1["limits"]["enim.io/ip"], "1");
    assert!(outcome(&created).1["limits"].get("enim.io/eni").is_none());
    policies
        .delete("wide", &DeleteParams::default())
        .await
        .unwrap();
    let created = create_expecting(&team_a, &pod("p3", json!({})), "fast").await;
    assert_eq!(outcome(&created).1["requests"]["enim.io/eni"], "1");

    // warmEnis without securityGroups: the API server refuses it, saying why.
    let mut warm = policy("warm", Mode::Primary, 0, "none");
    warm.spec.warm_enis = 2;
    let refused = policies
        .create(&PostParams::default(), &warm)
        .await
        .expect_err("warmEnis needs securityGroups");
    assert!(
        refused.to_string().contains("warmEnis keeps ENIs"),
        "{refused}"
    );
    warm.spec.security_groups = vec!["sg-db".into()];
    policies
        .create(&PostParams::default(), &warm)
        .await
        .expect("with groups it is taken");
    policies
        .delete("warm", &DeleteParams::default())
        .await
        .unwrap();

    // No policy selects, default "none": annotated, resources untouched.
    let created = create_expecting(&other, &pod("p4", json!({})), "(default)").await;
    assert_eq!(outcome(&created).1, json!({}));

    // A pod that asks itself: as it asked.
    let asks = json!({"limits": {"enim.io/ip": "1"}, "requests": {"enim.io/ip": "1"}});
    let created = create_expecting(&team_a, &pod("p5", asks.clone()), "(explicit)").await;
    assert_eq!(outcome(&created).1, asks);

    // A policy naming security groups in secondary mode that a secondary
    // pool's ENIs carry: the address, and a node affinity to that pool's
    // nodes the API server takes. ANDed with the pod's own.
    let mut steered = policy("steered", Mode::Secondary, 10, "a");
    steered.spec.security_groups = vec!["sg-web".into()];
    policies
        .create(&PostParams::default(), &steered)
        .await
        .unwrap();
    let mut own = pod("p-steered", json!({}));
    own.spec.as_mut().unwrap().affinity = Some(
        serde_json::from_value(json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
        }}}))
        .unwrap(),
    );
    let created = create_expecting(&team_a, &own, "steered").await;
    assert_eq!(
        outcome(&created).1,
        json!({"limits": {"enim.io/ip": "1"}, "requests": {"enim.io/ip": "1"}})
    );
    assert_eq!(
        serde_json::to_value(&created.spec.as_ref().unwrap().affinity).unwrap(),
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]},
                {"key": "enim.io/pool", "operator": "In", "values": ["web"]},
            ]}]
        }}})
    );
    policies
        .delete("steered", &DeleteParams::default())
        .await
        .unwrap();

    // One naming groups no secondary pool has: refused, and the message
    // names it.
    let mut isolated = policy("isolated", Mode::Secondary, 10, "a");
    isolated.spec.security_groups = vec!["sg-1".into()];
    policies
        .create(&PostParams::default(), &isolated)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let refusal = loop {
        match team_a
            .create(&PostParams::default(), &pod("p6", json!({})))
            .await
        {
            Err(kube::Error::Api(e)) => break e,
            Ok(p) => {
                assert_eq!(outcome(&p).0.as_deref(), Some("fast"));
                team_a.delete("p6", &DeleteParams::default()).await.unwrap();
            }
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        refusal.message.contains("EniPolicy isolated")
            && refusal.message.contains("no node pool of the operator in secondary mode has exactly its security groups [sg-1]"),
        "{refusal:?}"
    );
    // The leader's status: the policy says it is not served yet, and why.
    let (view, watches) = ClusterView::watch(client.clone(), DefaultPolicy::None, pools())
        .await
        .unwrap();
    let (_leader_tx, leader) = watch::channel(true);
    let (stop_status, stopped) = watch::channel(false);
    let judging = tokio::spawn(status::run(
        client.clone(),
        view,
        Default::default(),
        leader,
        stopped,
    ));
    let ready = |p: &EniPolicy| {
        let s = p.status.as_ref()?;
        let c = s.conditions.iter().find(|c| c.type_ == "Ready")?;
        Some((
            c.status.clone(),
            c.reason.clone(),
            c.message.clone(),
            s.observed_generation,
        ))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let (isolated_ready, fast_ready) = loop {
        let i = ready(&policies.get("isolated").await.unwrap());
        let f = ready(&policies.get("fast").await.unwrap());
        if let (Some(i), Some(f)) = (i, f) {
            break (i, f);
        }
        assert!(Instant::now() < deadline, "no Ready conditions written");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        (
            isolated_ready.0.as_str(),
            isolated_ready.1.as_str(),
            isolated_ready.3
        ),
        ("False", "NotServedYet", Some(1)),
        "{isolated_ready:?}"
    );
    assert!(
        isolated_ready
            .2
            .contains("the secondary pools: web [sg-web]"),
        "{isolated_ready:?}"
    );
    assert_eq!(fast_ready.0, "True", "{fast_ready:?}");
    policies
        .delete("isolated", &DeleteParams::default())
        .await
        .unwrap();
    create_expecting(&team_a, &pod("p6", json!({})), "fast").await;

    // A policy naming groups in primary mode: its pods get a claim from
    // the template the leader keeps in each namespace it selects (and in
    // no other), asking for exactly its groups.
    let mut db = policy("db", Mode::Primary, 20, "a");
    db.spec.security_groups = vec!["sg-db".into()];
    policies.create(&PostParams::default(), &db).await.unwrap();
    let created = create_expecting(&team_a, &pod("p7", json!({})), "db").await;
    assert_eq!(
        serde_json::to_value(&created.spec.as_ref().unwrap().resource_claims).unwrap(),
        json!([{"name": "enim-eni", "resourceClaimTemplateName": "enim-policy-db"}])
    );
    assert_eq!(
        outcome(&created).1,
        json!({"claims": [{"name": "enim-eni"}]})
    );
    let templates = Api::<ResourceClaimTemplate>::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(20);
    let made = loop {
        let list = templates.list(&Default::default()).await.unwrap().items;
        if !list.is_empty() {
            break list;
        }
        assert!(Instant::now() < deadline, "no claim template made");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let at: Vec<_> = made
        .iter()
        .map(|t| (t.namespace().unwrap(), t.name_any()))
        .collect();
    assert_eq!(at, [("team-a".to_string(), "enim-policy-db".to_string())]);
    let expression = serde_json::to_value(&made[0].spec.spec.devices).unwrap()["requests"][0]
        ["exactly"]["selectors"][0]["cel"]["expression"]
        .clone();
    assert_eq!(
        expression,
        enim_crd::dra::exactly_groups(&db.spec.security_groups).unwrap()
    );
    // Its policy deleted: the template goes (the claims made stay with
    // their pods).
    policies
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !templates
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the claim template stayed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_status.send_replace(true);
    judging.await.unwrap();
    watches.abort();

    // Latency: the create round trip with the webhook and without it; the
    // webhook's metric counts each review it answers, and only those.
    let quiet = Api::<Pod>::namespaced(client.clone(), "quiet");
    let (mut with, mut without) = (Vec::new(), Vec::new());
    let reviewed = server.metrics.reviews.count();
    assert!(reviewed > 0, "the reviews so far are counted");
    let connections = server.metrics.connections.get();
    for i in 0..30 {
        let t = Instant::now();
        team_a
            .create(&PostParams::default(), &pod(&format!("l{i}"), json!({})))
            .await
            .unwrap();
        with.push(t.elapsed());
        let t = Instant::now();
        quiet
            .create(&PostParams::default(), &pod(&format!("l{i}"), json!({})))
            .await
            .unwrap();
        without.push(t.elapsed());
    }
    assert_eq!(
        server.metrics.reviews.count(),
        reviewed + 30,
        "one review per creation in scope"
    );
    // Kept alive: 30 reviews one after another take no new handshake each.
    let new_connections = server.metrics.connections.get() - connections;
    assert!(
        new_connections <= 2,
        "{new_connections} new connections for 30 reviews"
    );
    println!(
        "pod create with the webhook: {} (the webhook's own share: {:.2} ms mean)",
        percentiles(with),
        server.metrics.reviews.sum() * 1000.0
            / f64::from(u32::try_from(server.metrics.reviews.count()).unwrap())
    );
    println!("pod create without it:       {}", percentiles(without));

    // Default "secondary": a pod no policy selects gets an address.
    server.stop().await;
    let server = Server::start(addr, &resolver, &client, DefaultPolicy::Secondary).await;
    let created = create_expecting(&other, &pod("p7", json!({})), "(default)").await;
    assert_eq!(outcome(&created).1["requests"]["enim.io/ip"], "1");

    // No replica answers: a pod in scope is refused and not created; one in
    // an ignored namespace is created.
    server.stop().await;
    let e = team_a
        .create(&PostParams::default(), &pod("p8", json!({})))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, kube::Error::Api(s) if s.message.contains("pods.policy.enim.io")),
        "{e}"
    );
    assert!(team_a.get_opt("p8").await.unwrap().is_none());
    let created = quiet
        .create(&PostParams::default(), &pod("p9", json!({})))
        .await
        .unwrap();
    assert_eq!(outcome(&created), (None, json!({})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificate_is_renewed_under_load_without_a_refusal() {
    let Some((_cp, client)) = with_fast_policy().await else {
        return;
    };
    let lifetime = Duration::from_secs(3);
    let names = vec!["127.0.0.1".to_string()];
    let Registered {
        ca,
        resolver,
        server,
        ..
    } = serve_registered(&client, lifetime).await;
    let pods = Api::<Pod>::namespaced(client.clone(), "team-a");
    create_expecting(&pods, &pod("warm", json!({})), "fast").await;

    // Renewal at two thirds of the lifetime (2 s), as the operator does.
    let renewals = Arc::new(AtomicUsize::new(0));
    let renewer = {
        let (resolver, renewals, ca, names) = (
            resolver.clone(),
            renewals.clone(),
            ca.clone(),
            names.clone(),
        );
        tokio::spawn(async move {
            let mut issued = SystemTime::now();
            loop {
                let wait = certs::renew_at(issued, lifetime)
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
                tokio::time::sleep(wait).await;
                resolver
                    .install(&certs::new_serving(&ca, &names, lifetime).unwrap())
                    .unwrap();
                issued = SystemTime::now();
                renewals.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let started = Instant::now();
    let mut times = Vec::new();
    for i in 0..50 {
        let t = Instant::now();
        let created = pods
            .create(&PostParams::default(), &pod(&format!("r{i}"), json!({})))
            .await;
        times.push(t.elapsed());
        let created = created.unwrap_or_else(|e| panic!("pod r{i}: {e}"));
        assert_eq!(outcome(&created).0.as_deref(), Some("fast"));
        // Spread the creates over several renewals.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    renewer.abort();
    let renewed = renewals.load(Ordering::SeqCst);
    println!(
        "50 pods in {:.1} s across {renewed} renewals: {}",
        started.elapsed().as_secs_f64(),
        percentiles(times)
    );
    assert!(renewed >= 3, "only {renewed} renewals");
    server.stop().await;
}

/// The operator's own certificate keeping: the leader makes the CA and
/// serving certificate into the Secret and the caBundle, and renews; a
/// follower, which alone is registered here, serves the leader's
/// certificates and their renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_keeps_the_certificates_and_a_follower_serves_them() {
    let Some((_cp, client)) = with_fast_policy().await else {
        return;
    };
    namespace(&client, "enim-system", json!({})).await;
    let addr = free_addr().await;
    register(&client, addr.port(), None).await;
    let lifetime = Duration::from_secs(3);
    let keeper = Keeper {
        client: client.clone(),
        namespace: "enim-system".into(),
        secret: "enim-operator-webhook".into(),
        webhook_config: "enim-policy".into(),
        names: vec!["127.0.0.1".into()],
        lifetime,
    };
    let (_leads, leader) = watch::channel(true);
    let (_follows, follower) = watch::channel(false);
    let (stop, stopped) = watch::channel(false);
    let period = keeper::check_period(lifetime);
    let mut replicas = Vec::new();
    let mut follower_server = None;
    // The leader first: the follower waits for its Secret.
    for role in [leader, follower] {
        let first = keeper.initial(&role).await.unwrap();
        let resolver = Arc::new(CertResolver::new(&first.serving).unwrap());
        if !*role.borrow() {
            follower_server =
                Some(Server::start(addr, &resolver, &client, DefaultPolicy::None).await);
        }
        replicas.push(tokio::spawn(keeper.clone().run(
            resolver,
            first.serving,
            role,
            stopped.clone(),
            period,
        )));
    }
    let (first, _) = keeper.load().await.unwrap().unwrap();

    let pods = Api::<Pod>::namespaced(client.clone(), "team-a");
    create_expecting(&pods, &pod("warm", json!({})), "fast").await;
    for i in 0..40 {
        let created = pods
            .create(&PostParams::default(), &pod(&format!("k{i}"), json!({})))
            .await
            .unwrap_or_else(|e| panic!("pod k{i}: {e}"));
        assert_eq!(outcome(&created).0.as_deref(), Some("fast"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (last, _) = keeper.load().await.unwrap().unwrap();
    assert_eq!(last.ca, first.ca, "the CA is kept");
    assert_ne!(
        last.serving, first.serving,
        "the serving certificate was renewed"
    );
    assert!(
        last.issued >= first.issued + Duration::from_secs(4),
        "{:?} {:?}",
        first.issued,
        last.issued
    );
    let config = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get("enim-policy")
        .await
        .unwrap();
    let bundle = config.webhooks.unwrap()[0]
        .client_config
        .ca_bundle
        .clone()
        .unwrap();
    assert_eq!(bundle.0, first.ca.cert.as_bytes());
    stop.send_replace(true);
    for r in replicas {
        r.await.unwrap();
    }
    follower_server.unwrap().stop().await;
}

/// The chart's webhook template (templates/55-webhook.yaml), with the
/// release's namespace and port filled in as helm would: its RBAC, Service,
/// MutatingWebhookConfiguration and PodDisruptionBudget.
fn webhook_manifests() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../charts/enim/templates/55-webhook.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let text: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("{{-"))
        .map(|l| {
            l.replace("{{ .Release.Namespace | quote }}", "\"enim-system\"")
                .replace("{{ .Release.Namespace }}", "enim-system")
                .replace("{{ .Values.operator.webhook.port }}", "9471")
                + "\n"
        })
        .collect();
    assert!(!text.contains("{{"), "an unfilled template: {text}");
    text
}

/// With only the chart's RBAC, the operator's service account can keep
/// the certificates, write the caBundle and the policies' status, and
/// watch what the webhook reads; and no other Secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_rbac_is_what_the_webhook_needs() {
    let Some((cp, admin)) = control_plane().await else {
        return;
    };
    namespace(&admin, "enim-system", json!({})).await;
    namespace(&admin, "team-a", json!({"team": "a"})).await;
    blocking(|| {
        cp.kubectl(&[
            "create",
            "serviceaccount",
            "enim-operator",
            "-n",
            "enim-system",
        ]);
        cp.apply(&webhook_manifests());
    });
    let token = blocking(|| cp.kubectl(&["create", "token", "enim-operator", "-n", "enim-system"]));
    let kubeconfig = cp.token_kubeconfig("enim-operator", token.trim());
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let operator = Client::try_from(config).unwrap();
    let mut isolated = policy("isolated", Mode::Primary, 0, "a");
    isolated.spec.subnets = vec![enim_crd::ZoneSubnet {
        zone: "z1".into(),
        subnet_id: "subnet-1".into(),
    }];
    let policies = Api::<EniPolicy>::all(admin.clone());
    policies
        .create(&PostParams::default(), &isolated)
        .await
        .unwrap();

    let keeper = Keeper {
        client: operator.clone(),
        namespace: "enim-system".into(),
        secret: "enim-operator-webhook".into(),
        webhook_config: "enim-operator".into(),
        names: vec!["enim-operator-webhook.enim-system.svc".into()],
        lifetime: Duration::from_secs(3),
    };
    let first = keeper.lead().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let renewed = keeper.lead().await.unwrap();
    assert_ne!(
        renewed.serving, first.serving,
        "renewed with the chart's RBAC"
    );
    let (view, watches) = ClusterView::watch(operator.clone(), DefaultPolicy::None, pools())
        .await
        .unwrap();
    assert_eq!(view.policies().len(), 1);
    assert_eq!(
        status::write_statuses(
            &operator,
            &view.policies(),
            &view.pools,
            &Default::default()
        )
        .await
        .unwrap(),
        1
    );
    // The claim templates of a policy naming groups and a subnet per zone,
    // made (the API server compiles their CEL) and deleted.
    let mut db = policy("db", Mode::Primary, 0, "a");
    db.spec.security_groups = vec!["sg-db".into()];
    db.spec.subnets = vec![enim_crd::ZoneSubnet {
        zone: "z1".into(),
        subnet_id: "subnet-1".into(),
    }];
    let namespaces = view.namespaces();
    let kept = claims::keep_templates(&operator, &[db], &namespaces)
        .await
        .unwrap();
    assert_eq!(kept.created, 1, "{kept:?}");
    let kept = claims::keep_templates(&operator, &[], &namespaces)
        .await
        .unwrap();
    assert_eq!(kept.deleted, 1, "{kept:?}");
    watches.abort();
    let written = policies.get("isolated").await.unwrap();
    assert_eq!(written.status.unwrap().conditions[0].reason, "NotServedYet");

    // Nothing more: another Secret, another webhook configuration.
    for args in [
        ["auth", "can-i", "get", "secrets/other"],
        ["auth", "can-i", "update", "secrets/other"],
        [
            "auth",
            "can-i",
            "patch",
            "mutatingwebhookconfigurations/other",
        ],
        ["auth", "can-i", "update", "enipolicies"],
        ["auth", "can-i", "create", "resourceclaims.resource.k8s.io"],
        [
            "auth",
            "can-i",
            "update",
            "resourceclaimtemplates.resource.k8s.io",
        ],
    ] {
        let mut full: Vec<&str> = args.to_vec();
        full.extend([
            "-n",
            "enim-system",
            "--as",
            "system:serviceaccount:enim-system:enim-operator",
        ]);
        let out = blocking(|| cp.kubectl_output(&full));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "no",
            "{args:?}"
        );
    }
}
