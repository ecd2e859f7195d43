//! Reading a provider config whose keys have moved: each old key is still
//! read, at its new place, with a deprecation warning that names the new
//! key; a file that sets both the old and the new key is refused, since
//! either choice would silently drop one of them. The keys of the `api`
//! table ([`ApiConfig`]) that a file leaves out take the cloud's defaults,
//! not the shared ones. A key whose value changed meaning as it moved is
//! read by the config type's own [`Rewrite`].
//!
//! A config type reads itself through [`read_config`]: the file's table is
//! read as a generic value, its moved keys are put in place, and the
//! type's derived reader (`#[serde(remote = "Self")]`) reads the result,
//! so unknown keys are still refused by name.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::api_config::ApiConfig;

/// A key that moved: `old` and `new` are paths in the config's table,
/// nested tables joined by dots (`api_attempts` to `api.max_attempts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyMove {
    pub old: &'static str,
    pub new: &'static str,
}

impl KeyMove {
    /// The warning a file that still uses `old` gets.
    pub fn deprecation(&self, section: &str) -> String {
        format!(
            "[{section}] {} is deprecated: it is read as {}; write {} instead",
            self.old, self.new, self.new
        )
    }
}

/// The flat rate keys of before, read now as the `api` table's: the AWS
/// node's (`[provider]`) and the operator's own (`[operator]`).
pub const FLAT_RATE_MOVES: [KeyMove; 2] = [
    KeyMove {
        old: "api_mutating_rate",
        new: "api.mutating_rate",
    },
    KeyMove {
        old: "api_describe_rate",
        new: "api.read_rate",
    },
];

/// Rewrites the old keys of a table whose values changed meaning as they
/// moved (the warm pool's `max_free`, a bound, is now
/// `max_above_watermark`, a difference); returns the warnings to log.
/// Runs before the plain [`KeyMove`]s; `Err` is the message that refuses
/// the file, its section named.
pub type Rewrite = fn(section: &str, table: &mut Map<String, Value>) -> Result<Vec<String>, String>;

/// How one config type is read: the section it is in (`provider` for
/// enimd's, `cloud` for the operator's cloud, `operator` for its policy),
/// for messages; the keys that moved;
/// the defaults of its `api` table, for a cloud's config; and its
/// [`Rewrite`], if any.
#[derive(Debug, Clone)]
pub struct ConfigKeys {
    pub section: &'static str,
    pub moves: &'static [KeyMove],
    pub api_defaults: Option<ApiConfig>,
    pub rewrite: Option<Rewrite>,
}

/// Implements `Deserialize` for the config type `$ty` through
/// [`read_config`] with the [`ConfigKeys`] `$keys` makes, and `Serialize`
/// as derived. `$ty` derives both with `#[serde(remote = "Self")]`, which
/// makes the derived code inherent functions these call.
#[macro_export]
macro_rules! serde_with_moved_keys {
    ($ty:ty, $keys:expr) => {
        impl<'de> ::serde::Deserialize<'de> for $ty {
            fn deserialize<D: ::serde::Deserializer<'de>>(
                deserializer: D,
            ) -> ::std::result::Result<Self, D::Error> {
                $crate::config_keys::read_config(deserializer, &$keys, <$ty>::deserialize)
            }
        }

        impl ::serde::Serialize for $ty {
            fn serialize<S: ::serde::Serializer>(
                &self,
                serializer: S,
            ) -> ::std::result::Result<S::Ok, S::Error> {
                <$ty>::serialize(self, serializer)
            }
        }
    };
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("[{section}] sets both {old} (deprecated) and {new}: keep only {new}")]
    Both {
        section: String,
        old: &'static str,
        new: &'static str,
    },
    #[error("[{section}] {key} must be a table")]
    NotATable { section: String, key: String },
    #[error("[{section}] the defaults of api: {why}")]
    Defaults { section: String, why: String },
}

