//! Documents: which format a file is in, its root object, and typed reading with errors
//! that name the field by its path in the document.
//!
//! Every document is first read into a JSON value, whatever its format, and the typed
//! readers work on that: JSON, YAML and TOML accept the same values and give the same
//! errors, and a reader can look at the root's keys to tell the two client shapes apart.

use std::path::Path;

use serde::de::{self, DeserializeOwned};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::error::ConfigError;

/// The format of a config document. YAML and TOML are read when their features of
/// stormguard-core (`yaml`, `toml`, both on by default) are on; without them, reading
/// such a document is [`ConfigError::FormatDisabled`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JSON (`.json`).
    Json,
    /// YAML (`.yaml`, `.yml`).
    Yaml,
    /// TOML (`.toml`).
    Toml,
}

impl Format {
    /// The format a file's extension names.
    pub(crate) fn from_path(path: &Path) -> Result<Format, ConfigError> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Ok(Format::Json),
            Some("yaml" | "yml") => Ok(Format::Yaml),
            Some("toml") => Ok(Format::Toml),
            _ => Err(ConfigError::Read {
                path: path.display().to_string(),
                reason: "the name must end in .json, .yaml, .yml or .toml".to_owned(),
            }),
        }
    }

    /// `"JSON"`, `"YAML"` or `"TOML"`.
    fn name(self) -> &'static str {
        match self {
            Format::Json => "JSON",
            Format::Yaml => "YAML",
            Format::Toml => "TOML",
        }
    }

    /// The feature of stormguard-core that reads the format (JSON is always read).
    fn feature(self) -> &'static str {
        match self {
            Format::Json => "",
            Format::Yaml => "yaml",
            Format::Toml => "toml",
        }
    }
}

/// A type read from a document that builds, with every check, the config it describes.
pub(crate) trait Build {
    /// What it builds.
    type Config;
    /// The config, validated.
    fn build(self) -> Result<Self::Config, ConfigError>;
}

/// What a config type's `Deserialize` is: its document type, deserialized and built, so
/// that a config that deserialized is valid. A failed check is a custom error with the
/// [`ConfigError`]'s message, which names the field.
pub(crate) fn built<'de, B, D>(d: D) -> Result<B::Config, D::Error>
where
    B: Build + Deserialize<'de>,
    D: Deserializer<'de>,
{
    B::deserialize(d)?.build().map_err(de::Error::custom)
}

/// A document's root object. An empty YAML document is an empty object.
pub(crate) fn parse(text: &str, format: Format) -> Result<Map<String, Value>, ConfigError> {
    let malformed =
        |e: &dyn std::fmt::Display| ConfigError::Malformed(format!("{}: {e}", format.name()));
    let root: Value = match format {
        Format::Json => serde_json::from_str(text).map_err(|e| malformed(&e))?,
        #[cfg(feature = "yaml")]
        Format::Yaml => serde_norway::from_str(text).map_err(|e| malformed(&e))?,
        #[cfg(feature = "toml")]
        Format::Toml => toml::from_str(text).map_err(|e| malformed(&e))?,
        #[allow(unreachable_patterns)]
        _ => {
            return Err(ConfigError::FormatDisabled {
                format: format.name(),
                feature: format.feature(),
            });
        }
    };
    match root {
        Value::Object(map) => Ok(map),
        Value::Null if format == Format::Yaml => Ok(Map::new()),
        _ => Err(ConfigError::Malformed(
            "the document's root must be a mapping of fields (a JSON object)".to_owned(),
        )),
    }
}

/// Reads the file at `path` (its format from its name) with `read`. An error in the
/// file's content is [`ConfigError::File`], naming the file.
pub(crate) fn read_file<T>(
    path: &Path,
    read: impl FnOnce(Map<String, Value>) -> Result<T, ConfigError>,
) -> Result<T, ConfigError> {
    let format = Format::from_path(path)?;
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    parse(&text, format)
        .and_then(read)
        .map_err(|error| ConfigError::File {
            path: path.to_owned(),
            error: Box::new(error),
        })
}

/// `root` as a `T` that refuses fields it does not know (stormguard's own shapes).
pub(crate) fn strict<T: DeserializeOwned>(root: Map<String, Value>) -> Result<T, ConfigError> {
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(Value::Object(root), &mut track);
    T::deserialize(de).map_err(|e| field_error(&track.path(), &e))
}

/// `root` as a `T` that skips fields it does not know, as gRPC does with its service
/// config; `skipped` gets the path of each (`methodConfig[0].waitForReady`).
pub(crate) fn lenient<T: DeserializeOwned>(
    root: Map<String, Value>,
    mut skipped: impl FnMut(String),
) -> Result<T, ConfigError> {
    let mut track = serde_path_to_error::Track::new();
    let de = serde_path_to_error::Deserializer::new(Value::Object(root), &mut track);
    serde_ignored::deserialize(de, |path| skipped(path_of(&path)))
        .map_err(|e| field_error(&track.path(), &e))
}

/// An error at `path`. serde reports a missing field at the object that lacks it: the
/// error names the field itself (`retryThrottling.tokenRatio`, not `retryThrottling`).
fn field_error(path: &serde_path_to_error::Path, error: &serde_json::Error) -> ConfigError {
    let message = error.to_string();
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|m| m.strip_suffix('`'));
    match missing {
        Some(name) if path.iter().next().is_none() => ConfigError::invalid(name, "is required"),
        Some(name) => ConfigError::invalid(format!("{path}.{name}"), "is required"),
        None => ConfigError::invalid(path.to_string(), message),
    }
}

/// A skipped field's path, spelled as [`serde_path_to_error`] spells the paths of errors.
fn path_of(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", path_of(parent)),
        Path::Map { parent, key } => match path_of(parent) {
            parent if parent.is_empty() => key.clone(),
            parent => format!("{parent}.{key}"),
        },
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => path_of(parent),
    }
}
