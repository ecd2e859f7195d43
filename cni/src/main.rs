//! `enim`: the CNI plugin a container runtime execs. All logic lives in
//! [`enim_cni`]; this only wires up the process.

use std::io::Write;

fn main() {
    let out = enim_cni::execute(&|k| std::env::var_os(k), std::io::stdin().lock());
    if let Some(s) = out.stdout {
        let mut stdout = std::io::stdout().lock();
        // A runtime that stopped listening cannot be told anything more.
        let _ = stdout.write_all(s.as_bytes()).and_then(|()| stdout.flush());
    }
    std::process::exit(out.exit_code);
}
