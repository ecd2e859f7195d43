//! The host path's masquerade: enimd's own nftables table in the host
//! netns, so that a connection the node DNATs (a Service through
//! kube-proxy, a hostPort through `portmap`) and that touches a host path
//! is answered back through the node's conntrack.
//!
//! Why: a pod on a whole ENI answers everything but the host path's
//! prefixes over the ENI. A Service backend that is such a pod (on this
//! node, or a remote one when kube-proxy does not masquerade, which it
//! does not without `clusterCIDR`) would answer the client pod's own
//! address over the VPC, past the conntrack entry that must undo the DNAT:
//! the client never sees the reply. So the table masquerades
//!
//! - DNATed connections that came in from a host path veth (marked in
//!   prerouting with one conntrack mark bit, `[host_path] ct_mark`): Service
//!   traffic from an ENI pod to any backend, here or elsewhere;
//! - DNATed connections that go out to a host path veth: Service or
//!   hostPort traffic to a pod here, which then answers the node over its
//!   host path.
//!
//! Nothing else is touched: a pod's own traffic over its ENI never enters
//! the node's netns, and connections the node does not DNAT (the kubelet's
//! probes, the pod reaching the node) keep their source.
//!
//! The table is start-up state, not part of any ADD: applied once, whole,
//! before enimd serves (`nft -f -`, one transaction that creates, deletes
//! and remakes the table, so a restart converges and never duplicates a
//! rule). It needs no crash point: a crash leaves either the old table or
//! the new one, and the next start applies it again.
//!
//! Secondary mode has no table: its pods' only interface is a veth to the
//! host, so their replies pass the node's conntrack anyway.
//!
//! The rules are nft text written here rather than built with a JSON
//! crate: a dozen lines, no new dependency, and what an operator reads in
//! `nft list table inet enim` is the same text. Family `inet` holds both
//! IPv4 and IPv6 (NAT in `inet` needs Linux 5.2 or later).

use std::fmt::Write as _;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::hostpath::HostPathConfig;
use crate::netlink::netns::{run_in, Netns};
use crate::netlink::PlumbingError;

/// The table's family and name in the host netns.
pub const TABLE: &str = "inet enim";

