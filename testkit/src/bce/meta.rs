//! The instance metadata service: the node's identity and its interfaces,
//! an ENI listed once it is inuse (after its metadata lag).

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::{World, GATEWAY, INSTANCE, PRIMARY_IP, PRIMARY_MAC, REGION, SUBNET, VPC};

pub(super) async fn handler(State(world): State<Arc<Mutex<World>>>, req: Request) -> Response {
    let Some(path) = req.uri().path().strip_prefix("/1.0/meta-data/") else {
        return (StatusCode::NOT_FOUND, "").into_response();
    };
    let path = path.trim_end_matches('/').to_string();
    let mut w = world.lock().unwrap();
    let text = |s: String| (StatusCode::OK, Body::from(s)).into_response();
    match path.as_str() {
        "instance-shortid" => return text(INSTANCE.into()),
        "region" => return text(REGION.into()),
        "vpc-id" => return text(VPC.into()),
        "subnet-id" => return text(SUBNET.into()),
        "local-ipv4" => return text(PRIMARY_IP.to_string()),
        "network/interfaces/macs" => {
            let mut lines = vec![format!("{PRIMARY_MAC}/")];
            let mut new = Vec::new();
            for e in w.enis.values_mut() {
                if e.instance_id == INSTANCE && e.status == "inuse" {
                    if e.pending.meta_lag > 0 {
                        e.pending.meta_lag -= 1;
                    } else {
                        lines.push(format!("{}/", e.mac));
                        new.push(e.mac.clone());
                    }
                }
            }
            new.retain(|m| !w.shown.contains(m));
            let first = u32::try_from(w.shown.len()).expect("few fake ENIs");
            w.shown.extend(new.iter().cloned());
            let hook = w.on_new.clone();
            drop(w);
            // Plugged before the listing that shows it is answered.
            if let Some(hook) = hook {
                for (n, mac) in (first..).zip(&new) {
                    hook(mac, n);
                }
            }
            return text(lines.join("\n") + "\n");
        }
        _ => {}
    }
    let rest: Vec<&str> = path
        .strip_prefix("network/interfaces/macs/")
        .map(|r| r.split('/').collect())
        .unwrap_or_default();
    let (ip4, ip6, secondaries) = match rest.first() {
        Some(&m) if m == PRIMARY_MAC => (PRIMARY_IP, None, Vec::new()),
        Some(&m) => match w.enis.values().find(|e| {
            e.mac == m
                && e.instance_id == INSTANCE
                && e.status == "inuse"
                && e.pending.meta_lag == 0
        }) {
            Some(e) => (e.ip, e.ipv6, e.secondary_ips.clone()),
            None => return (StatusCode::NOT_FOUND, "").into_response(),
        },
        None => return (StatusCode::NOT_FOUND, "").into_response(),
    };
    match rest.as_slice() {
        [_, "fixed_ips"] => {
            let mut s = format!("{ip4}/\n");
            for a in ip6.map(IpAddr::V6).iter().chain(&secondaries) {
                s.push_str(&format!("{a}/\n"));
            }
            text(s)
        }
        [_, "fixed_ips", ip, leaf] => {
            let Ok(ip) = ip.parse::<IpAddr>() else {
                return (StatusCode::NOT_FOUND, "").into_response();
            };
            let primary = ip == IpAddr::V4(ip4);
            let known = primary || ip6.map(IpAddr::V6) == Some(ip) || secondaries.contains(&ip);
            match (*leaf, known, ip.is_ipv4()) {
                ("gateway", true, true) => text(GATEWAY.to_string()),
                ("mask", true, true) => text("255.255.255.0".into()),
                ("ip_type", true, true) if primary => text("primary".into()),
                ("gateway", true, false) => text("2400:da00::1".into()),
                ("mask", true, false) => text("64".into()),
                ("ip_type", true, _) => text("secondary".into()),
                _ => (StatusCode::NOT_FOUND, "").into_response(),
            }
        }
        _ => (StatusCode::NOT_FOUND, "").into_response(),
    }
}
