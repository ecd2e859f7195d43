//! The invariant the kernel tests check after every event: every ENI of a
//! [`Sandbox`] is either in a live pod, configured and recorded once, or
//! home and free; it reads the sandbox's namespaces and asks the agent
//! (`enimctl`), so it sits above both.

use enim_core::MacAddr;
use serde_json::Value;

use crate::agent::Agent;
use crate::fixtures::{HOST_MTU, POD_MTU};
use crate::netns::{find_mac, NamedNetns};
use crate::sandbox::Sandbox;

/// Every ENI is either (a) in a live pod netns under the pod's ifname,
/// configured and recorded once, or (b) in the host under its host name
/// with its host MTU, free in the provider and in no record. No record
/// points at a missing ENI. ENIs in `destroyed` (veth stand-ins that died
/// with their netns) must be free and unrecorded, wherever they are not.
pub fn assert_invariant(
    sb: &Sandbox,
    pods: &[&NamedNetns],
    agent: &Agent,
    destroyed: &[usize],
    when: &str,
) {
    let enis = agent.ctl(&["enis"]);
    let attachments = agent.attachments();
    // One link dump per namespace, not one per ENI: the soak checks this
    // after every event.
    let host_links = sb.host.links();
    let pod_links: Vec<Vec<Value>> = pods.iter().map(|p| p.links()).collect();
    for (i, eni) in sb.enis.iter().enumerate() {
        let mac = eni.mac.to_string();
        let status = enis["enis"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == eni.id.as_str())
            .unwrap();
        let records: Vec<_> = attachments
            .iter()
            .filter(|a| a["mac"] == mac.as_str())
            .collect();
        if destroyed.contains(&i) {
            assert_eq!(
                status["state"], "free",
                "{when}: destroyed ENI {i} is still held: {status}"
            );
            assert!(
                records.is_empty(),
                "{when}: destroyed ENI {i} is still recorded: {records:?}"
            );
            continue;
        }
        if let Some(link) = find_mac(&host_links, &mac) {
            assert_eq!(
                link["ifname"],
                format!("eni{i}"),
                "{when}: ENI {i} home name"
            );
            assert_eq!(link["mtu"], HOST_MTU, "{when}: ENI {i} home MTU");
            assert_eq!(
                status["state"], "free",
                "{when}: ENI {i} is home but the provider holds it: {status}"
            );
            assert!(
                records.is_empty(),
                "{when}: ENI {i} is home but recorded: {records:?}"
            );
            continue;
        }
        let (pod, link) = pods
            .iter()
            .zip(&pod_links)
            .find_map(|(p, links)| find_mac(links, &mac).map(|l| (p, l)))
            .unwrap_or_else(|| panic!("{when}: ENI {i} is neither home nor in a pod"));
        assert_eq!(link["ifname"], "eth0", "{when}: ENI {i} in pod");
        assert_eq!(link["mtu"], POD_MTU, "{when}: ENI {i} pod MTU");
        assert!(
            pod.addrs("eth0").contains(&format!("10.77.{i}.10/24")),
            "{when}: ENI {i} not configured"
        );
        assert!(
            pod.ip(&["route", "show", "default"])
                .contains(&format!("via 10.77.{i}.1")),
            "{when}: no default route"
        );
        assert_eq!(
            records.len(),
            1,
            "{when}: ENI {i} in a pod must be recorded once: {records:?}"
        );
        assert_eq!(records[0]["phase"], "ready", "{when}");
        assert_eq!(
            records[0]["netns"],
            pod.path().display().to_string(),
            "{when}"
        );
        assert_eq!(status["state"], "in_use", "{when}");
        assert_eq!(
            status["owner"]["container_id"], records[0]["container_id"],
            "{when}: two owners"
        );
    }
    for rec in &attachments {
        let mac: MacAddr = rec["mac"].as_str().unwrap().parse().unwrap();
        let held = pods.iter().zip(&pod_links).any(|(p, links)| {
            p.path().display().to_string() == rec["netns"]
                && find_mac(links, &mac.to_string()).is_some()
        });
        assert!(held, "{when}: record points at a missing ENI: {rec}");
    }
}
