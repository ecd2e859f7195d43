//! The control-plane rig itself: it starts, serves, survives an API server
//! restart with its state (etcd keeps it), and is removed on drop.

use enim_testkit::apiserver::ControlPlane;

#[test]
fn a_control_plane_serves_and_keeps_state_across_an_apiserver_restart() {
    let Some(mut cp) = ControlPlane::start() else {
        return;
    };
    let dir = cp.dir().to_path_buf();
    cp.kubectl(&["create", "namespace", "rig-check"]);
    cp.stop_apiserver();
    assert!(!cp.kubectl_output(&["get", "ns"]).status.success());
    cp.start_apiserver();
    let out = cp.kubectl(&["get", "namespace", "rig-check", "-o", "name"]);
    assert_eq!(out.trim(), "namespace/rig-check");
    drop(cp);
    assert!(!dir.exists(), "{} left behind", dir.display());
}
