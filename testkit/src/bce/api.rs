//! The ENI OpenAPI: signature, outage and injected errors first, then the
//! calls enim makes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::auth::{query_pairs, verify};
use super::{FakeEni, Logged, World, INSTANCE, SUBNET, VPC};

/// A refusal: HTTP status, BCE error code, message.
pub(super) type Fail = (u16, &'static str, String);

fn fail(status: u16, code: &'static str, message: &str) -> Fail {
    (status, code, message.to_string())
}

fn error(status: u16, code: &str, message: &str) -> Response {
    let body = json!({"code": code, "message": message, "requestId": "req-fake"});
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn eni_json(e: &FakeEni) -> Value {
    let mut v = json!({
        "eniId": e.id, "name": e.name, "description": e.description,
        "vpcId": e.vpc_id, "subnetId": e.subnet_id, "zoneName": "cn-bj-a",
        "macAddress": e.mac, "status": e.status, "instanceId": e.instance_id,
        "securityGroupIds": e.security_group_ids, "createdTime": "2024-01-01T00:00:00Z",
    });
    let ip = |a: String, primary: bool| json!({"primary": primary, "privateIpAddress": a});
    let mut v4 = vec![ip(e.ip.to_string(), true)];
    let mut v6: Vec<Value> = e.ipv6.iter().map(|a| ip(a.to_string(), false)).collect();
    for a in &e.secondary_ips {
        match a {
            IpAddr::V4(_) => v4.push(ip(a.to_string(), false)),
            IpAddr::V6(_) => v6.push(ip(a.to_string(), false)),
        }
    }
    v["privateIpSet"] = json!(v4);
    if !v6.is_empty() {
        v["ipv6PrivateIpSet"] = json!(v6);
    }
    v
}

/// One read of an ENI: the pending transition advances.
fn poll(e: &mut FakeEni, lag: u32) {
    match e.status.as_str() {
        "attaching" | "detaching" if e.pending.polls_left > 0 => e.pending.polls_left -= 1,
        "attaching" => {
            e.status = "inuse".into();
            e.pending.meta_lag = lag;
        }
        "detaching" => {
            e.status = "available".into();
            e.instance_id.clear();
        }
        _ => {}
    }
}

pub(super) async fn handler(State(world): State<Arc<Mutex<World>>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or("").to_string();
    let mut w = world.lock().unwrap();
    let at = Instant::now();
    let by_method = w
        .inject_method
        .iter()
        .position(|(m, _, _)| *m == parts.method.as_str());
    let resp = match verify(&w, &parts.method, &path, &query, &parts.headers) {
        _ if w.down => error(
            503,
            "ServiceUnavailable",
            "the service is down (test outage)",
        ),
        Err((status, code, msg)) => error(status, code, &msg),
        Ok(()) => match (w.inject.pop_front(), by_method) {
            (Some((status, code)), _) => error(status, code, "injected"),
            (None, Some(i)) => {
                let (_, status, code) = w.inject_method.remove(i);
                error(status, code, "injected")
            }
            (None, None) => route(&mut w, &parts.method, &path, &query, &body),
        },
    };
    w.log.push(Logged {
        method: parts.method.to_string(),
        path,
        query,
        status: resp.status().as_u16(),
        at,
    });
    resp
}

fn route(w: &mut World, method: &Method, path: &str, query: &str, body: &[u8]) -> Response {
    let params: HashMap<String, String> = query_pairs(query).into_iter().collect();
    let token = params.get("clientToken").filter(|t| !t.is_empty()).cloned();
    let json_body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let mutating = *method != Method::GET;
    if mutating && token.is_none() {
        return error(
            400,
            "MissingClientToken",
            "mutating calls need a clientToken",
        );
    }
    // A replayed token gets the first answer.
    let token_key = token.map(|t| format!("{method} {path} {t}"));
    if let Some(first) = token_key.as_ref().and_then(|k| w.tokens.get(k)) {
        return (StatusCode::OK, first.clone()).into_response();
    }
    let resp: Result<String, Fail> = match (method.clone(), segments.as_slice()) {
        (Method::GET, ["v1", "eni", "quota"]) => {
            match (params.get("eniId"), params.get("instanceId")) {
                (Some(id), _) => match w.enis.get(id) {
                    Some(e) => {
                        let used = u32::try_from(e.ipv4_count()).expect("few addresses");
                        Ok(json!({"totalQuantity": w.ips_per_eni,
                              "availableQuantity": w.ips_per_eni.saturating_sub(used)})
                        .to_string())
                    }
                    None => Err(fail(404, "EniNotFound", "no such ENI")),
                },
                (None, Some(_)) => {
                    let used = u32::try_from(w.secondaries_of_us()).expect("few fake ENIs");
                    Ok(json!({"totalQuantity": w.quota_total,
                          "availableQuantity": w.quota_total.saturating_sub(used + 1)})
                    .to_string())
                }
                (None, None) => Err(fail(400, "MissingParameter", "eniId or instanceId")),
            }
        }
        (Method::POST, ["v1", "eni", id, "privateIp", "batchAdd"]) => batch_add(w, id, &json_body),
        (Method::POST, ["v1", "eni", id, "privateIp", "batchDel"]) => batch_del(w, id, &json_body),
        (Method::GET, ["v1", "eni"]) => list(w, &params),
        (Method::GET, ["v1", "eni", id]) => {
            let lag = w.metadata_lag;
            match w.enis.get_mut(*id) {
                Some(e) => {
                    poll(e, lag);
                    Ok(eni_json(e).to_string())
                }
                None => Err(fail(404, "EniNotFound", "no such ENI")),
            }
        }
        (Method::POST, ["v1", "eni"]) => create(w, &json_body),
        (Method::PUT, ["v1", "eni", id]) if params.contains_key("attach") => {
            attach(w, id, &json_body)
        }
        (Method::PUT, ["v1", "eni", id]) if params.contains_key("detach") => {
            detach(w, id, &json_body)
        }
        (Method::PUT, ["v1", "eni", id]) if params.contains_key("modifyAttribute") => {
            modify(w, id, &json_body)
        }
        (Method::GET, ["v1", "subnet", id]) if *id == SUBNET => {
            let v6 = if w.ipv6 { "2400:da00::/64" } else { "" };
            Ok(
                json!({"subnet": {"subnetId": SUBNET, "name": "test", "cidr": "10.0.1.0/24",
                                 "ipv6Cidr": v6, "vpcId": VPC, "zoneName": "cn-bj-a"}})
                .to_string(),
            )
        }
        (Method::GET, ["v1", "subnet", _]) => Err(fail(404, "NoSuchSubnet", "no such subnet")),
        (Method::GET, ["v2", "securityGroup"]) => security_groups(w, &params),
        (Method::DELETE, ["v1", "eni", id]) => match w.enis.get(*id) {
            None => Err(fail(404, "EniNotFound", "no such ENI")),
            Some(e) if e.status != "available" => Err(fail(
                409,
                "EniStatusConflict",
                &format!("ENI is {}", e.status),
            )),
            Some(_) => {
                w.enis.remove(*id);
                Ok(String::new())
            }
        },
        _ => Err(fail(404, "NoSuchAPI", "not part of the fake")),
    };
    match resp {
        Ok(body) => {
            if let Some(k) = token_key {
                w.tokens.insert(k, body.clone());
            }
            (StatusCode::OK, [("content-type", "application/json")], body).into_response()
        }
        Err((status, code, msg)) => error(status, code, &msg),
    }
}

fn list(w: &mut World, params: &HashMap<String, String>) -> Result<String, Fail> {
    let Some(vpc) = params.get("vpcId") else {
        return Err(fail(400, "MissingParameter", "vpcId is required"));
    };
    let instance = params.get("instanceId");
    let max_keys = params
        .get("maxKeys")
        .and_then(|m| m.parse::<usize>().ok())
        .unwrap_or(1000)
        .min(w.server_max_keys)
        .max(1);
    let matching: Vec<&FakeEni> = w
        .enis
        .values()
        .filter(|e| &e.vpc_id == vpc && instance.is_none_or(|i| &e.instance_id == i))
        .filter(|e| params.get("marker").is_none_or(|m| &e.id >= m))
        .collect();
    let page: Vec<Value> = matching
        .iter()
        .take(max_keys)
        .map(|e| eni_json(e))
        .collect();
    let truncated = matching.len() > max_keys;
    let mut v = json!({"enis": page, "isTruncated": truncated, "maxKeys": max_keys,
                       "marker": params.get("marker").cloned().unwrap_or_default()});
    if truncated {
        v["nextMarker"] = json!(matching[max_keys].id);
    }
    Ok(v.to_string())
}

/// BCC's security group listing, by instance only: the groups bound to
/// `instanceId` in `vpcId`, `maxKeys` (1 to 1000) a page from `marker` (a
/// group id).
fn security_groups(w: &World, params: &HashMap<String, String>) -> Result<String, Fail> {
    if let Some(answer) = &w.security_groups_answer {
        return Ok(answer.clone());
    }
    let given = |key: &str| params.get(key).filter(|v| !v.is_empty());
    let Some(instance) = given("instanceId") else {
        return Err(fail(400, "NotInFake", "the fake lists by instanceId only"));
    };
    let Some(vpc) = given("vpcId") else {
        return Err(fail(
            400,
            "MissingParameter",
            "vpcId is required with instanceId",
        ));
    };
    let max_keys = match given("maxKeys").map(|m| m.parse::<usize>()) {
        None => 1000,
        Some(Ok(n @ 1..=1000)) => n,
        Some(_) => return Err(fail(400, "InvalidParameter", "maxKeys must be 1 to 1000")),
    };
    let Some(bound) = w.instance_groups.get(instance) else {
        return Err(fail(404, "NoSuchInstance", "no such instance"));
    };
    // Every group of the fake is in its one VPC.
    let in_vpc: &[String] = if vpc == VPC { bound } else { &[] };
    let start = match given("marker") {
        None => 0,
        Some(m) => in_vpc
            .iter()
            .position(|g| g == m)
            .ok_or_else(|| fail(400, "InvalidMarker", "no such marker"))?,
    };
    let rest = &in_vpc[start..];
    let page: Vec<Value> = rest
        .iter()
        .take(max_keys)
        .map(|id| {
            json!({"id": id, "name": format!("name-{id}"), "vpcId": VPC, "desc": "",
                   "rules": [], "tags": [], "createdTime": "2024-01-01T00:00:00Z"})
        })
        .collect();
    let truncated = rest.len() > max_keys;
    let mut v = json!({"securityGroups": page, "isTruncated": truncated, "maxKeys": max_keys,
                       "marker": given("marker").cloned().unwrap_or_default()});
    if truncated {
        v["nextMarker"] = json!(rest[max_keys]);
    }
    Ok(v.to_string())
}

fn create(w: &mut World, body: &Value) -> Result<String, Fail> {
    let name = body["name"].as_str().unwrap_or("");
    if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_alphabetic()) || name.len() > 65 {
        return Err(fail(
            400,
            "InvalidName",
            "name must start with a letter, 1-65 chars",
        ));
    }
    if body["description"].as_str().unwrap_or("").chars().count() > 200 {
        return Err(fail(
            400,
            "InvalidDescription",
            "description must be at most 200 characters",
        ));
    }
    if body["subnetId"].as_str() != Some(SUBNET) {
        return Err(fail(400, "SubnetNotFound", "unknown subnet"));
    }
    let ips = body["privateIpSet"].as_array().cloned().unwrap_or_default();
    if ips.iter().filter(|ip| ip["primary"] == json!(true)).count() != 1 {
        return Err(fail(400, "InvalidPrivateIpSet", "exactly one primary IP"));
    }
    let id = w.add_eni(name, VPC, None);
    let e = w.enis.get_mut(&id).unwrap();
    e.description = body["description"].as_str().unwrap_or("").to_string();
    e.security_group_ids = body["securityGroupIds"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    Ok(json!({"eniId": id}).to_string())
}

fn attach(w: &mut World, id: &str, body: &Value) -> Result<String, Fail> {
    let Some(instance) = body["instanceId"].as_str() else {
        return Err(fail(400, "MissingParameter", "instanceId"));
    };
    let polls = w.transition_polls;
    let used = u32::try_from(w.secondaries_of_us()).expect("few fake ENIs");
    let quota = w.quota_total;
    let Some(e) = w.enis.get_mut(id) else {
        return Err(fail(404, "EniNotFound", "no such ENI"));
    };
    if e.status != "available" {
        return Err(fail(
            409,
            "EniStatusConflict",
            &format!("ENI is {}", e.status),
        ));
    }
    if instance == INSTANCE && used + 1 + 1 > quota {
        return Err(fail(
            400,
            "EniQuotaExceeded",
            "the instance cannot take more ENIs",
        ));
    }
    e.status = "attaching".into();
    e.instance_id = instance.to_string();
    e.pending.polls_left = polls;
    Ok(String::new())
}

fn batch_add(w: &mut World, id: &str, body: &Value) -> Result<String, Fail> {
    let ipv6 = body["isIpv6"].as_bool().unwrap_or(false);
    let count = body["privateIpAddressCount"].as_u64().unwrap_or(0);
    if body.get("privateIpAddresses").is_some() {
        return Err(fail(400, "NotInFake", "the fake assigns by count only"));
    }
    let Ok(count @ 1..=10) = usize::try_from(count) else {
        return Err(fail(
            400,
            "InvalidParameter",
            "privateIpAddressCount must be 1 to 10",
        ));
    };
    if ipv6 && !w.ipv6 {
        return Err(fail(
            400,
            "SubnetIpv6NotEnabled",
            "the subnet has no IPv6 block",
        ));
    }
    let quota = w.ips_per_eni as usize;
    let Some(e) = w.enis.get(id) else {
        return Err(fail(404, "EniNotFound", "no such ENI"));
    };
    let have = if ipv6 { e.ipv6_count() } else { e.ipv4_count() };
    if have + count > quota {
        return Err(fail(
            400,
            "PrivateIpQuotaExceeded",
            &format!("the ENI has {have} of {quota} addresses"),
        ));
    }
    let mut added = Vec::new();
    for _ in 0..count {
        let next = if ipv6 {
            w.free_ipv6().map(IpAddr::V6)
        } else {
            w.free_ipv4().map(IpAddr::V4)
        };
        let Some(ip) = next else {
            return Err(fail(400, "SubnetIpExhausted", "the subnet is full"));
        };
        w.enis.get_mut(id).unwrap().secondary_ips.push(ip);
        added.push(ip.to_string());
    }
    Ok(json!({"privateIpAddresses": added}).to_string())
}

fn batch_del(w: &mut World, id: &str, body: &Value) -> Result<String, Fail> {
    let ips: Vec<String> = body["privateIpAddresses"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if ips.is_empty() || ips.len() > 10 {
        return Err(fail(
            400,
            "InvalidParameter",
            "privateIpAddresses must list 1 to 10 addresses",
        ));
    }
    let Some(e) = w.enis.get_mut(id) else {
        return Err(fail(404, "EniNotFound", "no such ENI"));
    };
    let mut parsed = Vec::new();
    for raw in &ips {
        let ip: Option<IpAddr> = raw.parse().ok();
        match ip {
            Some(IpAddr::V4(a)) if a == e.ip => {
                return Err(fail(400, "PrimaryIpCannotDelete", "the primary IP stays"))
            }
            Some(ip) if e.secondary_ips.contains(&ip) => parsed.push(ip),
            _ => {
                return Err(fail(
                    400,
                    "PrivateIpNotOnEni",
                    &format!("{raw} is not a secondary IP of the ENI"),
                ))
            }
        }
    }
    e.secondary_ips.retain(|ip| !parsed.contains(ip));
    Ok(String::new())
}

/// A new name and description; the description is checked as on create.
fn modify(w: &mut World, id: &str, body: &Value) -> Result<String, Fail> {
    let description = body["description"].as_str().unwrap_or("");
    if description.chars().count() > 200 {
        return Err(fail(
            400,
            "InvalidDescription",
            "description must be at most 200 characters",
        ));
    }
    let Some(e) = w.enis.get_mut(id) else {
        return Err(fail(404, "EniNotFound", "no such ENI"));
    };
    if let Some(name) = body["name"].as_str() {
        e.name = name.to_string();
    }
    e.description = description.to_string();
    Ok(String::new())
}

fn detach(w: &mut World, id: &str, body: &Value) -> Result<String, Fail> {
    let polls = w.transition_polls;
    let Some(e) = w.enis.get_mut(id) else {
        return Err(fail(404, "EniNotFound", "no such ENI"));
    };
    if e.status != "inuse" || Some(e.instance_id.as_str()) != body["instanceId"].as_str() {
        return Err(fail(
            409,
            "EniStatusConflict",
            &format!("ENI is {}", e.status),
        ));
    }
    e.status = "detaching".into();
    e.pending.polls_left = polls;
    Ok(String::new())
}
