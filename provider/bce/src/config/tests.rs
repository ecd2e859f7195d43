use enim_core::ratelimit::{RateLimit, DEFAULT_MUTATING_RATE};
use enim_core::testing::{read_with_deprecations, read_without_warnings, sample_api};

use super::*;

#[test]
fn config_defaults_and_unknown_keys() {
    let c: BceConfig = serde_json::from_str(r#"{"security_group_ids": ["g-1"]}"#).unwrap();
    assert_eq!(c.poll_interval, Duration::from_secs(2));
    assert_eq!(c.list_page_size, 100);
    assert_eq!(c.pool, PoolConfig::default());
    assert!(c.validate().is_ok());
    assert!(serde_json::from_str::<BceConfig>(r#"{"regoin": "bj"}"#).is_err());
    let c: BceConfig = serde_json::from_str(
        r#"{"poll_interval": "50ms", "operation_timeout": "1s",
            "pool": {"min_free": 2, "max_free": 4}}"#,
    )
    .unwrap();
    assert_eq!(c.poll_interval, Duration::from_millis(50));
    assert_eq!(c.pool.pre_allocate, 2);
    let mut bad = c.clone();
    bad.list_page_size = 0;
    assert!(bad.validate().is_err());
    assert_eq!(c.api.mutating_rate, DEFAULT_MUTATING_RATE);
    assert_eq!(c.cluster, None);
    let r: BceConfig = serde_json::from_str(
        r#"{"cluster": "prod", "api": {"read_rate": {"every": "100ms", "burst": 3}}}"#,
    )
    .unwrap();
    assert_eq!(r.cluster.as_deref(), Some("prod"));
    assert_eq!(
        r.api.read_rate,
        RateLimit::new(Duration::from_millis(100), 3)
    );
    assert!(r.validate().is_ok());
    let mut bad = r.clone();
    bad.cluster = Some("a;b".into());
    assert!(bad.validate().unwrap_err().to_string().contains("cluster"));
    let mut bad = r.clone();
    bad.api.mutating_rate.burst = 0;
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("api.mutating_rate: burst"));
    // The pool's own checks are the config's: its free range as the file
    // is read (a pair the watermarks cannot hold), the rest by validate.
    let e = serde_json::from_str::<BceConfig>(r#"{"pool": {"min_free": 2, "max_free": 1}}"#)
        .unwrap_err();
    assert!(e.to_string().contains("max_free"), "{e}");
    let mut bad = c;
    bad.pool.initial_retry = Duration::ZERO;
    assert!(bad.validate().is_err());
}

#[test]
fn debug_hides_the_secret() {
    let c = BceConfig {
        access_key_id: Some("ak".into()),
        secret_access_key: Some("topsecret".into()),
        ..BceConfig::default()
    };
    let shown = format!("{c:?}");
    assert!(
        shown.contains("ak") && !shown.contains("topsecret"),
        "{shown}"
    );
    let creds = c.credentials().unwrap();
    assert!(!format!("{creds:?}").contains("topsecret"));
}

/// The keys as they were before the `api` table, the node's and the
/// operator's: each still read, each with a warning that names its new
/// key.
#[test]
fn old_keys_are_read_with_a_deprecation_warning() {
    let node = read_with_deprecations("provider", NODE_MOVES, || {
        toml::from_str::<BceConfig>(
            r#"
            endpoint = "http://127.0.0.1:5000"
            max_attempts = 3
            retry_base = "100ms"
            retry_cap = "5s"
            api_mutating_rate = { every = "2s", burst = 3 }
            api_read_rate = { every = "100ms", burst = 20 }
            poll_interval = "1s"
            "#,
        )
    });
    assert_eq!(node.poll_interval, Duration::from_secs(1));
    node.validate().unwrap();
    let fleet = read_with_deprecations("cloud", FLEET_MOVES, || {
        serde_json::from_str::<BceFleetConfig>(
            r#"{"region": "bj", "vpc_id": "vpc-1", "cluster": "prod",
                "endpoint": "http://127.0.0.1:5000",
                "api": {"max_attempts": 3, "retry_base": "100ms", "retry_cap": "5s",
                        "api_mutating_rate": {"every": "2s", "burst": 3},
                        "api_read_rate": {"every": "100ms", "burst": 20},
                        "poll_interval": "5ms", "operation_timeout": "5s",
                        "list_page_size": 2}}"#,
        )
    });
    assert_eq!(
        (
            fleet.poll_interval,
            fleet.operation_timeout,
            fleet.list_page_size
        ),
        (Duration::from_millis(5), Duration::from_secs(5), 2)
    );
    assert_eq!(fleet.endpoint(), "http://127.0.0.1:5000");
    fleet.validate().unwrap();
    assert_eq!((node.api, fleet.api), (sample_api(), sample_api()));
}

/// A new key reads as its old name did; the rest of `api` keeps BCE's
/// defaults, not the shared ones.
#[test]
fn new_node_keys_are_read_without_a_warning() {
    let new = read_without_warnings(|| toml::from_str::<BceConfig>("[api]\nmax_attempts = 2"));
    let old: BceConfig = toml::from_str("max_attempts = 2").unwrap();
    assert_eq!(new, old);
    assert_eq!(new.api.max_attempts, 2);
    assert_eq!(new.api.backoff, Duration::from_millis(500));
}

#[test]
fn a_node_key_given_under_both_names_is_refused() {
    for text in [
        "max_attempts = 2\n[api]\nmax_attempts = 3",
        "retry_base = \"1s\"\n[api]\nbackoff = \"2s\"",
        "endpoint = \"http://a\"\n[api]\nendpoint = \"http://b\"",
    ] {
        let e = toml::from_str::<BceConfig>(text).unwrap_err().to_string();
        assert!(e.contains("[provider] sets both"), "{text}: {e}");
    }
}

#[test]
fn written_back_configs_read_the_same() {
    let c: BceConfig = toml::from_str("retry_cap = \"20s\"\ncluster = \"c\"").unwrap();
    let written = toml::to_string(&c).unwrap();
    assert_eq!(toml::from_str::<BceConfig>(&written).unwrap(), c);
    let f: BceFleetConfig = fleet(r#"{"api": {"poll_interval": "1s"}}"#);
    let written = toml::to_string(&f).unwrap();
    assert_eq!(toml::from_str::<BceFleetConfig>(&written).unwrap(), f);
}

fn fleet(json: &str) -> BceFleetConfig {
    serde_json::from_str(json).unwrap()
}

#[test]
fn fleet_config_is_checked_and_names_what_is_wrong() {
    let ok: BceFleetConfig = serde_json::from_str(
        r#"{"region": "bj", "vpc_id": "vpc-1", "cluster": "prod",
            "limits": {"bcc.g4.c2m8": {"enis": 3, "ipv4_per_eni": 8}},
            "poll_interval": "1s"}"#,
    )
    .unwrap();
    ok.validate().unwrap();
    assert_eq!(ok.endpoint(), "https://bcc.bj.baidubce.com");
    assert_eq!(ok.limits["bcc.g4.c2m8"].ipv6_per_eni, 0);
    for (text, needle) in [
        (r#"{"regoin": "bj"}"#, "regoin"),
        (r#"{"api": {"poll": "1s"}}"#, "poll"),
        (
            r#"{"limits": {"t": {"enis": 1, "ipv4_per_eni": 1, "v6": 1}}}"#,
            "v6",
        ),
    ] {
        let e = serde_json::from_str::<BceFleetConfig>(text).unwrap_err();
        assert!(e.to_string().contains(needle), "{needle}: {e}");
    }
    type Change = fn(&mut BceFleetConfig);
    let cases: [(Change, &str); 4] = [
        (|c| c.region = None, "region or endpoint"),
        (|c| c.vpc_id.clear(), "vpc_id"),
        (|c| c.cluster = "a b".into(), "cluster"),
        (|c| c.api.max_attempts = 0, "api.max_attempts"),
    ];
    for (change, needle) in cases {
        let mut c = ok.clone();
        change(&mut c);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains(needle), "{needle}: {e}");
    }
}

#[test]
fn new_fleet_keys_are_read_without_a_warning_and_both_names_are_refused() {
    let c = read_without_warnings(|| {
        serde_json::from_str::<BceFleetConfig>(
            r#"{"poll_interval": "5ms", "api": {"backoff": "1ms"}}"#,
        )
    });
    assert_eq!(c.poll_interval, Duration::from_millis(5));
    assert_eq!(c.api.backoff, Duration::from_millis(1));
    let e = serde_json::from_str::<BceFleetConfig>(
        r#"{"poll_interval": "5ms", "api": {"poll_interval": "6ms"}}"#,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("[cloud] sets both api.poll_interval (deprecated) and poll_interval"),
        "{e}"
    );
}
