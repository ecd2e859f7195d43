//! `enimd install-cni`: puts the `enim` plugin binary into the CNI bin dir
//! and the conflist into net.d on the node (the DaemonSet's init container
//! runs it; see docs/deploy.md, "Kubernetes: deploy/").
//!
//! Both files are replaced atomically: the new content goes to a temporary
//! file in the same directory, is fsynced, then renamed over the final name,
//! and the directory is fsynced. So the runtime and kubelet (which watch and
//! exec these paths at any moment) see the old file, or the complete new
//! one, never half of either; a running `enim` keeps its old inode. Running
//! it again with the same inputs changes nothing.
//!
//! hostPort is not enim's: it is the reference `portmap` plugin's, chained
//! after enim with the `portMappings` capability (the runtime passes a
//! pod's port mappings only to plugins that declare it). `--portmap`
//! ([`PortmapMode`]) decides whether the conflist chains it; `auto` does
//! when the node's bin dir holds a portmap that speaks every CNI version
//! the conflist lists.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use enim_api::DEFAULT_SOCKET;
use enim_core::atomic_file::{self, FileError};

mod portmap;

pub use portmap::{
    check_portmap, PortmapChoice, PortmapMode, PortmapProblem, PORTMAP_NAME,
    PORTMAP_VERSION_TIMEOUT,
};

/// The plugin's file name in the CNI bin dir, which is also its `type`.
pub const PLUGIN_NAME: &str = "enim";
pub const DEFAULT_CNI_BIN_DIR: &str = "/opt/cni/bin";
pub const DEFAULT_NET_D_DIR: &str = "/etc/cni/net.d";
/// Runtimes use the lexicographically first conflist in net.d: "05-"
/// sorts before AWS VPC CNI's `10-aws.conflist` and Terway's
/// `10-terway.conflist`, so on a node migrating from them new pods get
/// enim while the pods already running keep their network.
pub const DEFAULT_CONFLIST_NAME: &str = "05-enim.conflist";
/// Names enim's conflist had before, removed at install when they hold an
/// enim conflist of this network (an upgraded node keeps one conflist).
pub const PREVIOUS_CONFLIST_NAMES: [&str; 1] = ["10-enim.conflist"];
pub const DEFAULT_NETWORK_NAME: &str = "enim";
/// The conflist's `cniVersion`: the newest that runtimes with a libcni
/// older than 1.2 can read results of (podman 4.3 refuses a 1.1.0 result
/// with "unsupported CNI result version"). They ignore `cniVersions`.
pub const CNI_VERSION: &str = "1.0.0";
/// The conflist's `cniVersions` (spec 1.1.0): a runtime that reads it
/// (libcni 1.2 and later) uses the newest it implements, 1.1.0, and so
/// calls STATUS and GC.
pub const CNI_VERSIONS: [&str; 2] = ["1.0.0", "1.1.0"];

const PLUGIN_MODE: u32 = 0o755;
const CONFLIST_MODE: u32 = 0o644;

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("plugin binary {path}: {source} (build `enim` next to enimd, or pass --plugin)")]
    Plugin { path: PathBuf, source: io::Error },
    #[error("plugin binary {path} is not a regular file")]
    PluginNotAFile { path: PathBuf },
    #[error("{0}")]
    Invalid(String),
    /// `--portmap always`, and the portmap it would chain is not there.
    #[error(
        "--portmap always: {problem}; put the CNI reference plugins' portmap there, \
         or pass --portmap auto to chain it only when it is"
    )]
    PortmapRequired { problem: PortmapProblem },
    #[error("{0}")]
    Io(#[from] FileError),
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> InstallError + 'a {
    move |source| FileError::at(what, path)(source).into()
}

/// What to install where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniInstall {
    /// The `enim` binary to copy.
    pub plugin: PathBuf,
    pub cni_bin_dir: PathBuf,
    pub net_d_dir: PathBuf,
    /// File name of the conflist in net.d; the runtime uses the
    /// lexicographically first file (see [`DEFAULT_CONFLIST_NAME`]).
    pub conflist_name: String,
    /// The CNI network name (part of every attachment's key).
    pub network_name: String,
    /// The agent's API socket, as the plugin will find it on the host.
    pub socket: PathBuf,
    /// Whether to chain `portmap` (hostPort) after enim.
    pub portmap: PortmapMode,
}

