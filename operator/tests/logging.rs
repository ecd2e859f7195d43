//! The operator's log as `kubectl logs` shows it: the command line of
//! deploy/50-operator.yaml writes one JSON object a line, and no format
//! writes terminal escape codes when its output is not a terminal.

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

/// The operator container's command in deploy/50-operator.yaml.
fn deployed_command() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/50-operator.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let deployment = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment in 50-operator.yaml");
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap();
    let operator = containers
        .iter()
        .find(|c| c["name"] == "enim-operator")
        .expect("the enim-operator container");
    operator["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// Runs the operator binary with `args` (its config missing, so it logs
/// its error and exits) and returns what it wrote to stdout, its log.
fn log_of(args: &[String]) -> String {
    let missing = Path::new("/nonexistent/enim-logging-test/operator.toml");
    let mut args = args.to_vec();
    match args.iter().position(|a| a == "--config") {
        Some(i) => args[i + 1] = missing.display().to_string(),
        None => args.extend(["--config".into(), missing.display().to_string()]),
    }
    let out = Command::new(env!("CARGO_BIN_EXE_enim-operator"))
        .args(&args)
        .env("POD_NAME", "enim-operator-0")
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    assert!(!out.status.success(), "a missing config must stop it");
    let log = String::from_utf8(out.stdout).unwrap();
    assert!(
        log.contains("operator.toml"),
        "its error is logged: {log:?}"
    );
    log
}

#[test]
fn the_deployed_command_logs_json_lines_without_escape_codes() {
    let command = deployed_command();
    assert!(command[0].ends_with("/enim-operator"), "{command:?}");
    let log = log_of(&command[1..]);
    assert!(!log.contains('\u{1b}'), "escape codes in {log:?}");
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{v}");
    }
}

#[test]
fn text_logs_carry_no_escape_codes_off_a_terminal() {
    let log = log_of(&["--log-format".into(), "text".into()]);
    assert!(!log.contains('\u{1b}'), "escape codes in {log:?}");
    assert!(log.contains("ERROR"), "{log:?}");
}
