//! Where an ENI's device sits in the machine, from sysfs: its NUMA node and
//! its PCIe root complex, published as `numaNode` and the standard
//! `resource.kubernetes.io/pcieRoot` so that a claim can put the ENI beside
//! a GPU (`matchAttribute: resource.kubernetes.io/pcieRoot`).
//!
//! `/sys/class/net/<dev>/device` links to the PCI function, e.g.
//! `/sys/devices/pci0000:00/0000:00:03.0/0000:01:00.0`; the first component
//! under `/sys/devices` is the root complex, in the `pci<domain>:<bus>` form
//! the standard attribute uses. A device without that link (a veth, a
//! virtual function of no bus) has neither, and nothing is published.

use std::path::Path;

/// What sysfs says about one network device; `None` where it says nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    pub numa_node: Option<i64>,
    pub pcie_root: Option<String>,
}

/// Reads `ifname`'s topology under `sysfs` (`/sys` on a node; a fake tree
/// in tests). Never fails: what cannot be read is simply unknown.
pub fn read(sysfs: &Path, ifname: &str) -> Topology {
    // A name with a slash would walk out of class/net.
    if ifname.is_empty() || ifname.contains('/') || ifname == "." || ifname == ".." {
        return Topology::default();
    }
    let Ok(device) = sysfs
        .join("class/net")
        .join(ifname)
        .join("device")
        .canonicalize()
    else {
        return Topology::default();
    };
    let numa_node = std::fs::read_to_string(device.join("numa_node"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        // The kernel writes -1 when the platform has no NUMA information.
        .filter(|n| *n >= 0);
    let pcie_root = sysfs
        .join("devices")
        .canonicalize()
        .ok()
        .and_then(|devices| {
            device
                .strip_prefix(&devices)
                .ok()
                .and_then(|rest| rest.components().next())
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
        })
        .filter(|root| is_pci_root(root));
    Topology {
        numa_node,
        pcie_root,
    }
}

/// `pci<domain>:<bus>`: four and two hex digits.
fn is_pci_root(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("pci") else {
        return false;
    };
    let hex = |p: &str, n: usize| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit());
    matches!(rest.split_once(':'), Some((d, b)) if hex(d, 4) && hex(b, 2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake sysfs: `net` names → (PCI path under devices/, numa_node).
    fn tree(devs: &[(&str, Option<(&str, &str)>)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let class = root.path().join("class/net");
        std::fs::create_dir_all(&class).unwrap();
        for (name, pci) in devs {
            let dir = class.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            if let Some((path, numa)) = pci {
                let function = root.path().join("devices").join(path);
                std::fs::create_dir_all(&function).unwrap();
                std::fs::write(function.join("numa_node"), format!("{numa}\n")).unwrap();
                // Relative, as the kernel makes it.
                symlink(format!("../../../devices/{path}"), dir.join("device")).unwrap();
            }
        }
        root
    }

    #[test]
    fn a_pci_nic_has_its_numa_node_and_root_complex() {
        let t = tree(&[
            ("ens5", Some(("pci0000:00/0000:00:05.0", "0"))),
            ("ens6", Some(("pci0000:80/0000:80:01.0/0000:81:00.0", "1"))),
        ]);
        assert_eq!(
            read(t.path(), "ens5"),
            Topology {
                numa_node: Some(0),
                pcie_root: Some("pci0000:00".into())
            }
        );
        assert_eq!(
            read(t.path(), "ens6"),
            Topology {
                numa_node: Some(1),
                pcie_root: Some("pci0000:80".into())
            }
        );
    }

    #[test]
    fn no_numa_information_is_unknown_not_minus_one() {
        let t = tree(&[("ens5", Some(("pci0001:3a/0001:3a:00.0", "-1")))]);
        assert_eq!(
            read(t.path(), "ens5"),
            Topology {
                numa_node: None,
                pcie_root: Some("pci0001:3a".into())
            }
        );
    }

    #[test]
    fn a_veth_or_a_missing_device_has_nothing() {
        let t = tree(&[("veth0", None)]);
        assert_eq!(read(t.path(), "veth0"), Topology::default());
        assert_eq!(read(t.path(), "gone"), Topology::default());
        assert_eq!(read(t.path(), "../class"), Topology::default());
    }

    #[test]
    fn a_device_off_the_pci_tree_has_no_root() {
        // e.g. a platform device: devices/platform/...; its numa_node stays.
        let t = tree(&[("eth9", Some(("platform/soc/eth9dev", "0")))]);
        assert_eq!(
            read(t.path(), "eth9"),
            Topology {
                numa_node: Some(0),
                pcie_root: None
            }
        );
    }

    #[test]
    fn root_complex_names_are_checked() {
        assert!(is_pci_root("pci0000:00"));
        assert!(is_pci_root("pci00ff:1a"));
        assert!(!is_pci_root("pci0000:0"));
        assert!(!is_pci_root("platform"));
        assert!(!is_pci_root("pcixxxx:00"));
    }
}