impl CniInstall {
    /// The defaults, with the plugin taken from `plugin`.
    pub fn with_plugin(plugin: PathBuf) -> CniInstall {
        CniInstall {
            plugin,
            cni_bin_dir: DEFAULT_CNI_BIN_DIR.into(),
            net_d_dir: DEFAULT_NET_D_DIR.into(),
            conflist_name: DEFAULT_CONFLIST_NAME.into(),
            network_name: DEFAULT_NETWORK_NAME.into(),
            socket: DEFAULT_SOCKET.into(),
            portmap: PortmapMode::default(),
        }
    }
}

/// What happened to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Replaced,
    /// Already there with the same content and mode; not touched.
    Unchanged,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub plugin: PathBuf,
    pub plugin_outcome: Outcome,
    pub conflist: PathBuf,
    pub conflist_outcome: Outcome,
    pub portmap: PortmapChoice,
    /// enim's conflists under a previous name, removed.
    pub removed: Vec<PathBuf>,
}

/// The default plugin source: `enim` next to the running executable.
pub fn default_plugin_path() -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| io::Error::other(format!("{} has no parent dir", exe.display())))?;
    Ok(dir.join(PLUGIN_NAME))
}

/// The conflist text for `network_name` and `socket`, with `portmap`
/// chained after enim or not.
pub fn conflist(network_name: &str, socket: &Path, portmap: bool) -> Result<String, InstallError> {
    let socket = socket
        .to_str()
        .ok_or_else(|| InstallError::Invalid(format!("socket {socket:?} is not UTF-8")))?;
    let mut plugins = vec![serde_json::json!({ "type": PLUGIN_NAME, "socket": socket })];
    if portmap {
        // Nothing else: portmap's `snat` already defaults to true (it
        // masquerades hairpin and localhost connections to a hostPort).
        plugins.push(serde_json::json!({
            "type": PORTMAP_NAME,
            "capabilities": { "portMappings": true },
        }));
    }
    let value = serde_json::json!({
        "cniVersion": CNI_VERSION,
        "cniVersions": CNI_VERSIONS,
        "name": network_name,
        "plugins": plugins,
    });
    let mut text = serde_json::to_string_pretty(&value)
        .map_err(|e| InstallError::Invalid(format!("encoding conflist: {e}")))?;
    text.push('\n');
    Ok(text)
}

fn validate(opts: &CniInstall) -> Result<(), InstallError> {
    validate_names(&opts.network_name, &opts.conflist_name)?;
    if !opts.socket.is_absolute() {
        return Err(InstallError::Invalid(format!(
            "socket {} must be an absolute path (the plugin runs with another cwd)",
            opts.socket.display()
        )));
    }
    Ok(())
}

/// The network's name and the conflist's file name, for install and
/// uninstall alike.
fn validate_names(network_name: &str, conflist_name: &str) -> Result<(), InstallError> {
    if !enim_api::model::naming::valid_container_id(network_name) {
        return Err(InstallError::Invalid(format!(
            "network name {network_name:?} is invalid: it must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$"
        )));
    }
    let name = conflist_name;
    // A bare file name: a path here would write outside net.d. Runtimes
    // read a `.conf` as a single plugin config, so only `.conflist` fits.
    if name.contains('/') || name.starts_with('.') || !name.ends_with(".conflist") {
        return Err(InstallError::Invalid(format!(
            "conflist name {name:?} must be a plain file name ending in .conflist"
        )));
    }
    Ok(())
}

/// What `opts.portmap` makes of the portmap in the CNI bin dir.
fn choose_portmap(opts: &CniInstall) -> Result<PortmapChoice, InstallError> {
    let path = opts.cni_bin_dir.join(PORTMAP_NAME);
    match opts.portmap {
        PortmapMode::Never => Ok(PortmapChoice::Off),
        PortmapMode::Always => match portmap::portmap_file(&path) {
            Ok(()) => Ok(PortmapChoice::Chained { path }),
            Err(problem) => Err(InstallError::PortmapRequired { problem }),
        },
        PortmapMode::Auto => Ok(match check_portmap(&path, PORTMAP_VERSION_TIMEOUT) {
            Ok(()) => PortmapChoice::Chained { path },
            Err(problem) => PortmapChoice::Unusable(problem),
        }),
    }
}

