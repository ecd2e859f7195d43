//! IRSA against moto: the operator's AWS backend with `source =
//! "web_identity"` exchanges a token file for a role's credentials at
//! moto's STS (`AssumeRoleWithWebIdentity`) and calls EC2 with them, with
//! moto checking signatures and the role's policy. No key is configured
//! anywhere. One test in this binary: it sets the process environment
//! (`AWS_ENDPOINT_URL_STS`, the default chain's variables), which no other
//! test may share.
//!
//! AssumeRoleWithWebIdentity is unsigned, as at AWS (the token is its
//! proof); the rig's moto lets it through its signature checks
//! (testkit/src/moto/launch.py), which stay on for every EC2 call.

use std::time::Duration;

use enim_provider::fleet::{CreateEni, FleetCloud};
use enim_provider_aws::credentials::{CredentialsProvider, WebIdentity};
use enim_provider_aws::metadata::Imds;
use enim_provider_aws::{AwsCredentialsConfig, AwsFleet, AwsFleetConfig};
use enim_testkit::moto::{Env, REGION};

const ROLE: &str = "enim-operator-irsa";

fn fleet_config(env: &Env, credentials: AwsCredentialsConfig) -> AwsFleetConfig {
    AwsFleetConfig {
        region: REGION.into(),
        cluster: "irsa".into(),
        detach_timeout: Duration::from_secs(10),
        api: env.api(),
        credentials,
        ..AwsFleetConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_identity_credentials_come_from_sts_and_carry_the_roles_policy() {
    let Some(env) = Env::start().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    // A projected ServiceAccount token is a JWT; moto's STS does not verify
    // it against an issuer (a real STS does, against the cluster's OIDC
    // provider), so its content is a stand-in.
    std::fs::write(&token, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6ZW5pbS1zeXN0ZW06ZW5pbS1vcGVyYXRvciJ9.c2ln").unwrap();
    // Only the operator's describe: creating an ENI must then be refused,
    // which shows EC2 saw the role's credentials and judged its policy.
    let arn = env.iam_role(ROLE, &["ec2:DescribeNetworkInterfaces"]).await;
    assert!(arn.ends_with(&format!(":role/{ROLE}")), "{arn}");
    // The only test in its binary: no other test reads these variables.
    std::env::set_var("AWS_ENDPOINT_URL_STS", &env.moto.url);
    for k in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    ] {
        std::env::remove_var(k);
    }

    // Everything in the config: the role and the token file.
    let fleet = AwsFleet::connect(&fleet_config(
        &env,
        AwsCredentialsConfig::WebIdentity(WebIdentity {
            role_arn: Some(arn.clone()),
            token_file: Some(token.clone()),
            session_name: None,
        }),
    ))
    .await
    .expect("connect with web identity credentials");
    let listed = fleet.list_cluster_enis().await;
    assert!(
        listed.is_ok(),
        "describe with the role's credentials: {listed:?}"
    );

    // The role may describe only: moto refuses a create signed with the
    // role's credentials, which shows they are the role's.
    let refused = fleet
        .create(&CreateEni {
            instance: env.instance_id.clone(),
            subnet: env.subnet_id.clone(),
            security_groups: vec![],
            client_token: "irsa-refused".into(),
            secondary_ipv4: 0,
            fresh: true,
        })
        .await;
    let e = refused.expect_err("the role may not create ENIs");
    // moto names the caller: the role's session, not a user or the rig.
    assert!(
        e.to_string().contains("CreateNetworkInterface")
            && e.to_string().contains(&format!("assumed-role/{ROLE}/")),
        "refused, for the role's session: {e}"
    );

    // As EKS's pod identity webhook sets it up: the variables only.
    std::env::set_var("AWS_ROLE_ARN", &arn);
    std::env::set_var("AWS_WEB_IDENTITY_TOKEN_FILE", &token);
    let fleet = AwsFleet::connect(&fleet_config(
        &env,
        AwsCredentialsConfig::WebIdentity(WebIdentity {
            role_arn: None,
            token_file: None,
            session_name: None,
        }),
    ))
    .await
    .expect("connect with web identity from the environment");
    assert!(fleet.list_cluster_enis().await.is_ok());

    // The node agent's default chain picks web identity from the same
    // variables, ahead of the instance role.
    let imds = std::sync::Arc::new(Imds::new(&env.imds.url).expect("metadata client"));
    let chain = CredentialsProvider::default_chain(imds, REGION)
        .await
        .expect("default chain");
    assert_eq!(chain.describe(), "web identity (IRSA) credentials from STS");
    let creds = chain.get().await.unwrap();
    assert!(
        creds.session_token().is_some() && creds.expiry().is_some(),
        "STS answers temporary credentials: {creds:?}"
    );

    // A token file that is not there: a clear error at connect, naming
    // the source.
    std::env::remove_var("AWS_WEB_IDENTITY_TOKEN_FILE");
    let missing = AwsFleet::connect(&fleet_config(
        &env,
        AwsCredentialsConfig::WebIdentity(WebIdentity {
            role_arn: Some(arn),
            token_file: Some(dir.path().join("no-such-token")),
            session_name: None,
        }),
    ))
    .await;
    let e = missing.err().expect("a missing token file fails connect");
    assert!(e.to_string().contains("web identity"), "{e}");

    // Without the role anywhere: refused before any call, naming what to set.
    std::env::remove_var("AWS_ROLE_ARN");
    let no_role = AwsFleet::connect(&fleet_config(
        &env,
        AwsCredentialsConfig::WebIdentity(WebIdentity {
            role_arn: None,
            token_file: Some(token),
            session_name: None,
        }),
    ))
    .await;
    let e = no_role.err().expect("no role fails connect");
    assert!(e.to_string().contains("AWS_ROLE_ARN"), "{e}");
}
