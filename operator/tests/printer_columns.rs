//! `kubectl get nrs` against the real API server with deploy/'s CRD: a
//! NetResourceSet being deleted (its node gone, the set held by the
//! operator's finalizer for `node_grace`) says so in its Deleting column;
//! one that is not being deleted shows nothing there. `kubectl get enip`
//! shows a policy's mode, priority and warm ENIs.

use std::path::Path;

use enim_testkit::apiserver::ControlPlane;

fn set(name: &str) -> String {
    format!(
        "apiVersion: enim.io/v1alpha1\nkind: NetResourceSet\nmetadata:\n  name: {name}\n  finalizers: [\"{}\"]\nspec:\n  instance: {{provider: static, id: {name}}}\n  mode: primary\n  watermarks: {{preAllocate: 0, minAllocate: 0, maxAboveWatermark: 0}}\n",
        enim_crd::FINALIZER
    )
}

/// The cell of `column` in the row of `name`, from `kubectl get` output:
/// columns are aligned under their headers, and an empty cell is blank.
fn cell(table: &str, name: &str, column: &str) -> String {
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    let starts: Vec<usize> = header
        .char_indices()
        .filter(|&(i, c)| c != ' ' && (i == 0 || header.as_bytes()[i - 1] == b' '))
        .map(|(i, _)| i)
        .collect();
    let at = starts
        .iter()
        .position(|&i| header[i..].split(' ').next() == Some(column))
        .unwrap_or_else(|| panic!("no column {column} in {header:?}"));
    let row = lines
        .find(|l| l.split(' ').next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in\n{table}"));
    let end = starts
        .get(at + 1)
        .copied()
        .unwrap_or(row.len())
        .min(row.len());
    row.get(starts[at]..end).unwrap_or("").trim().to_string()
}

#[test]
fn a_set_being_deleted_says_so_in_kubectl_get() {
    let Some(cp) = ControlPlane::start() else {
        return;
    };
    let crd = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(enim_crd::CRD_PATH),
    )
    .unwrap();
    cp.apply_crd(&crd, "crd/netresourcesets.enim.io");
    cp.apply(&format!("{}---\n{}", set("gone-node"), set("live-node")));
    cp.kubectl(&["delete", "nrs", "gone-node", "--wait=false"]);
    let table = cp.kubectl(&["get", "nrs"]);
    let deleting = cell(&table, "gone-node", "DELETING");
    // A duration ("0s", "3s"), as AGE shows one.
    assert!(
        deleting.ends_with('s') && deleting[..deleting.len() - 1].parse::<u32>().is_ok(),
        "gone-node's DELETING is {deleting:?}:\n{table}"
    );
    let live = cell(&table, "live-node", "DELETING");
    assert!(
        live.is_empty() || live.starts_with('<'),
        "live-node's DELETING is {live:?}:\n{table}"
    );
}

#[test]
fn a_policy_shows_its_mode_priority_and_warm_enis_in_kubectl_get() {
    let Some(cp) = ControlPlane::start() else {
        return;
    };
    let crd = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(enim_crd::policy::POLICY_CRD_PATH),
    )
    .unwrap();
    cp.apply_crd(&crd, "crd/enipolicies.enim.io");
    cp.apply(
        "apiVersion: enim.io/v1alpha1\nkind: EniPolicy\nmetadata: {name: db}\n\
         spec: {mode: primary, priority: 7, securityGroups: [sg-db], warmEnis: 2}\n---\n\
         apiVersion: enim.io/v1alpha1\nkind: EniPolicy\nmetadata: {name: web}\n\
         spec: {mode: secondary}\n",
    );
    let table = cp.kubectl(&["get", "enip"]);
    let row = |name: &str| ["MODE", "PRIORITY", "WARM"].map(|c| cell(&table, name, c));
    assert_eq!(row("db"), ["primary", "7", "2"], "{table}");
    let web = row("web");
    assert_eq!(web[0], "secondary", "{table}");
    assert!(web[2].is_empty() || web[2].starts_with('<'), "{table}");
}
