//! Prints one of enim's CRDs as YAML; CI compares each with its copy in the
//! Helm chart's `crds/` (`enim_crd::CRD_PATH`, `POLICY_CRD_PATH`).
//!
//!   crdgen [netresourceset|enipolicy]     (netresourceset when left out)
fn main() -> std::process::ExitCode {
    match std::env::args().nth(1).as_deref() {
        None | Some("netresourceset") => print!("{}", enim_crd::crd_yaml()),
        Some("enipolicy") => print!("{}", enim_crd::policy::policy_crd_yaml()),
        Some(other) => {
            eprintln!("crdgen: unknown CRD {other:?} (netresourceset or enipolicy)");
            return std::process::ExitCode::from(2);
        }
    }
    std::process::ExitCode::SUCCESS
}
