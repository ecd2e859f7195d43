//! The agent's [`AttachmentResult`] as a CNI result of the version the
//! config asks for, alone or appended to a chain's prevResult.

use std::net::IpAddr;

use enim_api::model::{AttachmentResult, InterfaceConfig, IpConfig, RouteConfig};
use enim_api::MtuExpectation;
use serde_json::{json, Map, Value};

use super::config::CniVersion;
use super::CniError;

fn interface_json(i: &InterfaceConfig, v: CniVersion) -> Value {
    let mut obj = Map::new();
    obj.insert("name".into(), json!(i.name));
    obj.insert("mac".into(), json!(i.mac.to_string()));
    // `mtu` on interfaces arrived in 1.1.0; older readers reject nothing,
    // but the older schemas do not have it, so leave it out.
    if v >= CniVersion::V1_1_0 && i.mtu > 0 {
        obj.insert("mtu".into(), json!(i.mtu));
    }
    obj.insert("sandbox".into(), json!(i.sandbox.to_string_lossy()));
    Value::Object(obj)
}

fn ip_json(ip: &IpConfig, index: usize, v: CniVersion) -> Value {
    let mut obj = Map::new();
    if v == CniVersion::V0_4_0 {
        let family = match ip.address.addr() {
            IpAddr::V4(_) => "4",
            IpAddr::V6(_) => "6",
        };
        obj.insert("version".into(), json!(family));
    }
    obj.insert("interface".into(), json!(index));
    obj.insert("address".into(), json!(ip.address.to_string()));
    if let Some(gw) = ip.gateway {
        obj.insert("gateway".into(), json!(gw.to_string()));
    }
    Value::Object(obj)
}

fn route_json(r: &RouteConfig) -> Value {
    let mut obj = Map::new();
    obj.insert("dst".into(), json!(r.dst.to_string()));
    if let Some(gw) = r.gw {
        obj.insert("gw".into(), json!(gw.to_string()));
    }
    Value::Object(obj)
}

/// Takes a list out of prevResult, or an empty one if it has none.
fn take_list(prev: &mut Map<String, Value>, key: &str) -> Result<Vec<Value>, CniError> {
    match prev.remove(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(CniError::decode(
            format!("prevResult.{key} is not a list"),
            "",
        )),
    }
}

/// Fails if prevResult's lists are not lists, so ADD can refuse early.
pub fn check_prev_shape(prev: &Map<String, Value>) -> Result<(), CniError> {
    for key in ["interfaces", "ips", "routes"] {
        if !matches!(
            prev.get(key),
            None | Some(Value::Null) | Some(Value::Array(_))
        ) {
            return Err(CniError::decode(
                format!("prevResult.{key} is not a list"),
                "",
            ));
        }
    }
    Ok(())
}

/// The CNI result of ADD. With a prevResult, ours is appended to it (our
/// ips point at our interface's new index) and everything else it holds is
/// kept as it was.
pub fn add_result(
    ours: &AttachmentResult,
    version: CniVersion,
    prev: Option<Map<String, Value>>,
) -> Result<Value, CniError> {
    let mut out = prev.unwrap_or_default();
    let mut interfaces = take_list(&mut out, "interfaces")?;
    let mut ips = take_list(&mut out, "ips")?;
    let mut routes = take_list(&mut out, "routes")?;

    let index = interfaces.len();
    interfaces.push(interface_json(&ours.interface, version));
    // The host path's pod end follows; it has no addresses of its own.
    interfaces.extend(ours.host_path.iter().map(|i| interface_json(i, version)));
    ips.extend(ours.ips.iter().map(|ip| ip_json(ip, index, version)));
    routes.extend(ours.routes.iter().map(route_json));

    out.insert("cniVersion".into(), json!(version.as_str()));
    out.insert("interfaces".into(), Value::Array(interfaces));
    out.insert("ips".into(), Value::Array(ips));
    out.insert("routes".into(), Value::Array(routes));
    if !matches!(out.get("dns"), Some(Value::Object(_))) {
        out.insert("dns".into(), json!({}));
    }
    Ok(Value::Object(out))
}

/// Our interface's entry in a (final) prevResult: the one named `ifname`,
/// preferring one with a sandbox in case a host-side device shares the name.
fn find_ours<'a>(prev: &'a Map<String, Value>, ifname: &str) -> Option<&'a Map<String, Value>> {
    let named: Vec<&Map<String, Value>> = match prev.get("interfaces") {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_object)
            .filter(|i| i.get("name").and_then(Value::as_str) == Some(ifname))
            .collect(),
        _ => Vec::new(),
    };
    let in_sandbox = named.iter().find(|i| {
        i.get("sandbox")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
    });
    in_sandbox.or(named.first()).copied()
}

