//! The EC2 client against a scripted loopback server: what goes on the
//! wire (signature headers, form body, pagination tokens) and how replies
//! are retried. No moto needed.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_credential_types::Credentials;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use enim_core::ratelimit::RateLimit;
use enim_core::ProviderError;
use enim_provider_aws::client::{ActionLimits, Ec2Client, Ec2Error, RetryPolicy};
use enim_provider_aws::credentials::CredentialsProvider;
use enim_testkit::cloud::assert_paced;

#[derive(Clone)]
struct Seen {
    headers: axum::http::HeaderMap,
    form: Vec<(String, String)>,
    /// When the request arrived.
    at: std::time::Instant,
}

#[derive(Default)]
struct Script {
    replies: Mutex<VecDeque<(u16, String)>>,
    seen: Mutex<Vec<Seen>>,
}

async fn handler(State(s): State<Arc<Script>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let form = form_urlencoded::parse(&body).into_owned().collect();
    s.seen.lock().unwrap().push(Seen {
        headers: parts.headers,
        form,
        at: std::time::Instant::now(),
    });
    let (status, body) = s
        .replies
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or((500, "script ran out".into()));
    (StatusCode::from_u16(status).unwrap(), body).into_response()
}

async fn scripted(replies: Vec<(u16, String)>) -> (String, Arc<Script>) {
    let script = Arc::new(Script {
        replies: Mutex::new(replies.into()),
        seen: Mutex::new(Vec::new()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let router = axum::Router::new()
        .fallback(handler)
        .with_state(script.clone());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (url, script)
}

fn client(url: &str, creds: Credentials, attempts: u32) -> Ec2Client {
    Ec2Client::new(
        url,
        "eu-central-1",
        Arc::new(CredentialsProvider::fixed(creds)),
        RetryPolicy {
            attempts,
            initial: Duration::from_millis(5),
            max: Duration::from_millis(20),
        },
    )
    .unwrap()
}

fn page(ids: &[&str], next: Option<&str>) -> String {
    let items: String = ids
        .iter()
        .map(|id| {
            format!(
                "<item><networkInterfaceId>{id}</networkInterfaceId><status>available</status></item>"
            )
        })
        .collect();
    let next = next.map_or(String::new(), |t| format!("<nextToken>{t}</nextToken>"));
    format!(
        "<DescribeNetworkInterfacesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
         <requestId>r</requestId><networkInterfaceSet>{items}</networkInterfaceSet>{next}\
         </DescribeNetworkInterfacesResponse>"
    )
}

fn get<'a>(form: &'a [(String, String)], k: &str) -> Option<&'a str> {
    form.iter().find(|(a, _)| a == k).map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn pages_are_followed_and_requests_signed() {
    let (url, script) = scripted(vec![
        (200, page(&["eni-1", "eni-2"], Some("tok/1+="))),
        (200, page(&["eni-3"], None)),
    ])
    .await;
    let creds = Credentials::new(
        "ASIAEXAMPLE",
        "secret",
        Some("session-tok".into()),
        None,
        "t",
    );
    let c = client(&url, creds, 3);
    let enis = c
        .describe_network_interfaces(&[("tag:enim.io/node", &["i-0abc"])])
        .await
        .unwrap();
    let ids: Vec<_> = enis
        .iter()
        .map(|e| e.network_interface_id.as_str())
        .collect();
    assert_eq!(ids, ["eni-1", "eni-2", "eni-3"]);

    let seen = script.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    for s in &seen {
        assert_eq!(get(&s.form, "Action"), Some("DescribeNetworkInterfaces"));
        assert_eq!(get(&s.form, "Version"), Some("2016-11-15"));
        assert_eq!(get(&s.form, "Filter.1.Name"), Some("tag:enim.io/node"));
        assert_eq!(get(&s.form, "Filter.1.Value.1"), Some("i-0abc"));
        assert_eq!(get(&s.form, "MaxResults"), Some("1000"));
        let auth = s.headers["authorization"].to_str().unwrap();
        assert!(
            auth.starts_with("AWS4-HMAC-SHA256 Credential=ASIAEXAMPLE/"),
            "{auth}"
        );
        assert!(auth.contains("/eu-central-1/ec2/aws4_request"), "{auth}");
        assert!(auth.contains("SignedHeaders="), "{auth}");
        assert!(s.headers.contains_key("x-amz-date"));
        assert_eq!(s.headers["x-amz-security-token"], "session-tok");
        assert!(s.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/x-www-form-urlencoded"));
    }
    assert_eq!(get(&seen[0].form, "NextToken"), None);
    // The token goes back exactly, reserved characters and all.
    assert_eq!(get(&seen[1].form, "NextToken"), Some("tok/1+="));
}

#[tokio::test]
async fn a_repeated_next_token_stops_instead_of_looping() {
    let (url, _script) = scripted(vec![
        (200, page(&["eni-1"], Some("same"))),
        (200, page(&["eni-2"], Some("same"))),
    ])
    .await;
    let c = client(&url, Credentials::new("AKID", "s", None, None, "t"), 3);
    let e = c.describe_network_interfaces(&[]).await.unwrap_err();
    assert!(e.to_string().contains("same NextToken"), "{e}");
}

#[tokio::test]
async fn bare_5xx_pages_are_retried_then_give_a_transient_error() {
    let (url, script) = scripted(vec![
        (502, "<html>bad gateway</html>".into()),
        (503, String::new()),
        (200, page(&["eni-1"], None)),
    ])
    .await;
    let c = client(&url, Credentials::new("AKID", "s", None, None, "t"), 3);
    assert_eq!(c.describe_network_interfaces(&[]).await.unwrap().len(), 1);
    assert_eq!(script.seen.lock().unwrap().len(), 3);

    let (url, script) = scripted(vec![(503, String::new()); 10]).await;
    let c = client(&url, Credentials::new("AKID", "s", None, None, "t"), 3);
    let e = c.describe_network_interfaces(&[]).await.unwrap_err();
    assert!(
        matches!(e, Ec2Error::Unavailable { attempts: 3, .. }),
        "{e:?}"
    );
    assert_eq!(script.seen.lock().unwrap().len(), 3, "bounded");
    assert!(ProviderError::from(e).is_transient());
}

#[tokio::test]
async fn nothing_listening_is_transient() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let c = client(
        &format!("http://127.0.0.1:{port}"),
        Credentials::new("AKID", "s", None, None, "t"),
        2,
    );
    let e = c.delete_network_interface("eni-1").await.unwrap_err();
    assert!(
        matches!(e, Ec2Error::Unavailable { attempts: 2, .. }),
        "{e:?}"
    );
}

#[tokio::test]
async fn create_sends_token_tags_and_groups() {
    let reply = "<CreateNetworkInterfaceResponse><networkInterface>\
        <networkInterfaceId>eni-9</networkInterfaceId><macAddress>02:00:00:00:00:09</macAddress>\
        <status>pending</status><subnetId>subnet-1</subnetId></networkInterface>\
        </CreateNetworkInterfaceResponse>";
    let (url, script) = scripted(vec![(500, String::new()), (200, reply.into())]).await;
    let c = client(&url, Credentials::new("AKID", "s", None, None, "t"), 3);
    let tags = vec![
        ("enim.io/managed".to_string(), "true".to_string()),
        ("enim.io/node".to_string(), "i-1".to_string()),
    ];
    let sgs = vec!["sg-1".to_string(), "sg-2".to_string()];
    let eni = c
        .create_network_interface(&enim_provider_aws::client::CreateEni {
            subnet_id: "subnet-1",
            security_group_ids: &sgs,
            description: "enim pod ENI of i-1",
            client_token: "enim-i-1-abc",
            tags: &tags,
            ipv6_address_count: 1,
            secondary_ipv4_count: 0,
        })
        .await
        .unwrap();
    assert_eq!(eni.network_interface_id, "eni-9");
    let seen = script.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    // The retry carries the same client token: EC2 makes one ENI, not two.
    for s in &seen {
        let f = &s.form;
        assert_eq!(get(f, "ClientToken"), Some("enim-i-1-abc"));
        assert_eq!(get(f, "SubnetId"), Some("subnet-1"));
        assert_eq!(get(f, "SecurityGroupId.1"), Some("sg-1"));
        assert_eq!(get(f, "SecurityGroupId.2"), Some("sg-2"));
        assert_eq!(get(f, "Ipv6AddressCount"), Some("1"));
        assert_eq!(
            get(f, "TagSpecification.1.ResourceType"),
            Some("network-interface")
        );
        assert_eq!(
            get(f, "TagSpecification.1.Tag.1.Key"),
            Some("enim.io/managed")
        );
        assert_eq!(get(f, "TagSpecification.1.Tag.2.Value"), Some("i-1"));
        assert_eq!(get(f, "Description"), Some("enim pod ENI of i-1"));
    }
}

/// A burst of calls through one client goes out at the configured rate per
/// API class: the mutating ones one per interval after the burst, while
/// describes, with their own bucket, are not held behind them.
#[tokio::test]
async fn a_burst_of_calls_is_spread_at_the_configured_rate() {
    const MUTATING: usize = 8;
    const DESCRIBES: usize = 3;
    // Any page is a fine answer to a delete too (its body is not read).
    let (url, script) = scripted(vec![(200, page(&[], None)); MUTATING + DESCRIBES]).await;
    let mutating = RateLimit::new(Duration::from_millis(200), 2);
    let limits = Arc::new(ActionLimits::new(
        mutating,
        RateLimit::new(Duration::from_millis(20), 5),
    ));
    let c = Arc::new(
        client(&url, Credentials::new("AKID", "s", None, None, "t"), 1).with_limits(limits),
    );
    let t0 = std::time::Instant::now();
    let mut calls = Vec::new();
    for n in 0..MUTATING {
        let c = c.clone();
        calls.push(tokio::spawn(async move {
            c.delete_network_interface(&format!("eni-{n}"))
                .await
                .map(drop)
        }));
    }
    for _ in 0..DESCRIBES {
        let c = c.clone();
        calls.push(tokio::spawn(async move {
            c.describe_network_interfaces(&[]).await.map(drop)
        }));
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
    let seen = script.seen.lock().unwrap().clone();
    let arrivals = |action: &str| {
        let mut at: Vec<Duration> = seen
            .iter()
            .filter(|s| get(&s.form, "Action") == Some(action))
            .map(|s| s.at - t0)
            .collect();
        at.sort();
        at
    };
    let deletes = arrivals("DeleteNetworkInterface");
    assert_eq!(deletes.len(), MUTATING);
    // Describes have their own bucket: none waited behind the deletes.
    let describes = arrivals("DescribeNetworkInterfaces");
    assert_eq!(describes.len(), DESCRIBES);
    assert_paced(&deletes, mutating, &describes);
}
