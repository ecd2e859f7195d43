//! [`StaticFleet`]: the operator's [`FleetCloud`] over a fixed inventory
//! (labs, bare metal, the real-cluster e2e, where veth pairs stand in for
//! ENIs and are on their nodes already).
//!
//! The inventory is the config: per node, the ENIs attached to it from the
//! start. Nothing is ever made, moved or removed, so the listing is always
//! the same, every ENI attached to its node (instance id = node name) with
//! no creation time (so never reaped), and every verb that would change
//! the inventory refuses with a configuration error that says how to
//! change it instead. Attaching an ENI where it already is succeeds, as
//! the trait asks of every cloud.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use async_trait::async_trait;
use enim_core::{AddressCount, AddressLimits, LimitsConfig, ProviderError};
use enim_provider::cloud::Reaped;
use enim_provider::fleet::{CreateEni, DeleteCheck, FleetAttachment, FleetCloud, FleetEni, Slot};
use serde::{Deserialize, Serialize};

use crate::{validated, StaticEniConfig};

/// The operator's `static` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct StaticFleetConfig {
    /// Per node name, a list of the ENIs attached to it from the start, as
    /// `[[provider.enis]]` takes them (ids unique across the cluster).
    pub nodes: BTreeMap<String, Vec<StaticEniConfig>>,
    /// `{ enis, ipv4_per_eni, ipv6_per_eni }`, the limits of every instance
    /// type.
    ///
    /// Default: what the inventory holds (its largest node's ENIs, its
    /// ENIs' most addresses).
    #[serde(default)]
    pub limits: Option<LimitsConfig>,
}

/// The fixed inventory, validated, as the listing shows it.
#[derive(Debug)]
pub struct StaticFleet {
    enis: Vec<FleetEni>,
    limits: AddressLimits,
}

/// Why the inventory refuses `what`.
fn refused(what: &str) -> ProviderError {
    ProviderError::Config(format!(
        "a static inventory cannot {what}: change the operator's static config instead"
    ))
}

impl StaticFleet {
    /// Validates each node's ENIs as the agent's static provider does,
    /// ids across the cluster, and the limits against the inventory.
    pub fn new(config: &StaticFleetConfig) -> Result<StaticFleet, ProviderError> {
        let mut enis = Vec::new();
        let mut nodes_of: HashMap<String, &str> = HashMap::new();
        for (node, declared) in &config.nodes {
            if node.trim().is_empty() {
                return Err(ProviderError::Config(
                    "static fleet: a node has an empty name".into(),
                ));
            }
            let in_node = |e: ProviderError| match e {
                ProviderError::Config(m) => ProviderError::Config(format!("node {node:?}: {m}")),
                other => other,
            };
            for eni in validated(declared.clone()).map_err(in_node)? {
                if let Some(other) = nodes_of.insert(eni.id.clone(), node) {
                    return Err(ProviderError::Config(format!(
                        "static fleet: ENI {:?} is declared for nodes {other:?} and {node:?}",
                        eni.id
                    )));
                }
                let attachment = FleetAttachment {
                    instance: node.clone(),
                    // `validated` numbers every ENI.
                    device_index: eni.device_index.unwrap_or_default(),
                    attachment_id: String::new(),
                    state: "attached".into(),
                };
                let subnet = eni.ipv4.trunc().to_string();
                enis.push(FleetEni {
                    attachment: Some(attachment),
                    node: Some(node.clone()),
                    ..FleetEni::addressed(eni, subnet, Vec::new())
                });
            }
        }
        let held = inventory_limits(&config.nodes);
        let limits = match config.limits {
            None => held,
            Some(l) => {
                let stated = AddressLimits::from(l);
                check_covers(&stated, &held)?;
                stated
            }
        };
        Ok(StaticFleet { enis, limits })
    }
}

/// What the inventory holds at the most: a node's ENIs (its own interface
/// counted) and an ENI's addresses (its own counted).
fn inventory_limits(nodes: &BTreeMap<String, Vec<StaticEniConfig>>) -> AddressLimits {
    let all = nodes.values().flatten();
    let ipv6_own = |e: &StaticEniConfig| usize::from(e.ipv6.is_some());
    AddressLimits {
        enis: 1 + nodes.values().map(Vec::len).max().unwrap_or(0),
        ipv4_per_eni: 1 + all
            .clone()
            .map(|e| e.secondary_ipv4.len())
            .max()
            .unwrap_or(0),
        ipv6_per_eni: all
            .map(|e| ipv6_own(e) + e.secondary_ipv6.len())
            .max()
            .unwrap_or(0),
    }
}

