//! Configuration (docs/cli.md): flags > environment > `--config` TOML file > defaults, resolved and
//! validated in one pass before any connection is made. Every error names its culprit: the
//! flag, the environment variable, or the key and file it came from.
//!
//! The environment is read through a function, so tests never touch the process environment.
//!
//! - [`cli`]: the command line.
//! - `source`: where each option's value comes from (flag, environment, file) and the
//!   option table, [`OPTIONS`].
//! - `resolve`: [`Config::resolve`], each option parsed, defaulted and checked against the
//!   others.
//! - `settings`: [`Config`], and the relay's parts it sets up.
//! - `postgres`, `redis_endpoint`: the checks and settings of each side's connections.
//! - `values`: parsers of option values ([`parse_duration`], [`parse_byte_size`], ...).

pub mod cli;
/// `--redis-url`'s forms: [`crate::broker::url`], kept here under its old name.
pub use crate::broker::url as redis_url;

mod error;
mod postgres;
mod redis_endpoint;
mod resolve;
mod secret_url;
mod settings;
mod source;
mod values;

pub use self::error::ConfigError;
pub use self::postgres::{session_settings, PgFootprint};
pub use self::redis_endpoint::CaFile;
pub use self::secret_url::SecretUrl;
pub use self::settings::Config;
pub use self::source::OPTIONS;
pub use self::values::{parse_byte_size, parse_duration};
pub use crate::defaults::*;
