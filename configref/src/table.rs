//! One config table read from its type: each key with what it does and
//! its default, in the order the type declares them.
//!
//! What a key does is its field's doc comment, as schemars puts it in the
//! schema's `description`. Its default is the value the code's `Default`
//! impl or `#[serde(default = ...)]` function gives, as schemars puts it
//! in `default`. A default that is not a value ("the instance type's
//! limit", "enimd's own netns", "required" where the type's own default is
//! an empty value the program refuses) is a paragraph of the doc comment
//! that begins `Default: `; it is taken out of the "what" and shown
//! instead, and only where the value is absent or empty, so it can never
//! hide a real value. Without either, a key is `required` (the schema says
//! so), or its type says what leaving it out means: unset, `[]` or `{}`.

use serde_json::{Map, Value};

use crate::fields::{self, FieldsError, Probe};
use crate::render;

/// The paragraph of a doc comment that says what the default is, where it
/// is not a value.
const DEFAULT_PARAGRAPH: &str = "Default: ";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("{0}")]
    Fields(#[from] FieldsError),
    #[error("no table at {path:?} in the schema")]
    NoTable { path: Vec<&'static str> },
    #[error("the schema's keys {schema:?} are not the type's {declared:?}")]
    KeysDiffer {
        schema: Vec<String>,
        declared: Vec<&'static str>,
    },
    #[error("{key}: the doc says `Default: {text}`, but the code's default is {value}")]
    TwoDefaults {
        key: String,
        text: String,
        value: String,
    },
    #[error("{key}: no default in the code and none in the doc (`Default: ...`)")]
    NoDefault { key: String },
}

/// One config table: the schema of the type it is part of, where in that
/// type it is, and its keys in declaration order.
#[derive(Debug, Clone)]
pub struct Table {
    root: Value,
    path: Vec<&'static str>,
    keys: Vec<&'static str>,
}

/// One key of a table, as the page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub name: &'static str,
    /// The doc comment, its `Default:` paragraph out, with the values an
    /// enum takes.
    pub what: String,
    /// What leaving the key out means.
    pub default: String,
}

