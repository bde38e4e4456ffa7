//! Where each option's text comes from: flag, environment, TOML file, in that order.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::cli::Flags;
use super::error::ConfigError;
use crate::telemetry::redact;

/// Every option: TOML key, flag, environment variable (None: flag and file only).
pub const OPTIONS: &[(&str, &str, Option<&str>)] = &[
    ("database_url", "--database-url", Some("DATABASE_URL")),
    (
        "database_url_file",
        "--database-url-file",
        Some("DATABASE_URL_FILE"),
    ),
    ("listen_url", "--listen-url", Some("JOBRELAY_LISTEN_URL")),
    (
        "listen_url_file",
        "--listen-url-file",
        Some("JOBRELAY_LISTEN_URL_FILE"),
    ),
    (
        "pg_max_connections",
        "--pg-max-connections",
        Some("JOBRELAY_PG_MAX_CONNECTIONS"),
    ),
    (
        "prepared_statements",
        "--prepared-statements",
        Some("JOBRELAY_PREPARED_STATEMENTS"),
    ),
    ("redis_url", "--redis-url", Some("REDIS_URL")),
    ("redis_url_file", "--redis-url-file", Some("REDIS_URL_FILE")),
    (
        "redis_ca_file",
        "--redis-ca-file",
        Some("JOBRELAY_REDIS_CA_FILE"),
    ),
    (
        "redis_allow_eviction",
        "--redis-allow-eviction",
        Some("JOBRELAY_REDIS_ALLOW_EVICTION"),
    ),
    (
        "redis_wait_replicas",
        "--redis-wait-replicas",
        Some("JOBRELAY_REDIS_WAIT_REPLICAS"),
    ),
    (
        "redis_wait_timeout",
        "--redis-wait-timeout",
        Some("JOBRELAY_REDIS_WAIT_TIMEOUT"),
    ),
    ("table", "--table", Some("JOBRELAY_TABLE")),
    ("namespace", "--namespace", Some("JOBRELAY_NAMESPACE")),
    ("layout", "--layout", Some("JOBRELAY_LAYOUT")),
    ("batch_size", "--batch-size", Some("JOBRELAY_BATCH_SIZE")),
    (
        "batch_max_bytes",
        "--batch-max-bytes",
        Some("JOBRELAY_BATCH_MAX_BYTES"),
    ),
    (
        "max_job_size",
        "--max-job-size",
        Some("JOBRELAY_MAX_JOB_SIZE"),
    ),
    ("workers", "--workers", Some("JOBRELAY_WORKERS")),
    ("claim_slots", "--claim-slots", Some("JOBRELAY_CLAIM_SLOTS")),
    (
        "poll_interval",
        "--poll-interval",
        Some("JOBRELAY_POLL_INTERVAL"),
    ),
    (
        "max_attempts",
        "--max-attempts",
        Some("JOBRELAY_MAX_ATTEMPTS"),
    ),
    ("dedup_ttl", "--dedup-ttl", Some("JOBRELAY_DEDUP_TTL")),
    ("http_addr", "--http-addr", Some("JOBRELAY_HTTP_ADDR")),
    (
        "shutdown_timeout",
        "--shutdown-timeout",
        Some("JOBRELAY_SHUTDOWN_TIMEOUT"),
    ),
    (
        "push_timeout",
        "--push-timeout",
        Some("JOBRELAY_PUSH_TIMEOUT"),
    ),
    (
        "consumer_window",
        "--consumer-window",
        Some("JOBRELAY_CONSUMER_WINDOW"),
    ),
    ("log_format", "--log-format", Some("JOBRELAY_LOG_FORMAT")),
    ("older_than", "--older-than", None),
];

/// Where a value came from; its `Display` is the culprit named in errors.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    Flag(&'static str),
    Env(&'static str),
    File { key: &'static str, path: PathBuf },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Flag(flag) => f.write_str(flag),
            Origin::Env(var) => f.write_str(var),
            Origin::File { key, path } => write!(f, "{key} in {}", path.display()),
        }
    }
}

/// A value and where it came from, if the source has one.
type Found = Option<(String, Origin)>;

pub(crate) struct Sources<'a> {
    flags: HashMap<&'static str, String>,
    env: &'a dyn Fn(&str) -> Option<String>,
    file: Option<(PathBuf, HashMap<String, String>)>,
}

fn flag_values(f: &Flags) -> HashMap<&'static str, String> {
    let pairs: [(&'static str, &Option<String>); 29] = [
        ("database_url", &f.database_url),
        ("database_url_file", &f.database_url_file),
        ("listen_url", &f.listen_url),
        ("listen_url_file", &f.listen_url_file),
        ("pg_max_connections", &f.pg_max_connections),
        ("prepared_statements", &f.prepared_statements),
        ("redis_url", &f.redis_url),
        ("redis_url_file", &f.redis_url_file),
        ("redis_ca_file", &f.redis_ca_file),
        ("redis_allow_eviction", &f.redis_allow_eviction),
        ("redis_wait_replicas", &f.redis_wait_replicas),
        ("redis_wait_timeout", &f.redis_wait_timeout),
        ("table", &f.table),
        ("namespace", &f.namespace),
        ("layout", &f.layout),
        ("batch_size", &f.batch_size),
        ("batch_max_bytes", &f.batch_max_bytes),
        ("max_job_size", &f.max_job_size),
        ("workers", &f.workers),
        ("claim_slots", &f.claim_slots),
        ("poll_interval", &f.poll_interval),
        ("max_attempts", &f.max_attempts),
        ("dedup_ttl", &f.dedup_ttl),
        ("http_addr", &f.http_addr),
        ("shutdown_timeout", &f.shutdown_timeout),
        ("push_timeout", &f.push_timeout),
        ("consumer_window", &f.consumer_window),
        ("log_format", &f.log_format),
        ("older_than", &f.older_than),
    ];
    pairs
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
        .collect()
}

