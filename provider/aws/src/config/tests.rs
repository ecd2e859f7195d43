use enim_core::ratelimit::RateLimit;
use enim_core::testing::{read_with_deprecations, read_without_warnings, sample_api};

use super::*;

#[test]
fn minimal_config_takes_defaults() {
    let c: AwsConfig = toml::from_str("").unwrap();
    assert_eq!(c, AwsConfig::default());
    assert_eq!(c.imds_endpoint, "http://169.254.169.254");
    assert_eq!(c.region, None);
    assert_eq!(c.pool, PoolConfig::default());
    c.validate().unwrap();
}

#[test]
fn full_config_parses() {
    let c: AwsConfig = toml::from_str(
        r#"
        region = "eu-west-1"
        imds_endpoint = "http://127.0.0.1:1338"
        subnet_id = "subnet-0abc"
        security_group_ids = ["sg-1", "sg-2"]
        assign_ipv6 = true
        mtu = 9001
        metadata_wait = "30s"
        detach_timeout = "1m"
        cluster = "prod-eu"
        [api]
        endpoint = "http://127.0.0.1:5000"
        max_attempts = 3
        backoff = "100ms"
        max_backoff = "5s"
        mutating_rate = { every = "2s", burst = 3 }
        read_rate = { every = "100ms", burst = 20 }
        [pool]
        min_free = 2
        max_free = 4
        "#,
    )
    .unwrap();
    assert_eq!(c.region.as_deref(), Some("eu-west-1"));
    assert_eq!(c.security_group_ids, ["sg-1", "sg-2"]);
    assert_eq!(c.metadata_wait, Duration::from_secs(30));
    assert_eq!(c.api.backoff, Duration::from_millis(100));
    assert_eq!((c.pool.pre_allocate, c.pool.watermarks().high()), (2, 4));
    assert_eq!(
        c.api.mutating_rate,
        RateLimit::new(Duration::from_secs(2), 3)
    );
    assert_eq!(
        c.api.read_rate,
        RateLimit::new(Duration::from_millis(100), 20)
    );
    assert_eq!(c.cluster.as_deref(), Some("prod-eu"));
    c.validate().unwrap();
}

#[test]
fn unknown_keys_and_bad_values_are_rejected() {
    let e = toml::from_str::<AwsConfig>("regoin = \"x\"").unwrap_err();
    assert!(e.to_string().contains("regoin"), "{e}");
    let e = toml::from_str::<AwsConfig>("[pool]\nmin_fre = 1").unwrap_err();
    assert!(e.to_string().contains("min_fre"), "{e}");
    // The pool's free range is checked as the file is read: the
    // watermarks cannot hold a max_free below min_free.
    let e = toml::from_str::<AwsConfig>("[pool]\nmin_free = 5\nmax_free = 1").unwrap_err();
    assert!(e.to_string().contains("max_free"), "{e}");

    // Each change to the defaults and what the error must name.
    type Change = fn(&mut AwsConfig);
    let cases: [(Change, &str); 8] = [
        (|c| c.api.max_attempts = 0, "api.max_attempts"),
        (
            |c| {
                c.api.backoff = Duration::from_secs(2);
                c.api.max_backoff = Duration::from_secs(1);
            },
            "api.max_backoff",
        ),
        (|c| c.mtu = Some(100), "mtu"),
        (
            |c| c.api.endpoint = Some("ec2.local".into()),
            "api.endpoint",
        ),
        (
            |c| c.api.mutating_rate = RateLimit::new(Duration::from_secs(1), 0),
            "api.mutating_rate: burst",
        ),
        (
            |c| c.api.read_rate = RateLimit::new(Duration::ZERO, 5),
            "api.read_rate: every",
        ),
        (|c| c.cluster = Some("no spaces".into()), "cluster"),
        (|c| c.pool.initial_retry = Duration::ZERO, "initial_retry"),
    ];
    for (change, needle) in cases {
        let mut c = AwsConfig::default();
        change(&mut c);
        let e = c.validate().unwrap_err();
        assert!(e.contains(needle), "{needle}: {e}");
    }
}

