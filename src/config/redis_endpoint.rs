//! The Redis URL's check, and `--redis-ca-file`.

use std::fmt;
use std::path::PathBuf;

use super::error::ConfigError;
use super::source::Origin;
use crate::broker::url as redis_url;
use crate::telemetry::redact;

/// A PEM file of trusted CA certificates (`--redis-ca-file`), read and checked once at start.
/// `Debug` shows the path only.
#[derive(Clone, PartialEq, Eq)]
pub struct CaFile {
    path: PathBuf,
    pem: Vec<u8>,
}

impl CaFile {
    /// Where the certificates were read from.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The PEM text as read.
    pub fn pem(&self) -> &[u8] {
        &self.pem
    }
}

impl fmt::Debug for CaFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CaFile").field(&self.path).finish()
    }
}

pub(super) fn check_redis_url(url: &str, origin: &Origin) -> Result<(), ConfigError> {
    redis_url::endpoint(url, None)
        .map(|_| ())
        .map_err(|e| ConfigError {
            culprit: origin.to_string(),
            reason: format!(
                "{} is not a Redis URL (redis://[user:password@]host:6379[/db], rediss://, \
                 redis+sentinel://host:26379[,host...]/<master name>[/db], \
                 redis+cluster://host:port[,host:port...]): {}",
                redact::redact_url(url),
                redact::scrub(&e)
            ),
        })
}

/// Reads and checks `--redis-ca-file`: PEM certificates, for a `rediss://` URL.
pub(super) fn read_ca_file(
    path: &str,
    origin: &Origin,
    redis_url: &str,
) -> Result<CaFile, ConfigError> {
    let bad = |reason: String| ConfigError {
        culprit: origin.to_string(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| bad(format!("cannot read {path}: {e}")))?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(bad(format!(
            "{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )));
    }
    if !redis_url::is_tls(redis_url) {
        return Err(bad(format!(
            "a CA file only applies to TLS, but the Redis URL {} is not rediss:// (or \
             rediss+sentinel://, rediss+cluster://)",
            redact::redact_url(redis_url)
        )));
    }
    redis_url::endpoint(redis_url, Some(&pem))
        .map_err(|e| bad(format!("{path}: {}", redact::scrub(&e))))?;
    Ok(CaFile {
        path: PathBuf::from(path),
        pem,
    })
}
