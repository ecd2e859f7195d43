//! [`MacAddr`]: a MAC address, read from either separator and always
//! written in canonical lower-case `aa:bb:cc:dd:ee:ff` form.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A MAC address, kept in canonical lower-case `aa:bb:cc:dd:ee:ff` form.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MAC address {0:?}: expected six hex octets separated by ':' or '-'")]
pub struct MacParseError(pub String);

impl std::str::FromStr for MacAddr {
    type Err = MacParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || MacParseError(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for octet in out.iter_mut() {
            let part = parts.next().ok_or_else(err)?;
            // Two hex digits: from_str_radix alone would take "+a".
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            *octet = u8::from_str_radix(part, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddr(out))
    }
}

impl Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trip_and_rejects() {
        let m: MacAddr = "02:AB:cd:00:11:ff".parse().unwrap();
        assert_eq!(m.to_string(), "02:ab:cd:00:11:ff");
        assert_eq!("02-ab-cd-00-11-ff".parse::<MacAddr>().unwrap(), m);
        for bad in [
            "",
            "02:ab:cd:00:11",
            "02:ab:cd:00:11:ff:00",
            "0g:ab:cd:00:11:ff",
            "2:ab:cd:00:11:ff0",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad} accepted");
        }
    }
}