/// [`sample_api`] in the old keys (but `ec2_endpoint`), one table for
/// both spellings: the node's `api_<key>` at the top level, the
/// operator's `<key>` in its `[api]` table.
const OLD_API_KEYS: [(&str, &str); 5] = [
    ("attempts", "3"),
    ("backoff", r#""100ms""#),
    ("max_backoff", r#""5s""#),
    ("mutating_rate", r#"{ every = "2s", burst = 3 }"#),
    ("describe_rate", r#"{ every = "100ms", burst = 20 }"#),
];
const OLD_ENDPOINT: &str = r#"ec2_endpoint = "http://127.0.0.1:5000""#;

/// `head`, then each of [`OLD_API_KEYS`] named `prefix` and the key.
fn old_api_toml(head: &str, prefix: &str) -> String {
    let lines = OLD_API_KEYS.map(|(key, value)| format!("{prefix}{key} = {value}\n"));
    format!("{head}{}", lines.concat())
}

/// The keys as they were before the `api` table, the node's and the
/// operator's: each still read, each with a warning that names its new
/// key.
#[test]
fn old_keys_are_read_with_a_deprecation_warning() {
    let node = read_with_deprecations("provider", NODE_MOVES, || {
        toml::from_str::<AwsConfig>(&old_api_toml(&format!("{OLD_ENDPOINT}\n"), "api_"))
    });
    node.validate().unwrap();
    let fleet = read_with_deprecations("cloud", FLEET_MOVES, || {
        let head = format!("region = \"r\"\ncluster = \"c\"\n{OLD_ENDPOINT}\n[api]\n");
        parse_fleet(&old_api_toml(&head, ""))
    });
    fleet.validate().unwrap();
    assert_eq!((node.api, fleet.api), (sample_api(), sample_api()));
}

/// A new key reads as its old name did; the rest of `api` keeps its
/// defaults.
#[test]
fn new_node_keys_are_read_without_a_warning() {
    let new = read_without_warnings(|| toml::from_str::<AwsConfig>("[api]\nmax_attempts = 2"));
    let old: AwsConfig = toml::from_str("api_attempts = 2").unwrap();
    assert_eq!(new, old);
    let api = ApiConfig::default();
    assert_eq!((new.api.max_attempts, new.api.backoff), (2, api.backoff));
}

#[test]
fn a_node_key_given_under_both_names_is_refused() {
    for text in [
        "api_attempts = 2\n[api]\nmax_attempts = 3",
        "ec2_endpoint = \"http://a\"\n[api]\nendpoint = \"http://b\"",
        "api_describe_rate = { every = \"1s\", burst = 1 }\n\
         [api]\nread_rate = { every = \"1s\", burst = 2 }",
    ] {
        let e = toml::from_str::<AwsConfig>(text).unwrap_err().to_string();
        assert!(e.contains("(deprecated) and api."), "{text}: {e}");
    }
}

#[test]
fn written_back_a_config_reads_the_same() {
    let c: AwsConfig = toml::from_str("api_attempts = 2\ncluster = \"c\"").unwrap();
    let written = toml::to_string(&c).unwrap();
    assert_eq!(toml::from_str::<AwsConfig>(&written).unwrap(), c);
    let f: AwsFleetConfig = parse_fleet("region = \"r\"\ncluster = \"c\"").unwrap();
    let written = toml::to_string(&f).unwrap();
    assert_eq!(parse_fleet(&written).unwrap(), f);
}

fn parse_fleet(text: &str) -> Result<AwsFleetConfig, String> {
    toml::from_str::<AwsFleetConfig>(text).map_err(|e| e.to_string())
}

#[test]
fn minimal_and_full_fleet_configs() {
    let c = parse_fleet("region = \"eu-west-1\"\ncluster = \"prod\"").unwrap();
    assert_eq!(c.credentials, AwsCredentialsConfig::Environment);
    assert_eq!(c.api, ApiConfig::default());
    c.validate().unwrap();

    let c = parse_fleet(
        r#"
        region = "eu-west-1"
        cluster = "prod"
        assign_ipv6 = true
        detach_timeout = "30s"
        credentials = { source = "static", access_key_id = "AKID", secret_access_key = "s3cr3t" }
        [api]
        endpoint = "http://127.0.0.1:5000"
        max_attempts = 3
        mutating_rate = { every = "200ms", burst = 10 }
        "#,
    )
    .unwrap();
    c.validate().unwrap();
    assert_eq!(c.api.max_attempts, 3);
    assert_eq!(c.detach_timeout, Duration::from_secs(30));
    assert!(!format!("{c:?}").contains("s3cr3t"));
    let c = parse_fleet(
        "region = \"r\"\ncluster = \"c\"\ncredentials = { source = \"instance_role\" }",
    )
    .unwrap();
    assert_eq!(
        c.credentials,
        AwsCredentialsConfig::InstanceRole {
            imds_endpoint: DEFAULT_IMDS_ENDPOINT.into()
        }
    );
    // Web identity: each key may be left out (read from the environment).
    let c = parse_fleet(
        "region = \"r\"\ncluster = \"c\"\ncredentials = { source = \"web_identity\", role_arn = \"arn:aws:iam::1:role/enim\" }",
    )
    .unwrap();
    assert_eq!(
        c.credentials,
        AwsCredentialsConfig::WebIdentity(crate::credentials::WebIdentity {
            role_arn: Some("arn:aws:iam::1:role/enim".into()),
            ..Default::default()
        })
    );
    c.validate().unwrap();
}

#[test]
fn fleet_unknown_keys_and_bad_values_are_named() {
    for (text, needle) in [
        ("region = \"r\"\ncluster = \"c\"\nregoin = \"x\"", "regoin"),
        ("region = \"r\"\ncluster = \"c\"\n[api]\nattempt = 1", "attempt"),
        (
            "region = \"r\"\ncluster = \"c\"\ncredentials = { source = \"static\", access_key = \"a\" }",
            "access_key",
        ),
        (
            "region = \"r\"\ncluster = \"c\"\ncredentials = { source = \"vault\" }",
            "vault",
        ),
        (
            "region = \"r\"\ncluster = \"c\"\ncredentials = { source = \"web_identity\", role = \"x\" }",
            "role",
        ),
    ] {
        let e = parse_fleet(text).unwrap_err();
        assert!(e.contains(needle), "{needle}: {e}");
    }
    type Change = fn(&mut AwsFleetConfig);
    let cases: [(Change, &str); 8] = [
        (|c| c.region.clear(), "region must be set"),
        (|c| c.cluster.clear(), "cluster"),
        (|c| c.cluster = "a b".into(), "cluster"),
        (
            |c| c.api.endpoint = Some("ec2.local".into()),
            "api.endpoint",
        ),
        (|c| c.api.max_attempts = 0, "api.max_attempts"),
        (|c| c.api.read_rate.burst = 0, "api.read_rate: burst"),
        (
            |c| {
                c.credentials = AwsCredentialsConfig::Static {
                    access_key_id: "a".into(),
                    secret_access_key: "".into(),
                    session_token: None,
                }
            },
            "secret_access_key",
        ),
        (
            |c| {
                c.credentials = AwsCredentialsConfig::WebIdentity(crate::credentials::WebIdentity {
                    role_arn: Some(" ".into()),
                    ..Default::default()
                })
            },
            "web_identity",
        ),
    ];
    for (change, needle) in cases {
        let mut c = AwsFleetConfig {
            region: "r".into(),
            cluster: "c".into(),
            ..AwsFleetConfig::default()
        };
        c.validate().unwrap();
        change(&mut c);
        let e = c.validate().unwrap_err();
        assert!(e.contains(needle), "{needle}: {e}");
    }
}

#[test]
fn new_fleet_keys_are_read_without_a_warning_and_both_names_are_refused() {
    let c = read_without_warnings(|| {
        parse_fleet("region = \"r\"\ncluster = \"c\"\n[api]\nmax_attempts = 2")
    });
    assert_eq!(c.api.max_attempts, 2);
    let e = parse_fleet("region = \"r\"\ncluster = \"c\"\n[api]\nattempts = 2\nmax_attempts = 3")
        .unwrap_err();
    assert!(
        e.contains("[cloud] sets both api.attempts (deprecated) and api.max_attempts"),
        "{e}"
    );
}
