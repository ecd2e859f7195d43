use super::*;

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
