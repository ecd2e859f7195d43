//! A node's cloud instance, read from its `spec.providerID`.
//!
//! - `aws:///<zone>/<instance id>` (the zone part may be empty or absent);
//! - `bce://<instance id>` and `cce://<instance id>`;
//! - anything else, or nothing: `static`, with the node's name as the
//!   instance id (the static backend knows nodes by name).

use enim_crd::Instance;

use super::NodeInfo;

pub fn instance_of(node: &NodeInfo) -> Instance {
    let (provider, id, zone) =
        parse(&node.provider_id).unwrap_or(("static", node.name.as_str(), ""));
    Instance {
        provider: provider.to_string(),
        id: id.to_string(),
        instance_type: node.instance_type.clone(),
        // The label wins; the providerID's zone fills in for a node without it.
        zone: if node.zone.is_empty() {
            zone.to_string()
        } else {
            node.zone.clone()
        },
    }
}

/// `(provider, instance id, zone)` of a providerID enim knows.
fn parse(provider_id: &str) -> Option<(&'static str, &str, &str)> {
    let (scheme, rest) = provider_id.split_once("://")?;
    match scheme {
        "aws" => {
            let mut parts = rest.trim_start_matches('/').rsplitn(2, '/');
            let id = parts.next().filter(|id| !id.is_empty())?;
            let zone = parts.next().unwrap_or("");
            Some(("aws", id, zone))
        }
        "bce" | "cce" => {
            let id = rest.trim_matches('/');
            (!id.is_empty() && !id.contains('/')).then_some(("bce", id, ""))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(provider_id: &str, zone: &str) -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            uid: "u".into(),
            provider_id: provider_id.into(),
            instance_type: "m5.large".into(),
            zone: zone.into(),
            labels: Default::default(),
        }
    }

    fn parsed(provider_id: &str, zone: &str) -> (String, String, String) {
        let i = instance_of(&node(provider_id, zone));
        assert_eq!(i.instance_type, "m5.large");
        (i.provider, i.id, i.zone)
    }

    #[test]
    fn provider_ids() {
        let t = |p: &str, i: &str, z: &str| (p.to_string(), i.to_string(), z.to_string());
        assert_eq!(
            parsed("aws:///us-east-1a/i-0123456789abcdef0", ""),
            t("aws", "i-0123456789abcdef0", "us-east-1a")
        );
        // The label's zone wins over the providerID's.
        assert_eq!(
            parsed("aws:///us-east-1a/i-1", "us-east-1b"),
            t("aws", "i-1", "us-east-1b")
        );
        assert_eq!(parsed("aws:///i-1", ""), t("aws", "i-1", ""));
        assert_eq!(parsed("bce://i-abc", "zoneA"), t("bce", "i-abc", "zoneA"));
        assert_eq!(parsed("cce://i-abc", ""), t("bce", "i-abc", ""));
        for other in [
            "",
            "kind://docker/x/node-a",
            "aws:///",
            "aws://zone/",
            "bce://",
            "bce://a/b",
            "i-123",
        ] {
            assert_eq!(parsed(other, ""), t("static", "node-a", ""), "{other:?}");
        }
    }
}
