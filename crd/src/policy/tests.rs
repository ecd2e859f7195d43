use super::*;

/// CI's check that the committed CRD is what these types generate.
#[test]
fn the_committed_policy_crd_matches_the_types() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(POLICY_CRD_PATH);
    let committed =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        committed == policy_crd_yaml(),
        "{POLICY_CRD_PATH} is stale: run `cargo run -p enim-crd --bin crdgen -- enipolicy > {POLICY_CRD_PATH}`"
    );
}

#[test]
fn the_policy_crd_is_cluster_scoped_with_a_status_subresource() {
    use kube::CustomResourceExt;
    let crd = EniPolicy::crd();
    assert_eq!(crd.metadata.name.as_deref(), Some("enipolicies.enim.io"));
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.short_names, Some(vec!["enip".to_string()]));
    let v = &crd.spec.versions[0];
    assert!(v.subresources.as_ref().unwrap().status.is_some());
}
