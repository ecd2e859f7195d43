//! Text as the page's table cells have it: doc comments as fragments,
//! values as a TOML file writes them.

use serde_json::Value;

use crate::table::resolve;

/// A doc comment (lines joined by `\n`, paragraphs by a blank line) as a
/// cell's fragment: one line; the first letter lower case where it begins
/// a plain word (`A`, `The`; not `ENIs`, `IPv6`); no closing period.
pub fn fragment(doc: &str) -> String {
    let joined = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut chars = joined.chars();
    let mut text = match (chars.next(), chars.clone().next()) {
        (Some(first), second)
            if first.is_ascii_uppercase() && !second.is_some_and(char::is_uppercase) =>
        {
            first.to_ascii_lowercase().to_string() + chars.as_str()
        }
        _ => joined.clone(),
    };
    if text.ends_with('.') && !text.ends_with("..") {
        text.pop();
    }
    text
}

/// `text` as inline code.
pub fn code(text: &str) -> String {
    format!("`{text}`")
}

/// `value` as a TOML file writes it, inline: strings quoted, tables as
/// `{ key = value, ... }` with their keys in the order `schema` requires
/// them (the order the type declares them), numbers as written.
pub fn inline_value(value: &Value, schema: &Value, root: &Value) -> String {
    match value {
        Value::Null => "unset".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match n.as_f64() {
            // A whole number of seconds reads as one.
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => {
                format!("{f:.0}")
            }
            _ => n.to_string(),
        },
        Value::String(s) => Value::String(s.clone()).to_string(),
        Value::Array(items) => {
            let item_schema = resolve(schema.get("items").unwrap_or(&Value::Null), root);
            let items: Vec<String> = items
                .iter()
                .map(|v| inline_value(v, item_schema, root))
                .collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(table) if table.is_empty() => "{}".into(),
        Value::Object(table) => {
            let order: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut keys: Vec<&String> = table.keys().collect();
            keys.sort_by_key(|k| order.iter().position(|o| o == k).unwrap_or(usize::MAX));
            let pairs: Vec<String> = keys
                .into_iter()
                .map(|k| {
                    let field = schema
                        .get("properties")
                        .and_then(|p| p.get(k.as_str()))
                        .map_or(&Value::Null, |p| resolve(p, root));
                    format!("{k} = {}", inline_value(&table[k.as_str()], field, root))
                })
                .collect();
            format!("{{ {} }}", pairs.join(", "))
        }
    }
}

/// `text` safe inside a table cell.
pub fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_doc_comment_becomes_a_fragment() {
        assert_eq!(
            fragment("The API socket.\nMode 0600."),
            "the API socket. Mode 0600"
        );
        assert_eq!(fragment("ENIs never handed out."), "ENIs never handed out");
        assert_eq!(fragment("A gid."), "a gid");
        assert_eq!(
            fragment("The first step, doubling..."),
            "the first step, doubling..."
        );
    }

    #[test]
    fn values_are_written_as_in_toml() {
        let schema = json!({"required": ["every", "burst"]});
        let rate = json!({"burst": 4, "every": "1s"});
        assert_eq!(
            inline_value(&rate, &schema, &Value::Null),
            r#"{ every = "1s", burst = 4 }"#
        );
        assert_eq!(
            inline_value(&json!(["a", 2, 30.0, 0.5]), &Value::Null, &Value::Null),
            r#"["a", 2, 30, 0.5]"#
        );
    }
}