/// Installs the plugin, then the conflist.
pub fn install_cni(opts: &CniInstall) -> Result<Installed, InstallError> {
    validate(opts)?;
    let meta = std::fs::metadata(&opts.plugin).map_err(|source| InstallError::Plugin {
        path: opts.plugin.clone(),
        source,
    })?;
    if !meta.is_file() {
        return Err(InstallError::PluginNotAFile {
            path: opts.plugin.clone(),
        });
    }
    let binary = std::fs::read(&opts.plugin).map_err(|source| InstallError::Plugin {
        path: opts.plugin.clone(),
        source,
    })?;
    // Before anything is written: `always` without a portmap writes nothing.
    let portmap = choose_portmap(opts)?;
    let chained = matches!(portmap, PortmapChoice::Chained { .. });
    let conflist = conflist(&opts.network_name, &opts.socket, chained)?;

    // Binary first: a conflist naming a plugin that is not there yet would
    // make every pod sandbox fail until it is.
    let plugin_outcome = replace_file(&opts.cni_bin_dir, PLUGIN_NAME, PLUGIN_MODE, &binary)?;
    let conflist_outcome = replace_file(
        &opts.net_d_dir,
        &opts.conflist_name,
        CONFLIST_MODE,
        conflist.as_bytes(),
    )?;
    // After the new one is in place: the node is never without one.
    let removed = remove_previous(opts)?;
    Ok(Installed {
        plugin: opts.cni_bin_dir.join(PLUGIN_NAME),
        plugin_outcome,
        conflist: opts.net_d_dir.join(&opts.conflist_name),
        conflist_outcome,
        portmap,
        removed,
    })
}

/// Removes enim's conflists of this network under a previous default name
/// ([`PREVIOUS_CONFLIST_NAMES`]). A file there that is not one (another
/// CNI's, unreadable, not JSON) is left alone.
fn remove_previous(opts: &CniInstall) -> Result<Vec<PathBuf>, InstallError> {
    let mut removed = Vec::new();
    for name in PREVIOUS_CONFLIST_NAMES {
        if name == opts.conflist_name {
            continue;
        }
        let path = opts.net_d_dir.join(name);
        if remove_enim_conflist(&path, &opts.network_name)? == Removal::Removed {
            removed.push(path);
        }
    }
    Ok(removed)
}

/// What [`remove_enim_conflist`] did with a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Removed,
    /// Not there.
    Absent,
    /// There, but not enim's conflist of this network (another CNI's,
    /// unreadable, not JSON): left alone.
    NotEnims,
}

/// Removes `path` if it is enim's conflist of `network`.
fn remove_enim_conflist(path: &Path, network: &str) -> Result<Removal, InstallError> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Removal::Absent),
        Err(_) => return Ok(Removal::NotEnims),
    };
    if !is_enim_conflist(&text, network) {
        return Ok(Removal::NotEnims);
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(Removal::Removed),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Removal::Absent),
        Err(e) => Err(io_err("removing enim's conflist", path)(e)),
    }
}

/// What [`uninstall_cni`] removes: the files [`install_cni`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniUninstall {
    pub cni_bin_dir: PathBuf,
    pub net_d_dir: PathBuf,
    pub conflist_name: String,
    pub network_name: String,
}

/// What [`uninstall_cni`] did, per file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uninstalled {
    /// The conflist under its name and each previous default name.
    pub conflists: Vec<(PathBuf, Removal)>,
    pub plugin: (PathBuf, Removal),
}

/// Undoes [`install_cni`] on this node: enim's conflists first (so the
/// runtime stops choosing enim for new pods; a file of that name that is
/// another CNI's is left), then the plugin. Running pods keep their
/// network: their DEL then finds no plugin, which the runtime reports.
/// Idempotent.
pub fn uninstall_cni(opts: &CniUninstall) -> Result<Uninstalled, InstallError> {
    validate_names(&opts.network_name, &opts.conflist_name)?;
    let mut names = vec![opts.conflist_name.as_str()];
    names.extend(
        PREVIOUS_CONFLIST_NAMES
            .iter()
            .filter(|n| **n != opts.conflist_name),
    );
    let mut conflists = Vec::new();
    for name in names {
        let path = opts.net_d_dir.join(name);
        let done = remove_enim_conflist(&path, &opts.network_name)?;
        conflists.push((path, done));
    }
    let path = opts.cni_bin_dir.join(PLUGIN_NAME);
    let plugin = match std::fs::remove_file(&path) {
        Ok(()) => Removal::Removed,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Removal::Absent,
        Err(e) => return Err(io_err("removing the plugin", &path)(e)),
    };
    Ok(Uninstalled {
        conflists,
        plugin: (path, plugin),
    })
}