/// Which MTU CHECK should hold the interface to. Without a chain it is the
/// one enim recorded; in a chain a later plugin (tuning) may have changed
/// it, so the final result decides, and a result that carries no MTU
/// (before 1.1.0, or silent) means nothing can be checked.
pub fn mtu_expectation(
    prev: Option<&Map<String, Value>>,
    ifname: &str,
    version: CniVersion,
) -> MtuExpectation {
    let Some(prev) = prev else {
        return MtuExpectation::Recorded;
    };
    let mtu = find_ours(prev, ifname)
        .filter(|_| version >= CniVersion::V1_1_0)
        .and_then(|i| i.get("mtu"))
        .and_then(Value::as_u64)
        .and_then(|m| u32::try_from(m).ok())
        .filter(|m| *m > 0);
    match mtu {
        Some(m) => MtuExpectation::Exactly(m),
        None => MtuExpectation::Skip,
    }
}

/// CHECK with a prevResult: the interface the agent vouches for must be in
/// it. Only the name is compared: a chained plugin (tuning) may
/// legitimately change the MAC and MTU the result reports.
pub fn check_prev_result(
    ours: &AttachmentResult,
    prev: &Map<String, Value>,
) -> Result<(), CniError> {
    check_prev_shape(prev)?;
    let name = &ours.interface.name;
    if find_ours(prev, name).is_none() {
        return Err(CniError::check_mismatch(
            format!("prevResult has no interface {name:?}"),
            Value::Object(prev.clone()).to_string(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use enim_api::model::InterfaceConfig;

    fn ours(v6: bool) -> AttachmentResult {
        let mut ips = vec![IpConfig {
            address: "10.0.1.5/24".parse().unwrap(),
            gateway: Some("10.0.1.1".parse().unwrap()),
        }];
        let mut routes = vec![RouteConfig {
            dst: "0.0.0.0/0".parse().unwrap(),
            gw: Some("10.0.1.1".parse().unwrap()),
        }];
        if v6 {
            ips.push(IpConfig {
                address: "2001:db8::5/64".parse().unwrap(),
                gateway: None,
            });
            routes.push(RouteConfig {
                dst: "::/0".parse().unwrap(),
                gw: None,
            });
        }
        AttachmentResult {
            interface: InterfaceConfig {
                name: "eth0".into(),
                mac: "02:00:00:00:00:0a".parse().unwrap(),
                mtu: 9001,
                sandbox: PathBuf::from("/run/netns/p"),
            },
            host_path: None,
            ips,
            routes,
            eni_id: "eni-1".into(),
        }
    }

    #[test]
    fn host_path_is_a_second_interface_without_addresses() {
        let mut r = ours(false);
        r.host_path = Some(InterfaceConfig {
            name: "eth0-host".into(),
            mac: "02:00:00:00:00:0b".parse().unwrap(),
            mtu: 9001,
            sandbox: PathBuf::from("/run/netns/p"),
        });
        r.routes.push(RouteConfig {
            dst: "10.96.0.0/12".parse().unwrap(),
            gw: Some("169.254.1.1".parse().unwrap()),
        });
        let prev = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "lo0"}]});
        let prev = prev.as_object().cloned();
        let out = add_result(&r, CniVersion::V1_0_0, prev).unwrap();
        assert_eq!(
            out["interfaces"],
            json!([
                {"name": "lo0"},
                {"name": "eth0", "mac": "02:00:00:00:00:0a", "sandbox": "/run/netns/p"},
                {"name": "eth0-host", "mac": "02:00:00:00:00:0b", "sandbox": "/run/netns/p"}
            ])
        );
        // The addresses are the ENI's (index 1), none the host path's.
        assert_eq!(
            out["ips"],
            json!([{"interface": 1, "address": "10.0.1.5/24", "gateway": "10.0.1.1"}])
        );
        assert_eq!(
            out["routes"][1],
            json!({"dst": "10.96.0.0/12", "gw": "169.254.1.1"})
        );
    }

    #[test]
    fn v1_1_0() {
        let r = add_result(&ours(false), CniVersion::V1_1_0, None).unwrap();
        assert_eq!(
            r,
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:0a", "mtu": 9001, "sandbox": "/run/netns/p"}],
                "ips": [{"interface": 0, "address": "10.0.1.5/24", "gateway": "10.0.1.1"}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.1.1"}],
                "dns": {}
            })
        );
    }

    #[test]
    fn v1_0_0_has_no_mtu() {
        let r = add_result(&ours(false), CniVersion::V1_0_0, None).unwrap();
        assert_eq!(r["cniVersion"], "1.0.0");
        assert_eq!(
            r["interfaces"][0],
            json!({"name": "eth0", "mac": "02:00:00:00:00:0a", "sandbox": "/run/netns/p"})
        );
        assert!(r["ips"][0].get("version").is_none());
    }

    #[test]
    fn v0_4_0_has_ip_versions() {
        let r = add_result(&ours(true), CniVersion::V0_4_0, None).unwrap();
        assert_eq!(r["cniVersion"], "0.4.0");
        assert!(r["interfaces"][0].get("mtu").is_none());
        assert_eq!(
            r["ips"],
            json!([
                {"version": "4", "interface": 0, "address": "10.0.1.5/24", "gateway": "10.0.1.1"},
                {"version": "6", "interface": 0, "address": "2001:db8::5/64"}
            ])
        );
        assert_eq!(
            r["routes"],
            json!([{"dst": "0.0.0.0/0", "gw": "10.0.1.1"}, {"dst": "::/0"}])
        );
    }

    #[test]
    fn appended_to_prev_result() {
        let prev = json!({
            "cniVersion": "1.1.0",
            "interfaces": [
                {"name": "veth0", "mac": "02:00:00:00:00:01"},
                {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "/run/netns/p"}
            ],
            "ips": [{"interface": 1, "address": "192.168.0.2/24"}],
            "routes": [{"dst": "192.168.0.0/16"}],
            "dns": {"nameservers": ["1.1.1.1"]},
            "extra": true
        });
        let Value::Object(prev) = prev else {
            unreachable!()
        };
        let mut mine = ours(false);
        mine.interface.name = "net1".into();
        let r = add_result(&mine, CniVersion::V1_1_0, Some(prev)).unwrap();
        let ifs = r["interfaces"].as_array().unwrap();
        assert_eq!(ifs.len(), 3);
        assert_eq!(ifs[2]["name"], "net1");
        assert_eq!(
            r["ips"],
            json!([
                {"interface": 1, "address": "192.168.0.2/24"},
                {"interface": 2, "address": "10.0.1.5/24", "gateway": "10.0.1.1"}
            ])
        );
        assert_eq!(r["routes"].as_array().unwrap().len(), 2);
        assert_eq!(r["dns"], json!({"nameservers": ["1.1.1.1"]}));
        assert_eq!(r["extra"], true);
        assert_eq!(r["cniVersion"], "1.1.0");
    }

    #[test]
    fn sparse_prev_result() {
        let Value::Object(prev) = json!({"cniVersion": "1.0.0"}) else {
            unreachable!()
        };
        let r = add_result(&ours(false), CniVersion::V1_0_0, Some(prev)).unwrap();
        assert_eq!(r["ips"][0]["interface"], 0);
        assert_eq!(r["dns"], json!({}));

        let Value::Object(bad) = json!({"interfaces": {}}) else {
            unreachable!()
        };
        assert_eq!(
            add_result(&ours(false), CniVersion::V1_0_0, Some(bad))
                .unwrap_err()
                .code(),
            6
        );
    }

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn check_prev() {
        let me = ours(false);
        check_prev_result(
            &me,
            &obj(json!({"interfaces": [{"name": "lo"}, {"name": "eth0", "mac": "02:00:00:00:00:0A"}]})),
        )
        .unwrap();
        // tuning may have changed the MAC: still ours.
        check_prev_result(
            &me,
            &obj(json!({"interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:0b"}]})),
        )
        .unwrap();

        let e =
            check_prev_result(&me, &obj(json!({"interfaces": [{"name": "eth1"}]}))).unwrap_err();
        assert_eq!(e.code(), enim_api::code::CHECK_MISMATCH);
        assert!(e.to_string().contains("eth0"));
        assert_eq!(
            check_prev_result(&me, &obj(json!({}))).unwrap_err().code(),
            enim_api::code::CHECK_MISMATCH
        );
        assert_eq!(
            check_prev_result(&me, &obj(json!({"interfaces": 1})))
                .unwrap_err()
                .code(),
            6
        );
    }

    #[test]
    fn mtu_expectations() {
        use MtuExpectation::*;
        let v11 = CniVersion::V1_1_0;
        assert_eq!(mtu_expectation(None, "eth0", v11), Recorded);
        let prev = obj(json!({"interfaces": [
            {"name": "eth0", "mtu": 1400},
            {"name": "eth0", "mtu": 1300, "sandbox": "/run/netns/p"},
            {"name": "net1"},
        ]}));
        assert_eq!(mtu_expectation(Some(&prev), "eth0", v11), Exactly(1300));
        assert_eq!(mtu_expectation(Some(&prev), "net1", v11), Skip);
        assert_eq!(mtu_expectation(Some(&prev), "eth9", v11), Skip);
        assert_eq!(
            mtu_expectation(Some(&prev), "eth0", CniVersion::V1_0_0),
            Skip
        );
        let zero = obj(json!({"interfaces": [{"name": "eth0", "mtu": 0}]}));
        assert_eq!(mtu_expectation(Some(&zero), "eth0", v11), Skip);
    }
}