impl Table {
    /// The table at `path` in `schema` (a type's whole schema), whose keys
    /// `deserialize` declares at `keys_at` (see [`fields::declared_keys`]):
    /// the same path, or none where `deserialize` reads the table's own
    /// type.
    pub fn new(
        schema: schemars::Schema,
        path: &[&'static str],
        deserialize: impl FnOnce(Probe<'_>) -> Result<(), FieldsError>,
        keys_at: &[&'static str],
    ) -> Result<Table, TableError> {
        let table = Table {
            root: schema.to_value(),
            path: path.to_vec(),
            keys: fields::declared_keys(deserialize, keys_at)?,
        };
        let mut schema: Vec<String> = table.properties()?.keys().cloned().collect();
        let mut declared = table.keys.clone();
        schema.sort();
        declared.sort_unstable();
        if schema != declared {
            return Err(TableError::KeysDiffer { schema, declared });
        }
        Ok(table)
    }

    /// The keys, with what each does and its default.
    pub fn keys(&self) -> Result<Vec<Key>, TableError> {
        let properties = self.properties()?;
        let required = self.schema()?.get("required").and_then(Value::as_array);
        let inherited = self.inherited_defaults();
        self.keys
            .iter()
            .map(|&name| {
                let property = &properties[name];
                let (what, default_text) = split_doc(property);
                let value = inherited
                    .and_then(|defaults| defaults.get(name))
                    .or_else(|| property.get("default"));
                let is_required = required.is_some_and(|r| r.iter().any(|k| k == name));
                Ok(Key {
                    name,
                    what: self.with_values(what, property),
                    default: self.default(name, property, value, default_text, is_required)?,
                })
            })
            .collect()
    }

    fn default(
        &self,
        name: &str,
        property: &Value,
        value: Option<&Value>,
        text: Option<String>,
        required: bool,
    ) -> Result<String, TableError> {
        match (text, value) {
            (Some(text), Some(value)) if !is_empty(value) => Err(TableError::TwoDefaults {
                key: name.into(),
                text,
                value: value.to_string(),
            }),
            (Some(text), _) => Ok(text),
            (None, Some(value)) if !value.is_null() => Ok(render::code(&render::inline_value(
                value,
                self.resolve(property),
                &self.root,
            ))),
            (None, _) if required => Ok("required".into()),
            (None, value) => {
                let resolved = self.resolve(property);
                if value.is_some_and(Value::is_null) || is_nullable(property) {
                    Ok("unset".into())
                } else if has_type(resolved, "array") {
                    Ok(render::code("[]"))
                } else if has_type(resolved, "object") {
                    Ok(render::code("{}"))
                } else {
                    Err(TableError::NoDefault { key: name.into() })
                }
            }
        }
    }

    /// `what`, and when the key is an enum, the values it takes, each with
    /// its variant's doc.
    fn with_values(&self, what: String, property: &Value) -> String {
        let variants = enum_variants(self.resolve(property), &self.root);
        if variants.is_empty() {
            return what;
        }
        let variants: Vec<String> = variants
            .into_iter()
            .map(|(value, doc)| match doc {
                Some(doc) => format!("{}: {doc}", render::code(&value)),
                None => render::code(&value),
            })
            .collect();
        format!("{what}: {}", variants.join("; "))
    }

    /// The table's own schema.
    fn schema(&self) -> Result<&Value, TableError> {
        let mut schema = self.resolve(&self.root);
        for key in &self.path {
            schema = schema
                .get("properties")
                .and_then(|p| p.get(*key))
                .map(|p| self.resolve(p))
                .ok_or_else(|| self.no_table())?;
        }
        Ok(schema)
    }

    fn properties(&self) -> Result<&Map<String, Value>, TableError> {
        self.schema()?
            .get("properties")
            .and_then(Value::as_object)
            .ok_or_else(|| self.no_table())
    }

    /// The defaults the enclosing table gives this one as a whole (a
    /// cloud's `api` table differs from the shared defaults): they win
    /// over the table type's own.
    fn inherited_defaults(&self) -> Option<&Map<String, Value>> {
        let (last, parents) = self.path.split_last()?;
        let mut parent = self.resolve(&self.root);
        for key in parents {
            parent = self.resolve(&parent["properties"][*key]);
        }
        parent
            .get("properties")?
            .get(*last)?
            .get("default")?
            .as_object()
    }

    fn no_table(&self) -> TableError {
        TableError::NoTable {
            path: self.path.clone(),
        }
    }

    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        resolve(schema, &self.root)
    }
}

/// `schema` with its `$ref` followed and an `Option`'s null left out.
pub(crate) fn resolve<'a>(schema: &'a Value, root: &'a Value) -> &'a Value {
    if let Some(name) = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/$defs/"))
    {
        if let Some(def) = root.get("$defs").and_then(|d| d.get(name)) {
            return resolve(def, root);
        }
    }
    if let Some(options) = schema.get("anyOf").and_then(Value::as_array) {
        let not_null: Vec<&Value> = options.iter().filter(|o| !has_type(o, "null")).collect();
        if let [only] = not_null[..] {
            return resolve(only, root);
        }
    }
    schema
}

/// The values of an enum (a string, or a table tagged by one key), each
/// written as in a config file, with its variant's doc.
fn enum_variants(schema: &Value, root: &Value) -> Vec<(String, Option<String>)> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values.iter().map(|v| (v.to_string(), None)).collect();
    }
    let Some(variants) = schema.get("oneOf").and_then(Value::as_array) else {
        return Vec::new();
    };
    variants
        .iter()
        .filter_map(|variant| {
            let doc = variant
                .get("description")
                .and_then(Value::as_str)
                .map(render::fragment);
            if let Some(value) = variant.get("const") {
                return Some((value.to_string(), doc));
            }
            let mut keys = variant
                .get("properties")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            if let Some(inner) = resolve(variant, root)
                .get("properties")
                .and_then(Value::as_object)
            {
                keys.extend(inner.clone());
            }
            let (tag, value) = keys
                .iter()
                .find_map(|(key, s)| s.get("const").map(|value| (key.clone(), value.clone())))?;
            let mut written = vec![format!("{tag} = {value}")];
            written.extend(keys.keys().filter(|k| **k != tag).cloned());
            Some((format!("{{ {} }}", written.join(", ")), doc))
        })
        .collect()
}