/// A bound on one `nft` run: it talks to the kernel once, in milliseconds.
const NFT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum MasqueradeError {
    #[error("host path masquerade: cannot run `{command}` in {netns}: {source}")]
    Spawn {
        command: String,
        netns: String,
        #[source]
        source: std::io::Error,
    },
    #[error("host path masquerade: `{command}` in {netns} failed ({status}): {stderr}")]
    Failed {
        command: String,
        netns: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error("host path masquerade: `{command}` in {netns} did not finish within {NFT_TIMEOUT:?}")]
    TimedOut { command: String, netns: String },
    #[error("host path masquerade: {0}")]
    Netns(#[from] PlumbingError),
}

impl MasqueradeError {
    /// The `nft` binary itself is missing.
    fn is_not_found(&self) -> bool {
        matches!(self, MasqueradeError::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// The nft script that makes the table as `config` wants it, whatever was
/// there: the table is made (an empty declaration adds it when missing),
/// deleted and made again, in one transaction.
pub fn ruleset(config: &HostPathConfig) -> String {
    let veths = format!("\"{}*\"", config.veth_prefix);
    let bit = format!("{:#010x}", config.ct_mark);
    let mut s = String::with_capacity(1024);
    let _ = writeln!(s, "table {TABLE} {{}}");
    let _ = writeln!(s, "delete table {TABLE}");
    let _ = writeln!(s, "table {TABLE} {{");
    chain(
        &mut s,
        "host_path_mark",
        "filter hook prerouting priority mangle",
        &[format!(
            "iifname {veths} ct state new ct mark set ct mark | {bit} comment \"enim: from a host path\""
        )],
    );
    // fully-random, as kube-proxy's own masquerade: source ports picked at
    // random, so parallel connections do not race for the same one.
    chain(
        &mut s,
        "host_path_masquerade",
        "nat hook postrouting priority srcnat",
        &[
            format!(
                "ct status dnat ct mark & {bit} == {bit} masquerade fully-random comment \"enim: DNATed, from a host path\""
            ),
            format!(
                "oifname {veths} ct status dnat masquerade fully-random comment \"enim: DNATed, to a host path\""
            ),
        ],
    );
    let _ = writeln!(s, "}}");
    s
}

/// Writes the base chain `name` on `hook` (`type` and `priority`), which
/// accepts what its `rules` leave alone.
fn chain(s: &mut String, name: &str, hook: &str, rules: &[String]) {
    let _ = writeln!(s, "\tchain {name} {{");
    let _ = writeln!(s, "\t\ttype {hook}; policy accept;");
    for rule in rules {
        let _ = writeln!(s, "\t\t{rule}");
    }
    let _ = writeln!(s, "\t}}");
}

/// The nft script that removes the table, there or not.
pub fn removal() -> String {
    format!("table {TABLE} {{}}\ndelete table {TABLE}\n")
}

/// Start-up: makes the table in `host` (the netns holding the host path
/// veths) when `config` masquerades; a failure is enimd's start-up error.
/// Otherwise removes a table an earlier run left (the host path or its
/// masquerade turned off since), as best it can: a node without `nft` has
/// none to remove, and a failure is only logged.
pub async fn apply(config: &HostPathConfig, host: &Netns) -> Result<(), MasqueradeError> {
    if config.masquerades() {
        run_nft(&config.nft, host, ruleset(config)).await?;
        tracing::info!(table = TABLE, netns = %host.path().display(), veths = %format!("{}*", config.veth_prefix), ct_mark = %format!("{:#x}", config.ct_mark), "host path masquerade in place");
        return Ok(());
    }
    if let Err(e) = remove(&config.nft, host).await {
        tracing::warn!(error = %e, "could not remove an earlier masquerade table");
    }
    Ok(())
}

/// Removes the table from `host`, there or not: at a start without the
/// masquerade, and when enim is uninstalled (the node leaves). A node
/// without `nft` has no table to remove: that is not an error.
pub async fn remove(nft: &Path, host: &Netns) -> Result<(), MasqueradeError> {
    match run_nft(nft, host, removal()).await {
        Err(e) if e.is_not_found() => {
            tracing::debug!(error = %e, "no nft: no masquerade table to remove");
            Ok(())
        }
        done => done,
    }
}

/// Runs `nft -f -` inside `netns` with `script` on its stdin; its stderr
/// is the error when it fails.
async fn run_nft(nft: &Path, netns: &Netns, script: String) -> Result<(), MasqueradeError> {
    let command = format!("{} -f -", nft.display());
    let where_ = netns.path().display().to_string();
    let spawn_err = |source| MasqueradeError::Spawn {
        command: command.clone(),
        netns: where_.clone(),
        source,
    };
    let runtime = tokio::runtime::Handle::current();
    let program = nft.to_path_buf();
    // Spawned from the namespace thread while it is inside `netns`: the
    // child starts in the namespace of the thread that forks it.
    let child = run_in(netns, move || {
        // The child's reaper registers with the runtime: enter it here.
        let _guard = runtime.enter();
        Ok(tokio::process::Command::new(&program)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn())
    })
    .await?;
    let mut child = child.map_err(spawn_err)?;
    let finish = async {
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes()).await?;
            // Closed on drop: nft reads to the end of the script.
        }
        child.wait_with_output().await
    };
    let out = tokio::time::timeout(NFT_TIMEOUT, finish)
        .await
        .map_err(|_| MasqueradeError::TimedOut {
            command: command.clone(),
            netns: where_.clone(),
        })?
        .map_err(spawn_err)?;
    if !out.status.success() {
        return Err(MasqueradeError::Failed {
            command,
            netns: where_,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> HostPathConfig {
        HostPathConfig {
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap()],
            ..HostPathConfig::default()
        }
    }

    #[test]
    fn the_ruleset_remakes_the_table_whole() {
        let text = ruleset(&on());
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        // Made when missing, then deleted and made again: one transaction,
        // never a second copy of a rule.
        assert_eq!(
            lines[..3],
            [
                "table inet enim {}",
                "delete table inet enim",
                "table inet enim {"
            ]
        );
        assert!(
            text.contains("type filter hook prerouting priority mangle;"),
            "{text}"
        );
        assert!(
            text.contains("type nat hook postrouting priority srcnat;"),
            "{text}"
        );
        assert!(
            text.contains("iifname \"enih*\" ct state new ct mark set ct mark | 0x00200000"),
            "{text}"
        );
        assert!(
            text.contains("ct status dnat ct mark & 0x00200000 == 0x00200000 masquerade"),
            "{text}"
        );
        assert!(
            text.contains("oifname \"enih*\" ct status dnat masquerade"),
            "{text}"
        );
        assert_eq!(text.matches("masquerade fully-random").count(), 2, "{text}");
    }

    #[test]
    fn the_ruleset_follows_the_config() {
        let text = ruleset(&HostPathConfig {
            veth_prefix: "hp".into(),
            ct_mark: 0x1,
            ..on()
        });
        assert!(text.contains("iifname \"hp*\""), "{text}");
        assert!(text.contains("oifname \"hp*\""), "{text}");
        assert!(text.contains("ct mark | 0x00000001"), "{text}");
        assert!(!text.contains("enih"), "{text}");
    }

    #[test]
    fn removal_works_with_or_without_a_table() {
        assert_eq!(removal(), "table inet enim {}\ndelete table inet enim\n");
    }

    #[tokio::test]
    async fn a_missing_nft_is_told_apart() {
        // Entering a namespace, even the process's own, needs root.
        enim_testkit::require_kernel!();
        let ns = Netns::open(Path::new("/proc/self/ns/net")).unwrap();
        let err = run_nft(Path::new("/nonexistent/nft"), &ns, removal())
            .await
            .unwrap_err();
        assert!(err.is_not_found(), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/nft -f -"), "{msg}");
        // With the masquerade off, a node without nft starts all the same.
        let off = HostPathConfig {
            nft: "/nonexistent/nft".into(),
            ..HostPathConfig::default()
        };
        apply(&off, &ns).await.unwrap();
    }
}
