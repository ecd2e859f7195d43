//! Network namespaces made with `ip`, uniquely named and deleted on drop.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use enim_core::MacAddr;
use serde_json::Value;

use crate::unique;

/// Runs `cmd`; it must succeed (else its stderr is the panic's). Returns
/// its stdout.
pub fn run_ok(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed: {stderr}");
    out.stdout
}

/// Runs a command; it must succeed. Returns its stdout.
pub fn sh(args: &[&str]) -> String {
    let out = run_ok(Command::new(args[0]).args(&args[1..]));
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a command ran and succeeded.
pub fn sh_ok(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Feeds `lines` to `ip [-n ns] -batch -`: one process for many commands.
pub fn ip_batch(netns: Option<&str>, lines: &[String]) -> Result<(), String> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    let mut child = cmd
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn ip -batch: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("ip -batch: no stdin")?
        .write_all(lines.join("\n").as_bytes())
        .map_err(|e| format!("ip -batch: {e}"))?;
    let out = child
        .wait_with_output()
        .map_err(|e| format!("ip -batch: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip -batch: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Where `ip netns` keeps namespace `name`.
pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/netns/{name}"))
}

fn del_netns(name: &str) {
    let _ = Command::new("ip")
        .args(["netns", "del", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A named network namespace with a [`unique`] name, loopback up, deleted
/// on drop.
#[derive(Debug)]
pub struct NamedNetns {
    pub name: String,
}

impl NamedNetns {
    pub fn new(tag: &str) -> Self {
        let name = unique(tag);
        sh(&["ip", "netns", "add", &name]);
        // Deleted from here on, even if the next step fails.
        let ns = NamedNetns { name };
        sh(&["ip", "-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> PathBuf {
        netns_path(&self.name)
    }

    /// `ip -n <ns> <args>`; it must succeed.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        sh(&full)
    }

    /// `ip -n <ns> -j <args>`, parsed.
    pub fn ip_json(&self, args: &[&str]) -> Value {
        let mut full = vec!["-j"];
        full.extend_from_slice(args);
        serde_json::from_str(&self.ip(&full)).unwrap()
    }

    /// Runs a command inside the namespace; whether it succeeded.
    pub fn exec_ok(&self, args: &[&str]) -> bool {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        sh_ok(&full)
    }

    /// `ip -j link show` of one device, or None.
    pub fn link(&self, name: &str) -> Option<Value> {
        let out = Command::new("ip")
            .args(["-n", &self.name, "-j", "link", "show", "dev", name])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v.get(0).cloned()
    }

    /// Every link of the namespace (`ip -j link show`).
    pub fn links(&self) -> Vec<Value> {
        self.ip_json(&["link", "show"])
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub fn link_by_mac(&self, mac: MacAddr) -> Option<Value> {
        find_mac(&self.links(), &mac.to_string())
    }

    /// The device's addresses as `ip -j addr` shows them (with flags such
    /// as `nodad` and `tentative`).
    pub fn addr_info(&self, dev: &str) -> Vec<Value> {
        let v = self.ip_json(&["addr", "show", "dev", dev]);
        v[0]["addr_info"].as_array().unwrap().clone()
    }

    /// The device's address `local` as `ip -j addr` shows it, or None.
    pub fn addr(&self, dev: &str, local: &str) -> Option<Value> {
        self.addr_info(dev)
            .into_iter()
            .find(|a| a["local"] == local)
    }

    /// The device's addresses of global scope, as `addr/prefix`.
    pub fn addrs(&self, dev: &str) -> Vec<String> {
        self.addr_info(dev)
            .iter()
            .filter(|a| a["scope"] != "link" && a["scope"] != "host")
            .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
            .collect()
    }

    /// Every link's name, sorted.
    pub fn link_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .links()
            .iter()
            .map(|l| l["ifname"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    }
}

/// The link with MAC `mac` in a link dump.
pub fn find_mac(links: &[Value], mac: &str) -> Option<Value> {
    links
        .iter()
        .find(|l| l["address"].as_str() == Some(mac))
        .cloned()
}

impl Drop for NamedNetns {
    fn drop(&mut self) {
        del_netns(&self.name);
    }
}

/// Namespaces named `<tag>-<name>` (a tag the caller makes unique, so a
/// wrapper script can also delete them all should this process die without
/// dropping), made in batches and deleted in reverse order on drop.
pub struct NetnsSet {
    pub tag: String,
    made: Vec<String>,
}

impl NetnsSet {
    pub fn new(tag: &str) -> NetnsSet {
        NetnsSet {
            tag: tag.to_string(),
            made: Vec::new(),
        }
    }

    /// `<tag>-<name>`.
    pub fn name(&self, name: &str) -> String {
        format!("{}-{name}", self.tag)
    }

    /// Creates `<tag>-<name>` for each of `names`; returns the full names.
    pub fn add(&mut self, names: &[String]) -> Result<Vec<String>, String> {
        let full: Vec<String> = names.iter().map(|n| self.name(n)).collect();
        let lines: Vec<String> = full.iter().map(|n| format!("netns add {n}")).collect();
        // Record first: a half-done batch is still cleaned up.
        self.made.extend(full.iter().cloned());
        ip_batch(None, &lines)?;
        Ok(full)
    }
}

impl Drop for NetnsSet {
    fn drop(&mut self) {
        // Last made first: pods, then the host (its veths die with it), then
        // the gateway.
        for n in self.made.iter().rev() {
            del_netns(n);
        }
    }
}