/// The doc comment as a cell's text, and its `Default:` paragraph's.
fn split_doc(property: &Value) -> (String, Option<String>) {
    let doc = property
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let (default, what): (Vec<&str>, Vec<&str>) = doc
        .split("\n\n")
        .partition(|paragraph| paragraph.starts_with(DEFAULT_PARAGRAPH));
    let default = default
        .first()
        .map(|p| render::fragment(&p[DEFAULT_PARAGRAPH.len()..]));
    (render::fragment(&what.join("\n")), default)
}

/// A value that says nothing: unset, or an empty string, list or table.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn is_nullable(schema: &Value) -> bool {
    has_type(schema, "null")
        || schema
            .get("anyOf")
            .and_then(Value::as_array)
            .is_some_and(|options| options.iter().any(|o| has_type(o, "null")))
}

fn has_type(schema: &Value, name: &str) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == name,
        Some(Value::Array(types)) => types.iter().any(|t| t == name),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    use super::*;

    /// A table with a key of each kind the page shows.
    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(default, deny_unknown_fields)]
    struct Example {
        /// How many.
        count: u32,
        /// Where it is.
        ///
        /// Default: the node's own.
        place: Option<String>,
        /// Off or on.
        mode: Switch,
        /// Things.
        list: Vec<String>,
    }

    #[derive(Serialize, Deserialize, JsonSchema, Default)]
    #[serde(rename_all = "lowercase")]
    enum Switch {
        /// Nothing happens.
        #[default]
        Off,
        /// Something does.
        On,
    }

    impl Default for Example {
        fn default() -> Self {
            Example {
                count: 3,
                place: None,
                mode: Switch::Off,
                list: Vec::new(),
            }
        }
    }

    fn keys() -> Vec<Key> {
        Table::new(
            schemars::schema_for!(Example),
            &[],
            |d| Example::deserialize(d).map(drop),
            &[],
        )
        .unwrap()
        .keys()
        .unwrap()
    }

    #[test]
    fn each_key_has_its_doc_and_its_default() {
        let keys = keys();
        let rows: Vec<(&str, &str, &str)> = keys
            .iter()
            .map(|k| (k.name, k.default.as_str(), k.what.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                ("count", "`3`", "how many"),
                ("place", "the node's own", "where it is"),
                (
                    "mode",
                    "`\"off\"`",
                    "off or on: `\"off\"`: nothing happens; `\"on\"`: something does"
                ),
                ("list", "`[]`", "things"),
            ]
        );
    }

    #[derive(Serialize, Deserialize, JsonSchema)]
    #[serde(default)]
    struct Contradiction {
        /// A number.
        ///
        /// Default: seven.
        number: u32,
    }

    impl Default for Contradiction {
        fn default() -> Self {
            Contradiction { number: 8 }
        }
    }

    #[test]
    fn a_default_in_words_may_not_hide_a_value() {
        let table = Table::new(
            schemars::schema_for!(Contradiction),
            &[],
            |d| Contradiction::deserialize(d).map(drop),
            &[],
        )
        .unwrap();
        let e = table.keys().unwrap_err();
        assert!(matches!(e, TableError::TwoDefaults { .. }), "{e}");
    }
}
