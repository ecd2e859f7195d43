//! Policy rules of enim's shape: one host-address selector, looked up in
//! one table, with an explicit `ToTable` action.

use std::net::IpAddr;

use rtnetlink::packet_route::route::RouteHeader;
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleMessage};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, IpVersion};

use super::{collect, host_prefix_len, tolerate, PlumbingError};

pub use super::route::MAIN_TABLE;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RuleSelector {
    /// `to <ip>/32` (or /128).
    To(IpAddr),
    /// `from <ip>/32` (or /128).
    From(IpAddr),
}

/// A policy rule of enim's shape: one host address selector, ToTable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnedRule {
    pub priority: u32,
    pub table: u32,
    pub selector: RuleSelector,
}

impl std::fmt::Display for OwnedRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.selector {
            RuleSelector::To(ip) => write!(f, "{}: to {ip} lookup {}", self.priority, self.table),
            RuleSelector::From(ip) => {
                write!(f, "{}: from {ip} lookup {}", self.priority, self.table)
            }
        }
    }
}

fn message(rule: &OwnedRule) -> RuleMessage {
    let mut msg = RuleMessage::default();
    let ip = match rule.selector {
        RuleSelector::To(ip) | RuleSelector::From(ip) => ip,
    };
    msg.header.family = if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    // Without an explicit action the kernel accepts the rule but every
    // lookup that hits it fails with EINVAL.
    msg.header.action = RuleAction::ToTable;
    match u8::try_from(rule.table) {
        Ok(table) => msg.header.table = table,
        Err(_) => {
            // Table ids above 255 only fit in FRA_TABLE.
            msg.header.table = RouteHeader::RT_TABLE_UNSPEC;
            msg.attributes.push(RuleAttribute::Table(rule.table));
        }
    }
    msg.attributes.push(RuleAttribute::Priority(rule.priority));
    match rule.selector {
        RuleSelector::To(ip) => {
            msg.header.dst_len = host_prefix_len(ip);
            msg.attributes.push(RuleAttribute::Destination(ip));
        }
        RuleSelector::From(ip) => {
            msg.header.src_len = host_prefix_len(ip);
            msg.attributes.push(RuleAttribute::Source(ip));
        }
    }
    msg
}

/// Reads back a rule of enim's shape, whatever its priority.
fn owned(msg: &RuleMessage) -> Option<OwnedRule> {
    if msg.header.action != RuleAction::ToTable {
        return None;
    }
    let mut priority = 0;
    let mut table = u32::from(msg.header.table);
    let (mut src, mut dst) = (None, None);
    for attr in &msg.attributes {
        match attr {
            RuleAttribute::Priority(p) => priority = *p,
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::Source(ip) => src = Some(*ip),
            RuleAttribute::Destination(ip) => dst = Some(*ip),
            // Anything more selective (iif, fwmark...) is someone else's.
            RuleAttribute::Iifname(_)
            | RuleAttribute::Oifname(_)
            | RuleAttribute::FwMark(_)
            | RuleAttribute::UidRange(_)
            | RuleAttribute::IpProtocol(_)
            | RuleAttribute::SourcePortRange(_)
            | RuleAttribute::DestinationPortRange(_) => return None,
            _ => {}
        }
    }
    let selector = match (src, dst) {
        (Some(ip), None) if msg.header.src_len == host_prefix_len(ip) => RuleSelector::From(ip),
        (None, Some(ip)) if msg.header.dst_len == host_prefix_len(ip) => RuleSelector::To(ip),
        _ => return None,
    };
    Some(OwnedRule {
        priority,
        table,
        selector,
    })
}

/// Every rule of enim's shape, of both families (two dumps).
pub async fn dump_owned(handle: &Handle) -> Result<Vec<OwnedRule>, PlumbingError> {
    let mut all = Vec::new();
    for version in [IpVersion::V4, IpVersion::V6] {
        let part = collect(handle.rule().get(version).execute(), "rule dump").await?;
        all.extend(part.iter().filter_map(owned));
    }
    Ok(all)
}

/// Adds `rule` unless it is there already.
pub async fn add(handle: &Handle, rule: &OwnedRule) -> Result<(), PlumbingError> {
    let mut req = handle.rule().add();
    *req.message_mut() = message(rule);
    tolerate(req.execute().await, &[libc::EEXIST], "add rule")
}

/// Deletes `rule`; done already when it is gone.
pub async fn delete(handle: &Handle, rule: &OwnedRule) -> Result<(), PlumbingError> {
    tolerate(
        handle.rule().del(message(rule)).execute().await,
        &[libc::ENOENT],
        "delete rule",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_round_trip_through_messages() {
        for rule in [
            OwnedRule {
                priority: 512,
                table: MAIN_TABLE,
                selector: RuleSelector::To("10.0.0.5".parse().unwrap()),
            },
            OwnedRule {
                priority: 1536,
                table: 1002,
                selector: RuleSelector::From("fd00::5".parse().unwrap()),
            },
        ] {
            let msg = message(&rule);
            assert_eq!(msg.header.action, RuleAction::ToTable);
            assert_eq!(owned(&msg), Some(rule));
        }
        let big = message(&OwnedRule {
            priority: 1536,
            table: 1002,
            selector: RuleSelector::From("10.0.0.5".parse().unwrap()),
        });
        assert!(big.attributes.contains(&RuleAttribute::Table(1002)));
        // A subnet selector is not enim's shape.
        let mut subnet = big.clone();
        subnet.header.src_len = 24;
        assert_eq!(owned(&subnet), None);
    }
}
