//! [`Mode`]: how a node hands ENIs to its pods, chosen once for the node
//! (enimd's `mode`, the NetResourceSet's `spec.mode`, each attachment's
//! record). Written `primary` or `secondary` wherever it is written.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A whole ENI per pod, moved into its namespace.
    #[default]
    Primary,
    /// A secondary address per pod: ENIs stay in the host, and each pod
    /// gets one of their secondary addresses over a veth pair, with policy
    /// routing.
    Secondary,
}

impl Mode {
    /// The name the mode is written under (`primary`, `secondary`).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Primary => "primary",
            Mode::Secondary => "secondary",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spelling the CRD, enimd's config and the checkpoint all use:
    /// one enum serves the three only while it stays this.
    #[test]
    fn written_as_its_name_everywhere() {
        for mode in [Mode::Primary, Mode::Secondary] {
            let written = serde_json::to_string(&mode).unwrap();
            assert_eq!(written, format!("\"{mode}\""));
            assert_eq!(serde_json::from_str::<Mode>(&written).unwrap(), mode);
        }
        assert!(serde_json::from_str::<Mode>("\"Primary\"").is_err());
    }
}
