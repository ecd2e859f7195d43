//! bce-auth-v1, re-derived here from Baidu's description: the fake's own
//! check of every API request's signature.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, Method};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::api::Fail;
use super::World;

/// The one key pair the fake's API knows at start (see `World::keys`).
pub const AK: &str = "ak-test-0123456789";
pub const SK: &str = "sk-test-secret";

fn enc(s: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        let c = b as char;
        if c.is_ascii_alphanumeric() || "-_.~".contains(c) || (keep_slash && c == '/') {
            out.push(c);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn dec(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 3 <= b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hmac_hex(key: &[u8], msg: &str) -> String {
    let mut m = Hmac::<Sha256>::new_from_slice(key).unwrap();
    m.update(msg.as_bytes());
    m.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(super) fn query_pairs(raw: &str) -> Vec<(String, String)> {
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (dec(k), dec(v)),
            None => (dec(p), String::new()),
        })
        .collect()
}

pub(super) fn verify(
    world: &World,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
) -> Result<(), Fail> {
    let deny = |code, msg: String| Err((403, code, msg));
    let Some(auth) = headers.get("authorization").and_then(|v| v.to_str().ok()) else {
        return deny("AccessDenied", "no Authorization header".into());
    };
    let parts: Vec<&str> = auth.splitn(6, '/').collect();
    if parts.len() != 6 || parts[0] != "bce-auth-v1" {
        return deny("InvalidHTTPAuthHeader", format!("bad auth string {auth:?}"));
    }
    let (ak, ts, exp, signed, sig) = (parts[1], parts[2], parts[3], parts[4], parts[5]);
    let Some(sk) = world.keys.get(ak) else {
        return deny("InvalidAccessKeyId", format!("unknown access key {ak}"));
    };
    let names: Vec<&str> = signed.split(';').collect();
    if !names.contains(&"host") || !names.contains(&"x-bce-date") {
        return deny(
            "AccessDenied",
            format!("host and x-bce-date must be signed, got {signed:?}"),
        );
    }
    let date = headers
        .get("x-bce-date")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if date != ts {
        return deny(
            "AccessDenied",
            "x-bce-date differs from the auth string".into(),
        );
    }
    let (Some(t), Ok(exp)) = (
        enim_provider_bce::auth::parse_timestamp(ts),
        exp.parse::<u64>(),
    ) else {
        return deny(
            "InvalidHTTPAuthHeader",
            "bad timestamp or expiration".into(),
        );
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if now > t + exp || t > now + 300 {
        return deny("RequestExpired", format!("signed at {ts}, valid {exp} s"));
    }
    let mut q: Vec<String> = query_pairs(query)
        .into_iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("authorization"))
        .map(|(k, v)| format!("{}={}", enc(&k, false), enc(&v, false)))
        .collect();
    q.sort();
    let mut h = Vec::new();
    for name in &names {
        let Some(v) = headers.get(*name).and_then(|v| v.to_str().ok()) else {
            return deny("AccessDenied", format!("signed header {name} missing"));
        };
        h.push(format!("{}:{}", enc(name, false), enc(v.trim(), false)));
    }
    h.sort();
    let canonical = format!(
        "{}\n{}\n{}\n{}",
        method.as_str(),
        enc(&dec(path), true),
        q.join("&"),
        h.join("\n")
    );
    let key = hmac_hex(sk.as_bytes(), &format!("bce-auth-v1/{ak}/{ts}/{exp}"));
    if hmac_hex(key.as_bytes(), &canonical) != sig {
        return deny(
            "SignatureDoesNotMatch",
            "the request signature does not match".into(),
        );
    }
    Ok(())
}
