//! `enimd install-cni` as the init container runs it: the real binary, temp
//! dirs standing in for /opt/cni/bin and /etc/cni/net.d.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use enim_cni::NetConf;
use enim_testkit::cni::{dir_names, fake_portmap};

const ENIMD: &str = env!("CARGO_BIN_EXE_enimd");

/// The plugin, built beside enimd (where install-cni looks for it).
fn enim() -> PathBuf {
    enim_testkit::plugin::built_beside(Path::new(ENIMD))
}

/// Runs enimd under umask 077, so modes that merely follow the umask fail.
/// The plugin is built first: install-cni copies it from beside enimd.
fn enimd(args: &[&str]) -> Output {
    enim();
    Command::new("sh")
        .arg("-c")
        .arg("umask 077; exec \"$0\" \"$@\"")
        .arg(ENIMD)
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What `plugin` prints when asked for its VERSION with `conf` on stdin.
fn version_answer(plugin: &Path, conf: &[u8]) -> Vec<u8> {
    let mut child = Command::new(plugin)
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), conf).unwrap();
    child.wait_with_output().unwrap().stdout
}

struct Dirs {
    _tmp: tempfile::TempDir,
    bin: PathBuf,
    netd: PathBuf,
}

impl Dirs {
    fn new() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        Dirs {
            bin: tmp.path().join("opt/cni/bin"),
            netd: tmp.path().join("etc/cni/net.d"),
            _tmp: tmp,
        }
    }

    fn args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec![
            "install-cni",
            "--cni-bin-dir",
            self.bin.to_str().unwrap(),
            "--net-d-dir",
            self.netd.to_str().unwrap(),
        ];
        v.extend_from_slice(extra);
        v
    }

    fn conflist(&self) -> PathBuf {
        self.netd.join("05-enim.conflist")
    }

    /// Runs install-cni into these dirs with `extra` flags; it must succeed.
    fn install(&self, extra: &[&str]) -> Output {
        let out = enimd(&self.args(extra));
        assert!(out.status.success(), "{}", text(&out.stderr));
        out
    }
}

