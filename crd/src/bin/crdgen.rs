//! Prints the NetResourceSet CRD as YAML; CI compares it with the copy in
//! `deploy/` (`enim_crd::CRD_PATH`).
fn main() {
    print!("{}", enim_crd::crd_yaml());
}