/// Reads a config as `keys` says, with `read`, the type's derived reader.
/// Each old key the file uses is logged as deprecated.
pub fn read_config<'de, D, T>(
    deserializer: D,
    keys: &ConfigKeys,
    read: impl FnOnce(Value) -> Result<T, serde_json::Error>,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    let mut value = Value::deserialize(deserializer)?;
    // Anything but a table is left for `read` to refuse.
    if let Value::Object(table) = &mut value {
        if let Some(rewrite) = keys.rewrite {
            for warning in rewrite(keys.section, table).map_err(D::Error::custom)? {
                tracing::warn!("{warning}");
            }
        }
        let moved = move_keys(keys.section, table, keys.moves).map_err(D::Error::custom)?;
        for m in moved {
            tracing::warn!(old = m.old, new = m.new, "{}", m.deprecation(keys.section));
        }
        if let Some(defaults) = &keys.api_defaults {
            fill_api_defaults(keys.section, table, defaults).map_err(D::Error::custom)?;
        }
    }
    read(value).map_err(D::Error::custom)
}

/// Moves each old key `table` sets to its new path; returns the moves
/// made.
pub fn move_keys(
    section: &str,
    table: &mut Map<String, Value>,
    moves: &[KeyMove],
) -> Result<Vec<KeyMove>, KeyError> {
    let mut made = Vec::new();
    for m in moves {
        let Some(value) = take_old(section, table, m)? else {
            continue;
        };
        insert(section, table, m.new, value)?;
        made.push(*m);
    }
    Ok(made)
}

/// Removes and returns the value of `m.old`, if `table` sets it; refuses a
/// table that also sets `m.new`. For a [`Rewrite`], which puts the new key
/// in place itself (see [`insert`]).
pub fn take_old(
    section: &str,
    table: &mut Map<String, Value>,
    m: &KeyMove,
) -> Result<Option<Value>, KeyError> {
    let Some(value) = take(table, m.old) else {
        return Ok(None);
    };
    if get(table, m.new).is_some() {
        return Err(KeyError::Both {
            section: section.into(),
            old: m.old,
            new: m.new,
        });
    }
    Ok(Some(value))
}

/// Puts each key of `defaults` the `api` table leaves out in it (the whole
/// table when there is none).
fn fill_api_defaults(
    section: &str,
    table: &mut Map<String, Value>,
    defaults: &ApiConfig,
) -> Result<(), KeyError> {
    let defaults = serde_json::to_value(defaults).map_err(|e| KeyError::Defaults {
        section: section.into(),
        why: e.to_string(),
    })?;
    let api = table
        .entry("api")
        .or_insert_with(|| Value::Object(Map::new()));
    if let (Value::Object(api), Value::Object(defaults)) = (api, defaults) {
        for (key, value) in defaults {
            api.entry(key).or_insert(value);
        }
    }
    Ok(())
}

/// The value at `path`, if `table` sets it.
pub fn get<'a>(table: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    let (head, rest) = split(path);
    match rest {
        None => table.get(head),
        Some(rest) => get(table.get(head)?.as_object()?, rest),
    }
}

/// Removes and returns the value at `path`, if there is one.
fn take(table: &mut Map<String, Value>, path: &str) -> Option<Value> {
    let (head, rest) = split(path);
    match rest {
        None => table.remove(head),
        Some(rest) => take(table.get_mut(head)?.as_object_mut()?, rest),
    }
}

/// Sets `path` to `value`, making the tables on the way.
pub fn insert(
    section: &str,
    table: &mut Map<String, Value>,
    path: &str,
    value: Value,
) -> Result<(), KeyError> {
    let (head, rest) = split(path);
    let Some(rest) = rest else {
        table.insert(head.into(), value);
        return Ok(());
    };
    let inner = table
        .entry(head)
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(inner) = inner else {
        return Err(KeyError::NotATable {
            section: section.into(),
            key: head.into(),
        });
    };
    insert(section, inner, rest, value)
}