/// The network config the runtime hands the plugin for the first entry of
/// the conflist (libcni copies `name` and `cniVersion` into it).
fn plugin_netconf(conflist: &Path) -> NetConf {
    let list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(conflist).unwrap()).unwrap();
    let plugins = list["plugins"].as_array().unwrap();
    assert_eq!(plugins.len(), 1, "{list}");
    assert_eq!(plugins[0]["type"], "enim");
    let mut conf = plugins[0].clone();
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    NetConf::parse(conf.to_string().as_bytes()).unwrap()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn installs_the_plugin_next_to_enimd_and_a_conflist_the_plugin_accepts() {
    let d = Dirs::new();
    let out = d.install(&[]);
    let stdout = text(&out.stdout);
    assert_eq!(stdout.matches(": created").count(), 2, "{stdout}");

    // The default plugin is the `enim` built next to enimd.
    let installed = d.bin.join("enim");
    assert!(
        std::fs::read(&installed).unwrap() == std::fs::read(enim()).unwrap(),
        "{} differs from {}",
        installed.display(),
        enim().display()
    );
    assert_eq!(mode(&installed), 0o755);
    assert_eq!(mode(&d.conflist()), 0o644);

    let conf = plugin_netconf(&d.conflist());
    assert_eq!(conf.name, "enim");
    // 1.0.0 for runtimes that read only cniVersion (libcni < 1.2); the
    // newest in cniVersions, which the others pick, is what the plugin speaks.
    assert_eq!(conf.cni_version.as_str(), "1.0.0");
    let list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.conflist()).unwrap()).unwrap();
    assert_eq!(list["cniVersions"], serde_json::json!(["1.0.0", "1.1.0"]));
    assert_eq!(conf.socket, PathBuf::from("/run/enim/enimd.sock"));

    // The installed binary runs: it answers VERSION with 1.1.0 among others.
    let version = text(&version_answer(&installed, br#"{"cniVersion":"1.1.0"}"#));
    assert!(version.contains("1.1.0"), "{version}");

    // Again: nothing changes, not even the inodes.
    let inodes = |d: &Dirs| {
        (
            std::fs::metadata(d.bin.join("enim")).unwrap().ino(),
            std::fs::metadata(d.conflist()).unwrap().ino(),
        )
    };
    let before = inodes(&d);
    let out = d.install(&[]);
    assert_eq!(
        text(&out.stdout).matches(": unchanged").count(),
        2,
        "{}",
        text(&out.stdout)
    );
    assert_eq!(inodes(&d), before);
}

#[test]
fn socket_comes_from_the_config_unless_given() {
    let d = Dirs::new();
    let config = d._tmp.path().join("enimd.toml");
    std::fs::write(
        &config,
        "socket = \"/run/custom/agent.sock\"\n[provider]\ntype = \"static\"\nenis = []\n",
    )
    .unwrap();
    let cfg = config.to_str().unwrap();

    d.install(&["--config", cfg, "--network-name", "pods"]);
    let conf = plugin_netconf(&d.conflist());
    assert_eq!(conf.socket, PathBuf::from("/run/custom/agent.sock"));
    assert_eq!(conf.name, "pods");

    // --socket wins, and replaces the existing conflist.
    let out = d.install(&["--config", cfg, "--socket", "/run/x/y.sock"]);
    assert!(text(&out.stdout).contains("05-enim.conflist: replaced"));
    assert_eq!(
        plugin_netconf(&d.conflist()).socket,
        PathBuf::from("/run/x/y.sock")
    );
    assert_eq!(mode(&d.conflist()), 0o644);
}

#[test]
fn failures_are_clear_and_write_nothing() {
    let d = Dirs::new();
    let missing = d._tmp.path().join("no/enim");
    let out = enimd(&d.args(&["--plugin", missing.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(missing.to_str().unwrap()) && err.contains("--plugin"),
        "{err}"
    );

    let bad_config = d._tmp.path().join("bad.toml");
    std::fs::write(&bad_config, "sockt = \"/x\"\n").unwrap();
    let out = enimd(&d.args(&["--config", bad_config.to_str().unwrap()]));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("bad.toml"),
        "{}",
        text(&out.stderr)
    );

    let out = enimd(&d.args(&["--conflist-name", "10-enim.conf"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains(".conflist"));

    assert!(!d.bin.exists() && !d.netd.exists());

    // Agent flags belong to the agent, not to install-cni.
    let out = enimd(&["--socket", "/x", "install-cni"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn existing_files_are_replaced_whole_and_dirs_are_kept() {
    let d = Dirs::new();
    std::fs::create_dir_all(&d.bin).unwrap();
    std::fs::create_dir_all(&d.netd).unwrap();
    std::fs::write(d.bin.join("enim"), b"old plugin").unwrap();
    std::fs::set_permissions(d.bin.join("enim"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(d.bin.join("bridge"), b"another plugin").unwrap();
    std::fs::write(d.conflist(), b"{\"half\":").unwrap();
    std::fs::write(d.netd.join("99-other.conflist"), b"{}").unwrap();

    let out = d.install(&[]);
    assert_eq!(text(&out.stdout).matches(": replaced").count(), 2);
    assert_eq!(mode(&d.bin.join("enim")), 0o755);
    assert_eq!(plugin_netconf(&d.conflist()).name, "enim");
    // Others' files untouched, and no temporary files left.
    assert_eq!(
        std::fs::read(d.bin.join("bridge")).unwrap(),
        b"another plugin"
    );
    assert_eq!(dir_names(&d.bin), ["bridge", "enim"]);
    assert_eq!(
        dir_names(&d.netd),
        ["05-enim.conflist", "99-other.conflist"]
    );
}

/// The `type`s of the installed conflist's plugins, in order, and the
/// portmap entry's full config when there is one.
fn chain(d: &Dirs) -> (Vec<String>, Option<serde_json::Value>) {
    let list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.conflist()).unwrap()).unwrap();
    let plugins = list["plugins"].as_array().unwrap();
    let types = plugins
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_string())
        .collect();
    let portmap = plugins.iter().find(|p| p["type"] == "portmap").cloned();
    (types, portmap)
}

const HOSTPORT_LOST: &str = "hostPort will not work";

#[test]
fn portmap_auto_chains_a_portmap_that_speaks_every_version() {
    let d = Dirs::new();
    fake_portmap(&d.bin, &["0.3.1", "0.4.0", "1.0.0", "1.1.0"]);
    let out = d.install(&[]);
    assert!(
        !text(&out.stderr).contains(HOSTPORT_LOST),
        "{}",
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("portmap: chained after enim"), "{stdout}");
    let (types, portmap) = chain(&d);
    assert_eq!(types, ["enim", "portmap"]);
    assert_eq!(
        portmap.unwrap(),
        serde_json::json!({"type": "portmap", "capabilities": {"portMappings": true}})
    );
    // enim is still first, with its socket.
    let list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.conflist()).unwrap()).unwrap();
    assert_eq!(list["plugins"][0]["socket"], "/run/enim/enimd.sock");

    // Again: unchanged. Then never: the conflist is replaced by enim alone.
    let out = enimd(&d.args(&[]));
    assert!(text(&out.stdout).contains("05-enim.conflist: unchanged"));
    let out = d.install(&["--portmap", "never"]);
    assert!(text(&out.stdout).contains("05-enim.conflist: replaced"));
    assert!(
        !text(&out.stdout).contains("portmap"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(chain(&d).0, ["enim"]);
}

#[test]
fn portmap_auto_leaves_out_one_without_cni_1_1_0() {
    let d = Dirs::new();
    // What Debian's containernetworking-plugins 1.1.1 answers.
    fake_portmap(
        &d.bin,
        &["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"],
    );
    let out = d.install(&["--portmap", "auto"]);
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(HOSTPORT_LOST) && err.contains("but not 1.1.0"),
        "{err}"
    );
    assert_eq!(chain(&d), (vec!["enim".to_string()], None));
}

#[test]
fn portmap_auto_without_portmap_is_enim_alone() {
    let d = Dirs::new();
    let out = d.install(&[]);
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    let path = d.bin.join("portmap");
    assert!(
        err.contains(HOSTPORT_LOST) && err.contains(&format!("{} does not exist", path.display())),
        "{err}"
    );
    assert_eq!(chain(&d), (vec!["enim".to_string()], None));
}

#[test]
fn portmap_always_without_portmap_fails_and_writes_nothing() {
    let d = Dirs::new();
    let out = enimd(&d.args(&["--portmap", "always"]));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("--portmap always") && err.contains(d.bin.join("portmap").to_str().unwrap()),
        "{err}"
    );
    assert!(!d.bin.exists() && !d.netd.exists());

    // An old portmap is chained all the same: always checks no versions.
    fake_portmap(&d.bin, &["1.0.0"]);
    d.install(&["--portmap", "always"]);
    assert_eq!(chain(&d).0, ["enim", "portmap"]);
}

#[test]
fn portmap_never_is_enim_alone_without_a_word() {
    let d = Dirs::new();
    fake_portmap(&d.bin, &["1.0.0", "1.1.0"]);
    let out = d.install(&["--portmap", "never"]);
    assert_eq!(text(&out.stderr), "");
    assert_eq!(chain(&d), (vec!["enim".to_string()], None));

    let out = enimd(&d.args(&["--portmap", "sometimes"]));
    assert_eq!(out.status.code(), Some(2));
}

/// Debian's reference portmap (containernetworking-plugins 1.1.1) stops at
/// CNI 1.0.0, so auto leaves it out; always chains it all the same.
#[test]
fn portmap_auto_with_debians_reference_plugin() {
    let real = Path::new("/usr/lib/cni/portmap");
    if !real.exists() {
        // .ci/run installs containernetworking-plugins: there a skip would
        // hide a broken setup.
        assert!(
            !enim_testkit::ci(),
            "CI=true but {} is missing (Debian package containernetworking-plugins)",
            real.display()
        );
        eprintln!("SKIPPED: {} is not installed", real.display());
        return;
    }
    // What it says it speaks, asked here the way a runtime does.
    let answer: serde_json::Value =
        serde_json::from_slice(&version_answer(real, br#"{"cniVersion":"1.0.0"}"#)).unwrap();
    let speaks_1_1 = answer["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!("1.1.0"));

    let d = Dirs::new();
    std::fs::create_dir_all(&d.bin).unwrap();
    std::os::unix::fs::symlink(real, d.bin.join("portmap")).unwrap();
    let out = d.install(&[]);
    let err = text(&out.stderr);
    if speaks_1_1 {
        // A newer package than 1.1.1: chained.
        assert_eq!(err, "");
        assert_eq!(chain(&d).0, ["enim", "portmap"]);
        return;
    }
    assert!(
        err.contains(HOSTPORT_LOST) && err.contains("but not 1.1.0"),
        "{err}"
    );
    assert_eq!(chain(&d).0, ["enim"]);

    let out = d.install(&["--portmap", "always"]);
    assert!(text(&out.stdout).contains("portmap: chained after enim"));
    assert_eq!(chain(&d).0, ["enim", "portmap"]);
}

/// An upgraded node: enim's conflist under its previous name (10-) is
/// removed once the new one (05-, before AWS VPC CNI's 10-aws) is in
/// place; another CNI's conflist, and a file under the old name that is
/// not enim's, are left alone.
#[test]
fn enims_conflist_under_its_previous_name_goes_other_cnis_stay() {
    let d = Dirs::new();
    std::fs::create_dir_all(&d.netd).unwrap();
    let aws = r#"{"cniVersion":"0.4.0","name":"aws-cni","plugins":[{"type":"aws-cni"}]}"#;
    std::fs::write(d.netd.join("10-aws.conflist"), aws).unwrap();
    let old = r#"{"cniVersion":"1.0.0","name":"enim","plugins":[{"type":"enim","socket":"/run/enim/enimd.sock"}]}"#;
    std::fs::write(d.netd.join("10-enim.conflist"), old).unwrap();

    let out = d.install(&[]);
    assert!(
        text(&out.stdout).contains("10-enim.conflist: removed (enim's previous conflist name)"),
        "{}",
        text(&out.stdout)
    );
    // The runtime takes the first: enim's.
    assert_eq!(dir_names(&d.netd), ["05-enim.conflist", "10-aws.conflist"]);
    assert_eq!(
        std::fs::read_to_string(d.netd.join("10-aws.conflist")).unwrap(),
        aws
    );

    // Not enim's (another plugin under that name): left alone.
    let other = r#"{"cniVersion":"1.0.0","name":"enim","plugins":[{"type":"bridge"}]}"#;
    std::fs::write(d.netd.join("10-enim.conflist"), other).unwrap();
    let out = d.install(&[]);
    assert!(
        !text(&out.stdout).contains("removed"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(d.netd.join("10-enim.conflist")).unwrap(),
        other
    );
}
