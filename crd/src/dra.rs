//! How ENIs look to DRA claims, for both sides: the agent publishes each
//! ENI as a device with these names, and the operator writes claim
//! templates (for an [`EniPolicy`](crate::EniPolicy)'s pods) that select
//! by them. One place, so the two can never disagree on a name.

/// The DRA driver's name, also the domain of the devices' own attributes.
pub const DRIVER: &str = "enim.io";
/// The DeviceClass of an ENI.
pub const DEVICE_CLASS: &str = "eni.enim.io";
/// The domain of the per-group attributes (`sg.enim.io/sg_0abc: true`).
pub const SG_DOMAIN: &str = "sg.enim.io";
/// The attribute counting a device's security groups.
pub const SG_COUNT: &str = "securityGroupCount";
/// The API's limit on an attribute's name (the part after the domain).
const MAX_ID: usize = 32;

/// A group id as an attribute name: every character that is not a letter
/// or digit becomes `_`, and a leading digit gets a `_` before it (a C
/// identifier). `None` when it would be longer than the API allows.
pub fn group_attribute(group: &str) -> Option<String> {
    let mut id: String = group
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if id.starts_with(|c: char| c.is_ascii_digit()) {
        id.insert(0, '_');
    }
    (!id.is_empty() && id.len() <= MAX_ID).then_some(id)
}

/// The CEL selector of a device guarded by exactly `groups`: each group's
/// attribute true (`.?…orValue(false)`, so that a device without one is
/// no match rather than an error that aborts the claim) and the count
/// equal. `Err` names a group no attribute can carry.
pub fn exactly_groups(groups: &[String]) -> Result<String, String> {
    let mut terms = Vec::with_capacity(groups.len() + 1);
    for group in groups {
        let id = group_attribute(group).ok_or_else(|| {
            format!("security group {group:?} cannot be a device attribute (at most {MAX_ID} characters)")
        })?;
        terms.push(format!(
            "device.attributes[\"{SG_DOMAIN}\"].?{id}.orValue(false)"
        ));
    }
    terms.push(format!(
        "device.attributes[\"{DRIVER}\"].?{SG_COUNT}.orValue(0) == {}",
        groups.len()
    ));
    Ok(terms.join(" && "))
}

/// The device attribute naming a device's subnet (in [`DRIVER`]'s domain).
pub const SUBNET: &str = "subnet";

/// The CEL selector of a device in one of `subnets` (a device that names
/// no subnet is no match). The ids are quoted as JSON strings, which CEL
/// reads the same.
pub fn in_subnets(subnets: &[&str]) -> String {
    let quoted: Vec<String> = subnets
        .iter()
        .map(|s| serde_json::Value::from(*s).to_string())
        .collect();
    format!(
        "device.attributes[\"{DRIVER}\"].?{SUBNET}.orValue(\"\") in [{}]",
        quoted.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_attributes_are_c_identifiers_within_the_limit() {
        assert_eq!(group_attribute("sg-0abc").as_deref(), Some("sg_0abc"));
        assert_eq!(group_attribute("0db").as_deref(), Some("_0db"));
        assert_eq!(group_attribute(""), None);
        assert_eq!(group_attribute(&"a".repeat(33)), None);
    }

    #[test]
    fn exactly_groups_asks_for_each_group_and_their_count() {
        let groups = vec!["sg-web".to_string(), "sg-0db".to_string()];
        assert_eq!(
            exactly_groups(&groups).unwrap(),
            "device.attributes[\"sg.enim.io\"].?sg_web.orValue(false) && \
             device.attributes[\"sg.enim.io\"].?sg_0db.orValue(false) && \
             device.attributes[\"enim.io\"].?securityGroupCount.orValue(0) == 2"
        );
        assert!(exactly_groups(&["x".repeat(40)])
            .unwrap_err()
            .contains("cannot be"));
    }

    #[test]
    fn in_subnets_quotes_each_id() {
        assert_eq!(
            in_subnets(&["subnet-a", "subnet-\"b"]),
            "device.attributes[\"enim.io\"].?subnet.orValue(\"\") in [\"subnet-a\", \"subnet-\\\"b\"]"
        );
    }
}