fn split(path: &str) -> (&str, Option<&str>) {
    match path.split_once('.') {
        Some((head, rest)) => (head, Some(rest)),
        None => (path, None),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    const MOVES: &[KeyMove] = &[
        KeyMove {
            old: "api_attempts",
            new: "api.max_attempts",
        },
        KeyMove {
            old: "api.poll",
            new: "poll",
        },
    ];

    fn moved(value: Value) -> Result<(Value, Vec<KeyMove>), KeyError> {
        let Value::Object(mut table) = value else {
            panic!("not a table");
        };
        let made = move_keys("provider", &mut table, MOVES)?;
        Ok((Value::Object(table), made))
    }

    #[test]
    fn an_old_key_moves_to_its_new_place() {
        let (value, made) = moved(json!({"api_attempts": 3, "api": {"poll": "1s"}})).unwrap();
        assert_eq!(value, json!({"api": {"max_attempts": 3}, "poll": "1s"}));
        assert_eq!(made, MOVES);
        assert_eq!(
            made[0].deprecation("provider"),
            "[provider] api_attempts is deprecated: it is read as api.max_attempts; \
             write api.max_attempts instead"
        );
    }

    #[test]
    fn new_keys_are_left_as_they_are() {
        let new = json!({"api": {"max_attempts": 3}, "poll": "1s"});
        let (value, made) = moved(new.clone()).unwrap();
        assert_eq!((value, made), (new, Vec::new()));
    }

    #[test]
    fn old_and_new_key_both_set_is_refused() {
        let e = moved(json!({"api_attempts": 3, "api": {"max_attempts": 4}})).unwrap_err();
        assert_eq!(
            e.to_string(),
            "[provider] sets both api_attempts (deprecated) and api.max_attempts: \
             keep only api.max_attempts"
        );
        let e = moved(json!({"api_attempts": 3, "api": 7})).unwrap_err();
        assert!(matches!(e, KeyError::NotATable { .. }), "{e}");
    }

    /// A config with a moved key and an `api` table, read as a cloud's
    /// config type is.
    #[derive(Debug, PartialEq, serde::Serialize, Deserialize)]
    #[serde(remote = "Self", deny_unknown_fields)]
    struct Probe {
        api: ApiConfig,
        #[serde(default)]
        poll: Option<String>,
    }

    crate::serde_with_moved_keys!(
        Probe,
        ConfigKeys {
            section: "provider",
            moves: MOVES,
            api_defaults: Some(ApiConfig {
                backoff: Duration::from_millis(500),
                ..ApiConfig::default()
            }),
            rewrite: None,
        }
    );

    fn read(text: &str) -> Result<Probe, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn api_keys_left_out_take_the_cloud_defaults() {
        let p = read(r#"{"api": {"max_attempts": 2}}"#).unwrap();
        assert_eq!(p.api.max_attempts, 2);
        assert_eq!(p.api.backoff, Duration::from_millis(500));
        let p = read("{}").unwrap();
        assert_eq!(p.api.backoff, Duration::from_millis(500));
        assert_eq!(p.api.max_attempts, 5);
    }

    #[test]
    fn reading_warns_of_each_old_key_and_still_refuses_unknown_ones() {
        let (p, logged) = crate::testing::warnings_of(|| read(r#"{"api_attempts": 2}"#));
        assert_eq!(p.unwrap().api.max_attempts, 2);
        assert_eq!(logged.len(), 1, "{logged:?}");
        assert!(
            logged[0].contains("api_attempts is deprecated") && logged[0].contains("WARN"),
            "{logged:?}"
        );
        let (_, logged) = crate::testing::warnings_of(|| read(r#"{"api": {"max_attempts": 2}}"#));
        assert!(logged.is_empty(), "{logged:?}");
        let e = read(r#"{"api_atempts": 2}"#).unwrap_err();
        assert!(e.contains("api_atempts"), "{e}");
        let e = read(r#"{"api_attempts": 2, "api": {"max_attempts": 1}}"#).unwrap_err();
        assert!(e.contains("keep only api.max_attempts"), "{e}");
    }

    #[test]
    fn written_back_it_reads_the_same() {
        let p = read(r#"{"api_attempts": 2, "poll": "1s"}"#).unwrap();
        let written = serde_json::to_string(&p).unwrap();
        assert!(written.contains(r#""max_attempts":2"#), "{written}");
        assert_eq!(read(&written).unwrap(), p);
    }
}
