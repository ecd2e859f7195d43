//! The keys of a config table in the order its type declares them.
//!
//! A JSON schema cannot say: schemars keeps `properties` in a
//! `serde_json::Map`, sorted by name unless serde_json's `preserve_order`
//! is on, and turning that on here would change every map of every crate
//! built with this one. Serde's derived `Deserialize` can: it hands the
//! deserializer the struct's field names, in declaration order, as
//! `deserialize_struct`'s `fields`. [`declared_keys`] runs a type's
//! deserializer against [`Probe`], which records them and stops. To reach
//! a nested table, the probe answers the struct with a map of one key, the
//! next on the path, whose value is the probe again.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, Visitor};
use serde::forward_to_deserialize_any;

/// Why no keys were recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FieldsError(String);

impl de::Error for FieldsError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        FieldsError(msg.to_string())
    }
}

/// What the probe found: the keys of the table at the path's end.
type Found = Cell<Option<&'static [&'static str]>>;

/// The keys of the table at `path` within the type `deserialize` reads
/// (a type's `Deserialize::deserialize`, or the inherent one a
/// `#[serde(remote = "Self")]` type has), in declaration order.
pub fn declared_keys(
    deserialize: impl FnOnce(Probe<'_>) -> Result<(), FieldsError>,
    path: &[&'static str],
) -> Result<Vec<&'static str>, FieldsError> {
    let found = Found::new(None);
    // The probe always stops the read with an error: what counts is
    // whether it recorded the keys on the way.
    let outcome = deserialize(Probe {
        path,
        found: &found,
    });
    match (found.get(), outcome) {
        (Some(keys), _) => Ok(keys.to_vec()),
        (None, Err(e)) => Err(FieldsError(format!("no table at {path:?}: {e}"))),
        (None, Ok(())) => Err(FieldsError(format!("no table at {path:?}"))),
    }
}

/// The deserializer [`declared_keys`] hands a type's reader.
pub struct Probe<'a> {
    path: &'a [&'static str],
    found: &'a Found,
}

impl<'de> de::Deserializer<'de> for Probe<'_> {
    type Error = FieldsError;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, FieldsError> {
        match self.path.split_first() {
            None => {
                self.found.set(Some(fields));
                Err(FieldsError(format!("recorded the keys of {name}")))
            }
            Some((key, rest)) => visitor.visit_map(OneKey {
                key: Some(key),
                rest,
                found: self.found,
            }),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, FieldsError> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, FieldsError> {
        visitor.visit_newtype_struct(self)
    }

    /// Anything but a struct (a tagged enum, a config read through a
    /// generic value first) names no keys.
    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, FieldsError> {
        Err(FieldsError(
            "the type is not read as a plain struct here".into(),
        ))
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

/// A table of one key, `key`, whose value is the probe for `rest`.
struct OneKey<'a> {
    key: Option<&'static str>,
    rest: &'a [&'static str],
    found: &'a Found,
}

impl<'de> MapAccess<'de> for OneKey<'_> {
    type Error = FieldsError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, FieldsError> {
        self.key
            .take()
            .map(|key| seed.deserialize(key.into_deserializer()))
            .transpose()
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, FieldsError> {
        seed.deserialize(Probe {
            path: self.rest,
            found: self.found,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        zeta: u32,
        alpha: u32,
    }

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Outer {
        second: bool,
        #[serde(rename = "first")]
        inner: Option<Inner>,
    }

    fn read_outer(probe: Probe<'_>) -> Result<(), FieldsError> {
        Outer::deserialize(probe).map(drop)
    }

    #[test]
    fn keys_come_in_declaration_order_under_their_names() {
        assert_eq!(declared_keys(read_outer, &[]).unwrap(), ["second", "first"]);
        assert_eq!(
            declared_keys(read_outer, &["first"]).unwrap(),
            ["zeta", "alpha"]
        );
    }

    #[test]
    fn a_path_that_is_no_table_is_an_error() {
        let e = declared_keys(read_outer, &["third"]).unwrap_err();
        assert!(e.to_string().contains("third"), "{e}");
        assert!(declared_keys(read_outer, &["second"]).is_err());
    }
}
