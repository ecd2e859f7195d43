//! docs/configuration.md's tables are what the config types say: every
//! key, its default and what it does (see enim-configref). A section that
//! differs fails the test, named, with the difference; `ENIM_BLESS=1`
//! rewrites the page instead.

use std::path::PathBuf;

use similar::TextDiff;

fn page_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md")
}

#[test]
fn the_configuration_reference_is_current() {
    let path = page_path();
    let page = std::fs::read_to_string(&path).unwrap();
    let regenerated = enim_configref::regenerate(&page).unwrap_or_else(|e| panic!("{e}"));
    if regenerated.stale.is_empty() {
        assert_eq!(
            regenerated.text, page,
            "no section changed, yet the page did"
        );
        return;
    }
    if std::env::var_os("ENIM_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &regenerated.text).unwrap();
        eprintln!(
            "rewrote {} sections of {}",
            regenerated.stale.len(),
            path.display()
        );
        return;
    }
    let mut report = String::new();
    for stale in &regenerated.stale {
        let diff = TextDiff::from_lines(&stale.on_page, &stale.generated);
        report.push_str(&format!(
            "section {:?} differs from the config types:\n{}\n",
            stale.name,
            diff.unified_diff()
                .context_radius(1)
                .header("docs/configuration.md", "generated")
        ));
    }
    panic!(
        "{report}docs/configuration.md is not current: regenerate it with \
         `ENIM_BLESS=1 cargo test -p enim-configref --test configuration_md`"
    );
}
