//! The configuration reference, docs/configuration.md: its tables of keys
//! (`| key | default | what |`), one per TOML table, generated from the
//! config types' JSON schemas (schemars, each crate's `schema` feature).
//!
//! The page marks each generated table with `<!-- generated: NAME -->` and
//! `<!-- end generated -->` ([`splice`]); [`sections`] says what each NAME
//! is made from. Everything around the markers (the prose, the examples,
//! the flags) is written by hand and left alone. How a key's "what" and
//! "default" are found: [`table`]. The test `tests/configuration_md.rs`
//! fails when the page differs from what the types say, and rewrites it
//! with `ENIM_BLESS=1`.

pub mod fields;
pub mod render;
pub mod splice;
pub mod table;

use serde::Deserialize;

use enim::daemon::config::Config;
use enim_cni::config::PluginKeys;
use enim_operator::config::{OperatorConfig, PoolConfig as OperatorPoolConfig};
use enim_provider_aws::{AwsConfig, AwsFleetConfig, PoolConfig};
use enim_provider_bce::{BceConfig, BceFleetConfig};
use enim_provider_cluster::ClusterConfig;
use enim_provider_static::{StaticEniConfig, StaticFleetConfig};

use splice::{MarkerError, Page};
use table::{Table, TableError};

/// The table at the path of keys (`"secondary", "pool"`) within the type
/// `$ty`. Its keys' order is read from `$ty`'s reader along the same path,
/// or, after `keys of`, from the table's own type `$own`: a reader that goes
/// through a generic value first (the configs with moved keys) names no
/// keys, so the path cannot pass through one. `<$ty>::deserialize` is the
/// type's inherent reader where it has one (`#[serde(remote = "Self")]`),
/// else its `Deserialize`.
macro_rules! table {
    ($ty:ty $(, $key:literal)*) => {
        Table::new(
            schemars::schema_for!($ty),
            &[$($key),*],
            |probe| <$ty>::deserialize(probe).map(drop),
            &[$($key),*],
        )
    };
    ($ty:ty $(, $key:literal)*; keys of $own:ty) => {
        Table::new(
            schemars::schema_for!($ty),
            &[$($key),*],
            |probe| <$own>::deserialize(probe).map(drop),
            &[],
        )
    };
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigRefError {
    #[error("section {section:?}: {source}")]
    Table {
        section: &'static str,
        #[source]
        source: TableError,
    },
    #[error("docs/configuration.md: {0}")]
    Marker(#[from] MarkerError),
    #[error("docs/configuration.md has no section {0:?}: add its markers where its table goes")]
    Missing(&'static str),
    #[error("docs/configuration.md has a section {0:?} that nothing generates")]
    Unknown(String),
}

/// One generated table of the page.
pub struct Section {
    /// The name in its markers.
    pub name: &'static str,
    /// Where its keys come from: one table, or the same type in several
    /// configs (`[provider.api]` of aws and of bce), each labelled, whose
    /// defaults may differ.
    sources: Vec<(&'static str, Table)>,
    /// Keys left out: tables whose sections follow this one.
    omit: &'static [&'static str],
    /// Keys whose tables have a section elsewhere, with the link that
    /// stands as their default.
    see: &'static [(&'static str, &'static str)],
}

impl Section {
    fn new(
        name: &'static str,
        table: Result<Table, TableError>,
    ) -> Result<Section, ConfigRefError> {
        Section::shared(name, vec![("", table)])
    }

    fn shared(
        name: &'static str,
        sources: Vec<(&'static str, Result<Table, TableError>)>,
    ) -> Result<Section, ConfigRefError> {
        let sources = sources
            .into_iter()
            .map(|(label, table)| Ok((label, table?)))
            .collect::<Result<_, TableError>>()
            .map_err(|source| ConfigRefError::Table {
                section: name,
                source,
            })?;
        Ok(Section {
            name,
            sources,
            omit: &[],
            see: &[],
        })
    }

    fn omit(mut self, keys: &'static [&'static str]) -> Section {
        self.omit = keys;
        self
    }

    fn see(mut self, links: &'static [(&'static str, &'static str)]) -> Section {
        self.see = links;
        self
    }

    /// The markdown table.
    pub fn render(&self) -> Result<String, ConfigRefError> {
        let failed = |source| ConfigRefError::Table {
            section: self.name,
            source,
        };
        let keyed = self
            .sources
            .iter()
            .map(|(label, table)| Ok((*label, table.keys()?)))
            .collect::<Result<Vec<_>, TableError>>()
            .map_err(failed)?;
        let (_, first) = &keyed[0];
        let mut out = String::from("| key | default | what |\n|---|---|---|\n");
        for (at, key) in first.iter().enumerate() {
            if self.omit.contains(&key.name) {
                continue;
            }
            let default = match self.see.iter().find(|(k, _)| *k == key.name) {
                Some((_, link)) => (*link).to_string(),
                None => merged_default(&keyed, at),
            };
            out.push_str(&format!(
                "| {} | {} | {} |\n",
                render::code(key.name),
                render::cell(&default),
                render::cell(&key.what)
            ));
        }
        Ok(out)
    }
}

/// The default of the `at`-th key in every source: one, where they agree,
/// else each labelled (`aws "200ms", bce "500ms"`).
fn merged_default(keyed: &[(&str, Vec<table::Key>)], at: usize) -> String {
    let defaults: Vec<&str> = keyed
        .iter()
        .map(|(_, keys)| keys[at].default.as_str())
        .collect();
    if defaults.iter().all(|d| *d == defaults[0]) {
        return defaults[0].to_string();
    }
    keyed
        .iter()
        .zip(defaults)
        .map(|((label, _), default)| format!("{label} {default}"))
        .collect::<Vec<_>>()
        .join(", ")
}

const PROVIDER_API: &str = "see [`[provider.api]`](#providerapi-aws-and-bce)";
const PROVIDER_POOL: &str = "see [`[provider.pool]`](#providerpool-aws-and-bce)";

/// Every generated table of the page, in page order.
pub fn sections() -> Result<Vec<Section>, ConfigRefError> {
    Ok(vec![
        Section::new("enimd.toml", table!(Config))?.omit(&[
            "events",
            "exclude",
            "secondary",
            "host_path",
            "pod_metadata",
            "device_plugin",
            "dra",
            "provider",
        ]),
        Section::new("enimd.toml [exclude]", table!(Config, "exclude"))?,
        Section::new("enimd.toml [host_path]", table!(Config, "host_path"))?,
        Section::new("enimd.toml [pod_metadata]", table!(Config, "pod_metadata"))?,
        Section::new("enimd.toml [secondary]", table!(Config, "secondary"))?.omit(&["pool"]),
        Section::new(
            "enimd.toml [secondary.pool]",
            table!(Config, "secondary", "pool"),
        )?,
        Section::new(
            "enimd.toml [device_plugin]",
            table!(Config, "device_plugin"),
        )?,
        Section::new("enimd.toml [dra]", table!(Config, "dra"))?,
        Section::new("enimd.toml [events]", table!(Config, "events"))?,
        Section::new("enimd.toml [[provider.enis]]", table!(StaticEniConfig))?,
        Section::new("enimd.toml [provider] aws", table!(AwsConfig))?
            .see(&[("api", PROVIDER_API), ("pool", PROVIDER_POOL)]),
        Section::new("enimd.toml [provider] bce", table!(BceConfig))?
            .see(&[("api", PROVIDER_API), ("pool", PROVIDER_POOL)]),
        Section::shared(
            "enimd.toml [provider.api]",
            vec![
                ("aws", table!(AwsConfig, "api")),
                ("bce", table!(BceConfig, "api")),
            ],
        )?,
        Section::shared(
            "enimd.toml [provider.pool]",
            vec![
                ("aws", table!(AwsConfig, "pool"; keys of PoolConfig)),
                ("bce", table!(BceConfig, "pool"; keys of PoolConfig)),
            ],
        )?,
        Section::new("enimd.toml [provider] cluster", table!(ClusterConfig))?,
        Section::new("conflist", table!(PluginKeys))?,
        Section::new("operator.toml [operator]", table!(OperatorConfig))?.omit(&[
            "watermarks",
            "pools",
            "api",
            "policy",
        ]),
        Section::new(
            "operator.toml [operator.watermarks]",
            table!(OperatorConfig, "watermarks"),
        )?,
        Section::new(
            "operator.toml [operator.api]",
            table!(OperatorConfig, "api"),
        )?,
        Section::new(
            "operator.toml [operator.policy]",
            table!(OperatorConfig, "policy"),
        )?,
        Section::new(
            "operator.toml [[operator.pools]]",
            table!(OperatorPoolConfig),
        )?,
        Section::new("operator.toml [cloud] aws", table!(AwsFleetConfig))?
            .see(&[("api", PROVIDER_API)]),
        Section::new("operator.toml [cloud] bce", table!(BceFleetConfig))?
            .see(&[("api", PROVIDER_API)]),
        Section::new("operator.toml [cloud] static", table!(StaticFleetConfig))?,
    ])
}

/// A section whose table on the page is not the one the types give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stale {
    pub name: &'static str,
    pub on_page: String,
    pub generated: String,
}

/// The page with every section regenerated, and the sections that
/// changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Regenerated {
    pub text: String,
    pub stale: Vec<Stale>,
}

/// Regenerates every section of `page` (the text of
/// docs/configuration.md). Every section of [`sections`] must be on the
/// page, and nothing else may be marked as generated.
pub fn regenerate(page: &str) -> Result<Regenerated, ConfigRefError> {
    let mut parsed = Page::parse(page)?;
    let sections = sections()?;
    if let Some((name, _)) = parsed
        .sections()
        .find(|(name, _)| !sections.iter().any(|s| s.name == *name))
    {
        return Err(ConfigRefError::Unknown(name.into()));
    }
    let mut stale = Vec::new();
    for section in &sections {
        let generated = section.render()?;
        let on_page = parsed
            .sections()
            .find(|(name, _)| *name == section.name)
            .map(|(_, content)| content.to_string())
            .ok_or(ConfigRefError::Missing(section.name))?;
        if on_page != generated {
            parsed.set(section.name, generated.clone());
            stale.push(Stale {
                name: section.name,
                on_page,
                generated,
            });
        }
    }
    Ok(Regenerated {
        text: parsed.text(),
        stale,
    })
}