/// Stated limits below what the inventory holds would have the operator
/// see nodes over their limits from the start.
fn check_covers(stated: &AddressLimits, held: &AddressLimits) -> Result<(), ProviderError> {
    for (key, s, h) in [
        ("enis", stated.enis, held.enis),
        ("ipv4_per_eni", stated.ipv4_per_eni, held.ipv4_per_eni),
        ("ipv6_per_eni", stated.ipv6_per_eni, held.ipv6_per_eni),
    ] {
        if s < h {
            return Err(ProviderError::Config(format!(
                "static fleet: limits.{key} ({s}) is below what the inventory holds ({h})"
            )));
        }
    }
    Ok(())
}

#[async_trait]
impl FleetCloud for StaticFleet {
    fn name(&self) -> &str {
        "static"
    }

    async fn list_cluster_enis(&self) -> Result<Vec<FleetEni>, ProviderError> {
        Ok(self.enis.clone())
    }

    async fn limits(&self, _instance_type: &str) -> Result<AddressLimits, ProviderError> {
        Ok(self.limits)
    }

    async fn create(&self, req: &CreateEni) -> Result<FleetEni, ProviderError> {
        Err(refused(&format!(
            "create ENIs (asked for one for {}): add them to the config",
            req.instance
        )))
    }

    /// By the inventory, not by what `eni` says: nothing moves here.
    async fn attach(&self, eni: &FleetEni, at: Slot<'_>) -> Result<(), ProviderError> {
        let eni_id = eni.id.as_str();
        let eni = self
            .enis
            .iter()
            .find(|e| e.id == eni_id)
            .ok_or_else(|| ProviderError::UnknownEni(eni_id.into()))?;
        match &eni.attachment {
            Some(a) if a.slot() == at => Ok(()),
            _ => Err(refused(&format!("move ENI {eni_id} to {at}"))),
        }
    }

    async fn start_detach(&self, eni: &FleetEni) -> Result<(), ProviderError> {
        Err(refused(&format!("detach ENI {}", eni.id)))
    }

    async fn delete(&self, eni_id: &str, _: DeleteCheck) -> Result<Reaped, ProviderError> {
        Err(refused(&format!("delete ENI {eni_id}")))
    }

    async fn assign(&self, eni_id: &str, _: AddressCount) -> Result<Vec<IpAddr>, ProviderError> {
        Err(refused(&format!(
            "assign addresses to ENI {eni_id}: list them in its secondary_ipv4/secondary_ipv6"
        )))
    }

