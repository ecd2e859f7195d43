//! The generated sections of a page: what lies between
//! `<!-- generated: NAME -->` and `<!-- end generated -->`, each on a line
//! of its own. Everything else on the page is left as it is.

/// Opens a section; the section's name follows, then ` -->`.
pub const OPEN: &str = "<!-- generated: ";
/// Closes the section opened last.
pub const CLOSE: &str = "<!-- end generated -->";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MarkerError {
    #[error("line {line}: a generated section opens inside {open:?}")]
    Nested { line: usize, open: String },
    #[error("line {line}: {CLOSE} closes no section")]
    Unopened { line: usize },
    #[error("section {0:?} is not closed ({CLOSE})")]
    Unclosed(String),
    #[error("line {line}: {text:?} is not `{OPEN}NAME -->`")]
    Malformed { line: usize, text: String },
    #[error("section {0:?} is on the page twice")]
    Twice(String),
}

/// A page cut at its markers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// Lines kept as they are, markers included.
    Kept(String),
    /// A section's name and its present content.
    Generated { name: String, content: String },
}

impl Page {
    pub fn parse(text: &str) -> Result<Page, MarkerError> {
        let mut parts = Vec::new();
        let mut kept = String::new();
        let mut open: Option<(String, String)> = None;
        for (index, line) in text.split_inclusive('\n').enumerate() {
            let number = index + 1;
            let trimmed = line.trim_end();
            if let Some(rest) = trimmed.strip_prefix(OPEN) {
                if let Some((name, _)) = &open {
                    return Err(MarkerError::Nested {
                        line: number,
                        open: name.clone(),
                    });
                }
                let name = rest.strip_suffix(" -->").ok_or(MarkerError::Malformed {
                    line: number,
                    text: trimmed.into(),
                })?;
                let named = |p: &Part| matches!(p, Part::Generated { name: n, .. } if n == name);
                if parts.iter().any(named) {
                    return Err(MarkerError::Twice(name.into()));
                }
                kept.push_str(line);
                parts.push(Part::Kept(std::mem::take(&mut kept)));
                open = Some((name.into(), String::new()));
            } else if trimmed == CLOSE {
                let (name, content) = open.take().ok_or(MarkerError::Unopened { line: number })?;
                parts.push(Part::Generated { name, content });
                kept.push_str(line);
            } else if let Some((_, content)) = &mut open {
                content.push_str(line);
            } else {
                kept.push_str(line);
            }
        }
        if let Some((name, _)) = open {
            return Err(MarkerError::Unclosed(name));
        }
        parts.push(Part::Kept(kept));
        Ok(Page { parts })
    }

    /// The sections' names and present contents, in page order.
    pub fn sections(&self) -> impl Iterator<Item = (&str, &str)> {
        self.parts.iter().filter_map(|p| match p {
            Part::Generated { name, content } => Some((name.as_str(), content.as_str())),
            Part::Kept(_) => None,
        })
    }

    /// Sets the content of section `name`; `false` when the page has no
    /// such section.
    pub fn set(&mut self, name: &str, new: String) -> bool {
        for part in &mut self.parts {
            if let Part::Generated { name: n, content } = part {
                if n == name {
                    *content = new;
                    return true;
                }
            }
        }
        false
    }

    pub fn text(&self) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Kept(text) => text.as_str(),
                Part::Generated { content, .. } => content.as_str(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# Title\n\
        prose\n\
        <!-- generated: a -->\n\
        old a\n\
        <!-- end generated -->\n\
        more prose\n\
        <!-- generated: b -->\n\
        <!-- end generated -->\n";

    #[test]
    fn only_the_sections_change() {
        let mut page = Page::parse(PAGE).unwrap();
        assert_eq!(page.text(), PAGE);
        assert_eq!(
            page.sections().collect::<Vec<_>>(),
            [("a", "old a\n"), ("b", "")]
        );
        assert!(page.set("b", "new b\n".into()));
        assert!(!page.set("c", String::new()));
        assert_eq!(
            page.text(),
            PAGE.replace("<!-- generated: b -->\n", "<!-- generated: b -->\nnew b\n")
        );
    }

    #[test]
    fn broken_markers_are_refused() {
        for (bad, error) in [
            ("<!-- generated: a -->\n", MarkerError::Unclosed("a".into())),
            (CLOSE, MarkerError::Unopened { line: 1 }),
            (
                "<!-- generated: a\n",
                MarkerError::Malformed {
                    line: 1,
                    text: "<!-- generated: a".into(),
                },
            ),
            (
                "<!-- generated: a -->\n<!-- generated: b -->\n",
                MarkerError::Nested {
                    line: 2,
                    open: "a".into(),
                },
            ),
            (
                "<!-- generated: a -->\n<!-- end generated -->\n<!-- generated: a -->\n",
                MarkerError::Twice("a".into()),
            ),
        ] {
            assert_eq!(Page::parse(bad).unwrap_err(), error, "{bad}");
        }
    }
}