fn option(key: &str) -> &'static (&'static str, &'static str, Option<&'static str>) {
    OPTIONS
        .iter()
        .find(|(k, _, _)| *k == key)
        .expect("every key is listed in OPTIONS")
}

impl<'a> Sources<'a> {
    pub(crate) fn load(
        flags: &Flags,
        env: &'a dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let env_value = |var: &str| env(var).filter(|v| !v.is_empty());
        let config_path = match (&flags.config, env_value("JOBRELAY_CONFIG")) {
            (Some(p), _) => Some((p.clone(), "--config")),
            (None, Some(p)) => Some((p, "JOBRELAY_CONFIG")),
            (None, None) => None,
        };
        let file = match config_path {
            None => None,
            Some((path, culprit)) => Some(read_toml(Path::new(&path), culprit)?),
        };
        Ok(Sources {
            flags: flag_values(flags),
            env,
            file,
        })
    }

    pub(crate) fn file_path(&self) -> Option<&Path> {
        self.file.as_ref().map(|(p, _)| p.as_path())
    }

    fn env_value(&self, var: &str) -> Option<String> {
        (self.env)(var).filter(|v| !v.is_empty())
    }

    fn at_flag(&self, key: &'static str) -> Option<(String, Origin)> {
        let (_, flag, _) = option(key);
        self.flags.get(key).map(|v| (v.clone(), Origin::Flag(flag)))
    }

    fn at_env(&self, key: &'static str) -> Option<(String, Origin)> {
        let (_, _, var) = option(key);
        var.and_then(|var| self.env_value(var).map(|v| (v, Origin::Env(var))))
    }

    fn at_file(&self, key: &'static str) -> Option<(String, Origin)> {
        let (path, table) = self.file.as_ref()?;
        let (k, _, _) = option(key);
        table.get(*k).map(|v| {
            (
                v.clone(),
                Origin::File {
                    key: k,
                    path: path.clone(),
                },
            )
        })
    }

    /// The value of `key` from the first source that has it.
    pub(crate) fn get(&self, key: &'static str) -> Option<(String, Origin)> {
        self.at_flag(key)
            .or_else(|| self.at_env(key))
            .or_else(|| self.at_file(key))
    }

    /// Where `key` came from, or its flag when it was not given.
    pub(crate) fn origin_of(&self, key: &'static str) -> Origin {
        self.get(key)
            .map(|(_, o)| o)
            .unwrap_or_else(|| Origin::Flag(option(key).1))
    }

    /// Parses `key` with `parse`; an error names the source it came from.
    pub(crate) fn parse<T>(
        &self,
        key: &'static str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some((value, origin)) => parse(&value).map(Some).map_err(|reason| ConfigError {
                culprit: origin.to_string(),
                reason,
            }),
        }
    }

    /// A URL given directly (`key`) or through a file (`key_file`), whichever comes from the
    /// higher-precedence source; both at the same level is an error. Registers its password.
    pub(crate) fn secret_url(
        &self,
        key: &'static str,
        flag: &str,
        var: &str,
    ) -> Result<Option<(String, Origin)>, ConfigError> {
        let file_key: &'static str = option(&format!("{key}_file")).0;
        let levels: [(Found, Found); 3] = [
            (self.at_flag(key), self.at_flag(file_key)),
            (self.at_env(key), self.at_env(file_key)),
            (self.at_file(key), self.at_file(file_key)),
        ];
        for (direct, from_file) in levels {
            match (direct, from_file) {
                (Some((url, _)), Some((_, file_origin))) => {
                    redact::register_url(&url);
                    return Err(ConfigError {
                        culprit: file_origin.to_string(),
                        reason: format!("give the URL directly or through a file, not both ({flag} / {var} is set too)"),
                    });
                }
                (Some((url, origin)), None) => {
                    redact::register_url(&url);
                    return Ok(Some((url, origin)));
                }
                (None, Some((path, origin))) => {
                    let content = std::fs::read_to_string(&path).map_err(|e| ConfigError {
                        culprit: origin.to_string(),
                        reason: format!("cannot read {path}: {e}"),
                    })?;
                    let url = content.trim().to_owned();
                    redact::register_url(&url);
                    if url.is_empty() {
                        return Err(ConfigError {
                            culprit: origin.to_string(),
                            reason: format!("{path} is empty"),
                        });
                    }
                    return Ok(Some((url, origin)));
                }
                (None, None) => {}
            }
        }
        Ok(None)
    }
}

fn read_toml(
    path: &Path,
    culprit: &'static str,
) -> Result<(PathBuf, HashMap<String, String>), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        culprit: culprit.into(),
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        // The parser's full message quotes the offending line, which may hold a password:
        // report the message and the line number only.
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        ConfigError {
            culprit: culprit.into(),
            reason: format!(
                "{} is not valid TOML{}: {}",
                path.display(),
                line.map(|l| format!(" (line {l})")).unwrap_or_default(),
                e.message()
            ),
        }
    })?;
    let mut values = HashMap::new();
    for (key, value) in table {
        if !OPTIONS.iter().any(|(k, _, _)| *k == key) {
            let known: Vec<&str> = OPTIONS.iter().map(|(k, _, _)| *k).collect();
            return Err(ConfigError {
                culprit: format!("{key} in {}", path.display()),
                reason: format!("unknown option; known options are {}", known.join(", ")),
            });
        }
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                return Err(ConfigError {
                    culprit: format!("{key} in {}", path.display()),
                    reason: format!("must be a string or a number, not a {}", other.type_str()),
                })
            }
        };
        values.insert(key, text);
    }
    Ok((path.to_path_buf(), values))
}