    async fn unassign(&self, eni_id: &str, _ips: &[IpAddr]) -> Result<(), ProviderError> {
        Err(refused(&format!("unassign addresses of ENI {eni_id}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use enim_provider::cloud::CreatedAt;

    const TEXT: &str = r#"
        [[nodes.node-a]]
        id = "eni-a0"
        mac = "02:e5:00:00:00:01"
        ipv4 = "10.251.0.10/24"
        gateway4 = "10.251.0.1"
        secondary_ipv4 = ["10.251.0.11", "10.251.0.12"]

        [[nodes.node-a]]
        id = "eni-a1"
        mac = "02:e5:00:00:01:01"
        ipv4 = "10.251.1.10/24"
        gateway4 = "10.251.1.1"
        device_index = 5

        [[nodes.node-b]]
        id = "eni-b0"
        mac = "02:e5:00:00:00:01"
        ipv4 = "10.252.0.10/24"
        gateway4 = "10.252.0.1"
        ipv6 = "fd00::10/64"
        gateway6 = "fd00::1"
    "#;

    fn config(text: &str) -> StaticFleetConfig {
        toml::from_str(text).unwrap()
    }

    #[tokio::test]
    async fn the_inventory_is_listed_attached_to_its_nodes_and_never_reaped() {
        let fleet = StaticFleet::new(&config(TEXT)).unwrap();
        assert_eq!(fleet.name(), "static");
        let enis = fleet.list_cluster_enis().await.unwrap();
        let seen: Vec<(&str, &str, u32)> = enis
            .iter()
            .map(|e| {
                let a = e.attachment.as_ref().expect("attached from the start");
                assert_eq!(a.state, "attached");
                assert_eq!(e.node.as_deref(), Some(a.instance.as_str()));
                assert_eq!(e.created_at, CreatedAt::Missing, "never reaped");
                assert_eq!(e.intent, None);
                (e.id.as_str(), a.instance.as_str(), a.device_index)
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("eni-a0", "node-a", 1),
                ("eni-a1", "node-a", 5),
                ("eni-b0", "node-b", 1)
            ]
        );
        let a0 = &enis[0];
        assert_eq!(a0.subnet, "10.251.0.0/24");
        assert_eq!(a0.gateway4.to_string(), "10.251.0.1");
        let secondaries: Vec<String> = a0.secondary_ips.iter().map(|ip| ip.to_string()).collect();
        assert_eq!(secondaries, ["10.251.0.11", "10.251.0.12"]);
        assert_eq!(
            enis[2].ipv6.map(|n| n.to_string()).as_deref(),
            Some("fd00::10/64")
        );
        // Same listing every time: nothing changes it.
        assert_eq!(fleet.list_cluster_enis().await.unwrap(), enis);

        // Limits from what the inventory holds: node-a's two ENIs and its
        // own interface, eni-a0's three addresses, eni-b0's one IPv6.
        let want = AddressLimits {
            enis: 3,
            ipv4_per_eni: 3,
            ipv6_per_eni: 1,
        };
        assert_eq!(fleet.limits("any").await.unwrap(), want);
    }

    #[tokio::test]
    async fn every_change_is_refused_but_an_attach_where_it_is() {
        let fleet = StaticFleet::new(&config(TEXT)).unwrap();
        let listed = fleet.list_cluster_enis().await.unwrap();
        let a1 = &listed[1];
        assert_eq!(a1.id, "eni-a1");
        fleet.attach(a1, Slot::new("node-a", 5)).await.unwrap();
        let req = CreateEni {
            instance: "node-a".into(),
            subnet: "s".into(),
            security_groups: vec![],
            client_token: "t".into(),
            secondary_ipv4: 0,
            fresh: true,
        };
        let ip: IpAddr = "10.251.0.11".parse().unwrap();
        let refusals = [
            fleet.create(&req).await.map(drop).unwrap_err(),
            fleet.attach(a1, Slot::new("node-b", 5)).await.unwrap_err(),
            fleet.attach(a1, Slot::new("node-a", 2)).await.unwrap_err(),
            fleet.start_detach(&listed[0]).await.unwrap_err(),
            fleet
                .delete("eni-a0", DeleteCheck::Listed)
                .await
                .map(drop)
                .unwrap_err(),
            fleet
                .delete("eni-a0", DeleteCheck::SecondLook)
                .await
                .map(drop)
                .unwrap_err(),
            fleet
                .assign("eni-a0", AddressCount::v4(1))
                .await
                .map(drop)
                .unwrap_err(),
            fleet.unassign("eni-a0", &[ip]).await.unwrap_err(),
        ];
        for e in refusals {
            assert!(
                matches!(&e, ProviderError::Config(m) if m.contains("a static inventory cannot")),
                "{e}"
            );
            assert!(!e.is_transient(), "retrying cannot help: {e}");
        }
        let e = fleet.create(&req).await.unwrap_err();
        assert!(e.to_string().contains("add them to the config"), "{e}");
        let unknown = FleetEni {
            id: "eni-zz".into(),
            ..a1.clone()
        };
        assert_eq!(
            fleet
                .attach(&unknown, Slot::new("node-a", 1))
                .await
                .unwrap_err(),
            ProviderError::UnknownEni("eni-zz".into())
        );
    }

    #[test]
    fn config_errors_are_named() {
        let e = toml::from_str::<StaticFleetConfig>("nodez = {}").unwrap_err();
        assert!(e.to_string().contains("nodez"), "{e}");
        let e = toml::from_str::<StaticFleetConfig>(&format!(
            "{TEXT}\n[limits]\nenis = 4\nipv4_per_eni = 3\nipv6 = 1"
        ))
        .unwrap_err();
        assert!(e.to_string().contains("ipv6"), "{e}");

        let reject = |c: StaticFleetConfig, needle: &str| {
            let e = StaticFleet::new(&c).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        };
        // One id on two nodes.
        let mut c = config(TEXT);
        let mut dup = c.nodes["node-a"][0].clone();
        dup.mac = "02:e5:00:00:09:01".parse().unwrap();
        c.nodes.get_mut("node-b").unwrap().push(dup);
        reject(c, "declared for nodes \"node-a\" and \"node-b\"");
        // A node's own list is checked as the agent checks it, and named.
        let mut c = config(TEXT);
        c.nodes.get_mut("node-a").unwrap()[1].mac = "02:e5:00:00:00:01".parse().unwrap();
        reject(c, "node \"node-a\": ENI \"eni-a1\": MAC");
        // Limits below the inventory, and above it.
        let with_limits = |enis, ipv4_per_eni, ipv6_per_eni| StaticFleetConfig {
            limits: Some(LimitsConfig {
                enis,
                ipv4_per_eni,
                ipv6_per_eni,
            }),
            ..config(TEXT)
        };
        reject(
            with_limits(2, 8, 8),
            "limits.enis (2) is below what the inventory holds (3)",
        );
        let c = with_limits(8, 8, 2);
        let fleet = StaticFleet::new(&c).unwrap();
        assert_eq!(fleet.limits.enis, 8);
    }
}
