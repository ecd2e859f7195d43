//! Prints the NetResourceSet CRD as YAML; CI compares it with the copy in
//! the Helm chart's `crds/` (`enim_crd::CRD_PATH`).
fn main() {
    print!("{}", enim_crd::crd_yaml());
}