/// Whether `text` is a conflist of network `network` whose first plugin
/// is enim.
fn is_enim_conflist(text: &[u8], network: &str) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(text) else {
        return false;
    };
    v["name"] == network && v["plugins"][0]["type"] == PLUGIN_NAME
}

/// Makes `dir/name` hold exactly `contents` with `mode`, atomically; leaves
/// it alone when it already does.
pub fn replace_file(
    dir: &Path,
    name: &str,
    mode: u32,
    contents: &[u8],
) -> Result<Outcome, InstallError> {
    let target = dir.join(name);
    let existing = match std::fs::symlink_metadata(&target) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err("inspecting", &target)(e)),
    };
    if let Some(m) = &existing {
        if m.is_file()
            && m.mode() & 0o7777 == mode
            && m.len() == contents.len() as u64
            && std::fs::read(&target).map_err(io_err("reading", &target))? == contents
        {
            return Ok(Outcome::Unchanged);
        }
    }
    replace_file_with(dir, name, mode, |f| f.write_all(contents))?;
    Ok(if existing.is_some() {
        Outcome::Replaced
    } else {
        Outcome::Created
    })
}

/// The atomic replace itself ([`enim_core::atomic_file`]): `write` fills a
/// fresh temporary file in `dir`, which is fsynced and renamed over
/// `dir/name`, and the directory fsynced. If anything fails, `dir/name` is
/// untouched and the temporary file is removed.
pub fn replace_file_with(
    dir: &Path,
    name: &str,
    mode: u32,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), InstallError> {
    Ok(atomic_file::replace_with(
        dir,
        name,
        mode,
        atomic_file::Durability::FULL,
        write,
    )?)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::portmap::tests::{NEW, OLD};
    use super::*;
    use enim_testkit::cni::{dir_names, fake_portmap};

    fn mode_of(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().mode() & 0o7777
    }

    fn setup() -> (tempfile::TempDir, CniInstall) {
        let tmp = tempfile::tempdir().unwrap();
        let plugin = tmp.path().join("build/enim");
        std::fs::create_dir_all(plugin.parent().unwrap()).unwrap();
        std::fs::write(&plugin, b"\x7fELF plugin v1").unwrap();
        let opts = CniInstall {
            cni_bin_dir: tmp.path().join("opt/cni/bin"),
            net_d_dir: tmp.path().join("etc/cni/net.d"),
            ..CniInstall::with_plugin(plugin)
        };
        (tmp, opts)
    }

    #[test]
    fn installs_binary_and_conflist_with_exact_modes() {
        let (_tmp, opts) = setup();
        // A restrictive source mode must not leak into the installed file.
        std::fs::set_permissions(&opts.plugin, std::fs::Permissions::from_mode(0o600)).unwrap();
        let done = install_cni(&opts).unwrap();
        assert_eq!(done.plugin, opts.cni_bin_dir.join("enim"));
        assert_eq!(done.conflist, opts.net_d_dir.join("05-enim.conflist"));
        assert_eq!(done.plugin_outcome, Outcome::Created);
        assert_eq!(done.conflist_outcome, Outcome::Created);
        assert_eq!(std::fs::read(&done.plugin).unwrap(), b"\x7fELF plugin v1");
        assert_eq!(mode_of(&done.plugin), 0o755);
        assert_eq!(mode_of(&done.conflist), 0o644);
        // No temporary files left behind.
        assert_eq!(dir_names(&opts.cni_bin_dir), ["enim"]);
        assert_eq!(dir_names(&opts.net_d_dir), ["05-enim.conflist"]);

        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&done.conflist).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "cniVersion": "1.0.0",
                "cniVersions": ["1.0.0", "1.1.0"],
                "name": "enim",
                "plugins": [{ "type": "enim", "socket": "/run/enim/enimd.sock" }],
            })
        );
    }

    #[test]
    fn second_run_is_a_no_op_and_changes_are_applied() {
        let (_tmp, mut opts) = setup();
        let first = install_cni(&opts).unwrap();
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        let (bin_ino, conf_ino) = (ino(&first.plugin), ino(&first.conflist));

        let again = install_cni(&opts).unwrap();
        assert_eq!(again.plugin_outcome, Outcome::Unchanged);
        assert_eq!(again.conflist_outcome, Outcome::Unchanged);
        // Untouched, not rewritten with the same bytes.
        assert_eq!(ino(&again.plugin), bin_ino);
        assert_eq!(ino(&again.conflist), conf_ino);

        // A wrong mode alone is fixed.
        std::fs::set_permissions(&first.plugin, std::fs::Permissions::from_mode(0o700)).unwrap();
        let fixed = install_cni(&opts).unwrap();
        assert_eq!(fixed.plugin_outcome, Outcome::Replaced);
        assert_eq!(mode_of(&fixed.plugin), 0o755);

        // A new socket replaces the conflist.
        opts.socket = "/run/other/enimd.sock".into();
        let moved = install_cni(&opts).unwrap();
        assert_eq!(moved.plugin_outcome, Outcome::Unchanged);
        assert_eq!(moved.conflist_outcome, Outcome::Replaced);
        let text = std::fs::read_to_string(&moved.conflist).unwrap();
        assert!(text.contains("\"/run/other/enimd.sock\""), "{text}");
    }

    #[test]
    fn replacement_is_a_new_inode_and_the_old_one_stays_whole() {
        let (_tmp, opts) = setup();
        let first = install_cni(&opts).unwrap();
        // What a process that opened (or is running) the old file sees.
        let old = File::open(&first.plugin).unwrap();
        let old_ino = old.metadata().unwrap().ino();

        std::fs::write(&opts.plugin, b"\x7fELF plugin v2, longer than v1").unwrap();
        let second = install_cni(&opts).unwrap();
        assert_eq!(second.plugin_outcome, Outcome::Replaced);
        assert_ne!(std::fs::metadata(&second.plugin).unwrap().ino(), old_ino);
        // An in-place rewrite would have changed the old inode's bytes.
        let mut seen = Vec::new();
        io::Read::read_to_end(&mut &old, &mut seen).unwrap();
        assert_eq!(seen, b"\x7fELF plugin v1");
        assert_eq!(
            std::fs::read(&second.plugin).unwrap(),
            b"\x7fELF plugin v2, longer than v1"
        );
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("10-enim.conflist"), b"old, complete").unwrap();
        let err = replace_file_with(dir, "10-enim.conflist", 0o644, |f| {
            f.write_all(b"new, half")?;
            Err(io::Error::other("disk full"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("disk full"), "{err}");
        assert_eq!(
            std::fs::read(dir.join("10-enim.conflist")).unwrap(),
            b"old, complete"
        );
        assert_eq!(dir_names(dir), ["10-enim.conflist"]);
    }

    #[test]
    fn the_final_name_only_ever_shows_complete_content() {
        // Two large, distinct versions written alternately while a reader
        // polls the final name: every read must be one of them in full (or
        // nothing before the first rename). Writing in place would expose
        // truncated or mixed files here.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let a = Arc::new(vec![b'a'; 4 << 20]);
        let b = Arc::new(vec![b'b'; 3 << 20]);
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (dir, a, b, stop) = (dir.clone(), a.clone(), b.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut reads, mut bad) = (0u32, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match std::fs::read(dir.join("enim")) {
                        Ok(got) => {
                            reads += 1;
                            if got != *a && got != *b {
                                bad.push(got.len());
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        Err(e) => panic!("reading: {e}"),
                    }
                }
                (reads, bad)
            })
        };
        for i in 0..40 {
            let data = if i % 2 == 0 { &a } else { &b };
            replace_file(&dir, "enim", 0o755, data).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let (reads, bad) = reader.join().unwrap();
        assert!(
            bad.is_empty(),
            "{} partial reads, first lengths {:?}",
            bad.len(),
            &bad[..bad.len().min(8)]
        );
        assert!(reads > 0, "the reader never saw the file");
        assert_eq!(dir_names(&dir), ["enim"]);
    }

    #[test]
    fn uninstall_removes_what_install_made_and_nothing_of_another_cni() {
        let (_tmp, opts) = setup();
        install_cni(&opts).unwrap();
        let net_d = &opts.net_d_dir;
        // Another CNI's conflist, one under enim's previous name that is
        // not enim's, and enim's own under its previous name.
        std::fs::write(net_d.join("10-aws.conflist"), r#"{"name":"aws-cni"}"#).unwrap();
        let previous = net_d.join(PREVIOUS_CONFLIST_NAMES[0]);
        std::fs::write(&previous, conflist("enim", &opts.socket, false).unwrap()).unwrap();
        let un = CniUninstall {
            cni_bin_dir: opts.cni_bin_dir.clone(),
            net_d_dir: net_d.clone(),
            conflist_name: opts.conflist_name.clone(),
            network_name: opts.network_name.clone(),
        };
        let done = uninstall_cni(&un).unwrap();
        assert_eq!(
            done.conflists,
            [
                (net_d.join(&opts.conflist_name), Removal::Removed),
                (previous.clone(), Removal::Removed)
            ]
        );
        assert_eq!(
            done.plugin,
            (opts.cni_bin_dir.join(PLUGIN_NAME), Removal::Removed)
        );
        let mut left: Vec<_> = std::fs::read_dir(net_d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["10-aws.conflist"]);
        assert!(!opts.cni_bin_dir.join(PLUGIN_NAME).exists());
        // Again: nothing left to do, and no error.
        let again = uninstall_cni(&un).unwrap();
        assert!(again.conflists.iter().all(|c| c.1 == Removal::Absent));
        assert_eq!(again.plugin.1, Removal::Absent);
        // A file of enim's name that another CNI wrote is left alone; so
        // is enim's conflist of another network.
        let ours = net_d.join(&opts.conflist_name);
        std::fs::write(&ours, r#"{"name":"enim","plugins":[{"type":"bridge"}]}"#).unwrap();
        std::fs::write(&previous, conflist("other", &opts.socket, false).unwrap()).unwrap();
        let kept = uninstall_cni(&un).unwrap();
        assert!(kept.conflists.iter().all(|c| c.1 == Removal::NotEnims));
        assert!(ours.exists() && previous.exists());
        // Names that would reach outside net.d are refused.
        let bad = CniUninstall {
            conflist_name: "../x.conflist".into(),
            ..un
        };
        assert!(matches!(uninstall_cni(&bad), Err(InstallError::Invalid(_))));
    }

    #[test]
    fn clear_errors_for_bad_input() {
        let (_tmp, opts) = setup();
        let missing = CniInstall {
            plugin: opts.plugin.with_file_name("nope"),
            ..opts.clone()
        };
        let err = install_cni(&missing).unwrap_err().to_string();
        assert!(err.contains("nope") && err.contains("--plugin"), "{err}");
        // Nothing was written, not even the dirs.
        assert!(!opts.cni_bin_dir.exists() && !opts.net_d_dir.exists());

        let dir_plugin = CniInstall {
            plugin: opts.plugin.parent().unwrap().to_path_buf(),
            ..opts.clone()
        };
        assert!(matches!(
            install_cni(&dir_plugin),
            Err(InstallError::PluginNotAFile { .. })
        ));

        for (name, network, socket) in [
            ("../10-enim.conflist", "enim", "/run/enim/enimd.sock"),
            ("10-enim.conf", "enim", "/run/enim/enimd.sock"),
            ("10-enim.conflist", "bad name", "/run/enim/enimd.sock"),
            ("10-enim.conflist", "enim", "enimd.sock"),
        ] {
            let bad = CniInstall {
                conflist_name: name.into(),
                network_name: network.into(),
                socket: socket.into(),
                ..opts.clone()
            };
            assert!(
                matches!(install_cni(&bad), Err(InstallError::Invalid(_))),
                "{name} {network} {socket}"
            );
        }

        // A directory in the way of the conflist: named in the error.
        std::fs::create_dir_all(opts.net_d_dir.join("05-enim.conflist")).unwrap();
        let err = install_cni(&opts).unwrap_err().to_string();
        assert!(err.contains("05-enim.conflist"), "{err}");
    }
    #[test]
    fn conflist_text_alone_and_with_portmap() {
        let socket = Path::new("/run/enim/enimd.sock");
        // The text with `more` after enim's own entry in the chain.
        let text = |more: &str| {
            format!(
                r#"{{
  "cniVersion": "1.0.0",
  "cniVersions": [
    "1.0.0",
    "1.1.0"
  ],
  "name": "enim",
  "plugins": [
    {{
      "socket": "/run/enim/enimd.sock",
      "type": "enim"
    }}{more}
  ]
}}
"#
            )
        };
        // Alone: the text install-cni wrote before --portmap existed.
        assert_eq!(conflist("enim", socket, false).unwrap(), text(""));
        let portmap = r#",
    {
      "capabilities": {
        "portMappings": true
      },
      "type": "portmap"
    }"#;
        assert_eq!(conflist("enim", socket, true).unwrap(), text(portmap));
    }

    #[test]
    fn portmap_modes_choose_the_conflist() {
        let text = |p: &Path| std::fs::read_to_string(p).unwrap();
        let alone = conflist("enim", Path::new("/run/enim/enimd.sock"), false).unwrap();
        let chained = conflist("enim", Path::new("/run/enim/enimd.sock"), true).unwrap();

        // No portmap: auto leaves it out and says why; never does not look.
        let (_tmp, mut opts) = setup();
        let done = install_cni(&opts).unwrap();
        let portmap = opts.cni_bin_dir.join("portmap");
        assert_eq!(
            done.portmap,
            PortmapChoice::Unusable(PortmapProblem::Missing {
                path: portmap.clone()
            })
        );
        assert_eq!(text(&done.conflist), alone);
        opts.portmap = PortmapMode::Never;
        let done = install_cni(&opts).unwrap();
        assert_eq!(done.portmap, PortmapChoice::Off);
        assert_eq!(done.conflist_outcome, Outcome::Unchanged);

        // A portmap that speaks 1.1.0: auto chains it, replacing the
        // conflist; never takes it out again.
        fake_portmap(&opts.cni_bin_dir, NEW);
        opts.portmap = PortmapMode::Auto;
        let done = install_cni(&opts).unwrap();
        assert_eq!(
            done.portmap,
            PortmapChoice::Chained {
                path: portmap.clone()
            }
        );
        assert_eq!(done.conflist_outcome, Outcome::Replaced);
        assert_eq!(text(&done.conflist), chained);
        assert_eq!(
            install_cni(&opts).unwrap().conflist_outcome,
            Outcome::Unchanged
        );
        opts.portmap = PortmapMode::Never;
        let done = install_cni(&opts).unwrap();
        assert_eq!(done.conflist_outcome, Outcome::Replaced);
        assert_eq!(text(&done.conflist), alone);

        // One that stops at 1.0.0: auto leaves it out, always chains it.
        fake_portmap(&opts.cni_bin_dir, OLD);
        opts.portmap = PortmapMode::Auto;
        let done = install_cni(&opts).unwrap();
        assert_eq!(
            done.portmap,
            PortmapChoice::Unusable(PortmapProblem::LacksVersions {
                path: portmap.clone(),
                supported: OLD.iter().map(|v| v.to_string()).collect(),
                lacking: vec!["1.1.0".into()],
            })
        );
        assert_eq!(text(&done.conflist), alone);
        opts.portmap = PortmapMode::Always;
        let done = install_cni(&opts).unwrap();
        assert_eq!(done.portmap, PortmapChoice::Chained { path: portmap });
        assert_eq!(text(&done.conflist), chained);
    }

    #[test]
    fn always_without_portmap_writes_nothing() {
        let (_tmp, mut opts) = setup();
        opts.portmap = PortmapMode::Always;
        let err = install_cni(&opts).unwrap_err();
        assert!(
            matches!(
                &err,
                InstallError::PortmapRequired {
                    problem: PortmapProblem::Missing { .. }
                }
            ),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("--portmap always") && text.contains("opt/cni/bin/portmap"),
            "{text}"
        );
        assert!(!opts.cni_bin_dir.exists() && !opts.net_d_dir.exists());

        // Present but not executable, or not a file: the same.
        std::fs::create_dir_all(&opts.cni_bin_dir).unwrap();
        let portmap = opts.cni_bin_dir.join("portmap");
        std::fs::write(&portmap, "#!/bin/sh\n").unwrap();
        assert!(matches!(
            install_cni(&opts),
            Err(InstallError::PortmapRequired {
                problem: PortmapProblem::NotExecutable { .. }
            })
        ));
        std::fs::remove_file(&portmap).unwrap();
        std::fs::create_dir(&portmap).unwrap();
        assert!(matches!(
            install_cni(&opts),
            Err(InstallError::PortmapRequired {
                problem: PortmapProblem::NotAFile { .. }
            })
        ));
        assert_eq!(dir_names(&opts.cni_bin_dir), ["portmap"]);
        assert!(!opts.net_d_dir.exists());
    }
}
