//! The metrics a component documents, serves and alerts on, for the tests
//! that hold them together: the reference tables of docs/operations.md,
//! the families a scrape of `/metrics` declares, and the metric names the
//! alert rules (charts/enim/files/prometheus-rules.yaml) and the dashboard
//! (charts/enim/files/grafana-dashboard.json) use.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The repository's file `relative` (docs/operations.md, ...).
pub fn repo_file(relative: &str) -> String {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Name → type of each family a scrape declares (`# TYPE`), named as the
/// docs name them: a counter with `_total`, as its samples are.
pub fn served(scrape: &str) -> BTreeMap<String, String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| {
            let name = match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            };
            (name, kind.trim().to_string())
        })
        .collect()
}

/// Name → type of each row of the table under the heading `### section`
/// (rows `` | `name` | type | ... ``), up to the next heading.
pub fn documented(markdown: &str, section: &str) -> BTreeMap<String, String> {
    let heading = format!("### {section}");
    let mut rows = BTreeMap::new();
    let mut inside = false;
    for line in markdown.lines() {
        if line.starts_with('#') {
            inside = line.trim() == heading;
            continue;
        }
        if !inside {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "", name, type, labels, meaning, ""
        if let [_, name, kind, ..] = cells.as_slice() {
            if let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) {
                rows.insert(name.to_string(), kind.to_string());
            }
        }
    }
    rows
}

/// What differs between `documented` and `served`: each name on one side
/// only, and each whose type differs.
pub fn differences(
    documented: &BTreeMap<String, String>,
    served: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (name, kind) in documented {
        match served.get(name) {
            None => out.push(format!("{name}: documented, not served")),
            Some(k) if k != kind => out.push(format!("{name}: documented {kind}, served {k}")),
            Some(_) => {}
        }
    }
    for name in served.keys().filter(|n| !documented.contains_key(*n)) {
        out.push(format!("{name}: served, not documented"));
    }
    out
}

/// Every rule of the rules file.
fn rules(rules_yaml: &str) -> Vec<serde_yaml::Value> {
    let doc: serde_yaml::Value = serde_yaml::from_str(rules_yaml).expect("the rules are YAML");
    // A rules file: `groups` at the top (the chart makes it a
    // PrometheusRule's spec).
    let groups = doc["groups"]
        .as_sequence()
        .cloned()
        .expect("the rules file has groups");
    groups
        .iter()
        .filter_map(|g| g["rules"].as_sequence())
        .flatten()
        .cloned()
        .collect()
}

/// The `expr` of every rule of the rules file.
pub fn rule_exprs(rules_yaml: &str) -> Vec<String> {
    rules(rules_yaml)
        .iter()
        .map(|r| r["expr"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Alert name → `runbook_url` of every alert of the rules file.
pub fn runbooks(rules_yaml: &str) -> BTreeMap<String, String> {
    rules(rules_yaml)
        .iter()
        .filter_map(|r| {
            let alert = r["alert"].as_str()?;
            let url = r["annotations"]["runbook_url"].as_str().unwrap_or_default();
            Some((alert.to_string(), url.to_string()))
        })
        .collect()
}

/// The `expr` of every target of every panel of the dashboard.
pub fn dashboard_exprs(dashboard_json: &str) -> Vec<String> {
    let doc: serde_json::Value =
        serde_json::from_str(dashboard_json).expect("the dashboard is JSON");
    doc["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["targets"].as_array())
        .flatten()
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect()
}

/// The metric names (`enim_...`) an expression uses, a histogram's
/// `_bucket`, `_sum` and `_count` series named by their family.
pub fn metrics_named(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("enim_") {
        // Only a whole word: not the tail of another identifier.
        let before = rest[..at].chars().next_back();
        let word: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + word.len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| word.strip_suffix(s))
            .unwrap_or(&word);
        names.insert(family.to_string());
    }
    names
}

/// The anchors of a markdown file's headings, as GitHub makes them
/// (lower case, spaces to dashes, other punctuation dropped).
pub fn heading_anchors(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            h.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_an_expression_are_whole_words_and_histograms_by_family() {
        let e = "histogram_quantile(0.99, rate(enim_request_duration_seconds_bucket[5m])) \
                 and my_enim_x > 0 or enim_enis{state=\"free\"} == 0";
        let got: Vec<String> = metrics_named(e).into_iter().collect();
        assert_eq!(got, ["enim_enis", "enim_request_duration_seconds"]);
    }

    #[test]
    fn a_counter_is_named_with_its_total_and_a_table_row_is_read() {
        let scrape =
            "# HELP enim_requests x\n# TYPE enim_requests counter\nenim_requests_total 1\n\
                      # TYPE enim_enis gauge\n";
        let s = served(scrape);
        assert_eq!(
            s.get("enim_requests_total").map(String::as_str),
            Some("counter")
        );
        assert_eq!(s.get("enim_enis").map(String::as_str), Some("gauge"));
        let md = "### enimd\n\n| Metric | Type |\n|---|---|\n| `enim_enis` | gauge | | x |\n\
                  | `enim_requests_total` | counter | | y |\n### other\n| `enim_x` | gauge |\n";
        let d = documented(md, "enimd");
        assert_eq!(d.len(), 2);
        assert!(differences(&d, &s).is_empty());
        let mut wrong = d.clone();
        wrong.insert("enim_enis".into(), "counter".into());
        wrong.insert("enim_gone".into(), "gauge".into());
        assert_eq!(differences(&wrong, &s).len(), 2);
        assert!(heading_anchors("### EnimNoFreeEni\n## Alerts and runbooks")
            .contains("alerts-and-runbooks"));
    }

    #[test]
    fn every_alert_has_a_runbook_section_in_the_docs() {
        let rules = repo_file("charts/enim/files/prometheus-rules.yaml");
        let anchors = heading_anchors(&repo_file("docs/operations.md"));
        let runbooks = runbooks(&rules);
        assert_eq!(runbooks.len(), 6, "{runbooks:?}");
        for (alert, url) in &runbooks {
            let anchor = url.strip_prefix("docs/operations.md#").unwrap_or_else(|| {
                panic!("{alert}: runbook_url {url:?} is not a docs/operations.md section")
            });
            assert_eq!(anchor, alert.to_lowercase(), "{alert}: its own section");
            assert!(anchors.contains(anchor), "{alert}: no section #{anchor}");
        }
        assert_eq!(
            rule_exprs(&rules).len(),
            runbooks.len(),
            "every rule is an alert"
        );
    }
}
