//! What the relays' logs say about a run: the claim statement's duration of every batch,
//! the rows claimed, claim-slot misses, duplicates, the first and last commit, warnings.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::relays::Fleet;
use super::BoxError;

/// What the relays' logs say about one run.
#[derive(Default)]
pub struct Logs {
    /// `claim_ms` of every "batch committed" line.
    pub claim_ms: Vec<f64>,
    /// Batches whose line had no `claim_ms` (a relay binary older than the field).
    without_claim_ms: usize,
    pub claimed: u64,
    /// Claims that found every claim slot taken ("no claim slot free"): a transaction each.
    pub slot_misses: u64,
    pub duplicates: u64,
    pub first_commit: Option<DateTime<Utc>>,
    pub last_commit: Option<DateTime<Utc>>,
    pub warnings: usize,
    pub first_warning: Option<String>,
}

impl Logs {
    /// Reads the logs of every relay of `fleet`.
    pub fn read(fleet: &Fleet) -> Result<Logs, BoxError> {
        let mut logs = Logs::default();
        for r in &fleet.relays {
            let text = std::fs::read_to_string(&r.log)?;
            for line in text.lines() {
                let Ok(v) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                let level = v["level"].as_str().unwrap_or("");
                if level == "WARN" || level == "ERROR" {
                    logs.warnings += 1;
                    logs.first_warning.get_or_insert_with(|| line.to_owned());
                }
                if v["message"] == "no claim slot free" {
                    logs.slot_misses += 1;
                }
                if v["message"] != "batch committed" {
                    continue;
                }
                match v["claim_ms"].as_f64() {
                    Some(ms) => logs.claim_ms.push(ms),
                    None => logs.without_claim_ms += 1,
                }
                logs.claimed += v["claimed"].as_u64().unwrap_or(0);
                logs.duplicates += v["duplicates"].as_u64().unwrap_or(0);
                if let Some(at) = v["timestamp"]
                    .as_str()
                    .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                {
                    let at = at.with_timezone(&Utc);
                    logs.first_commit = Some(logs.first_commit.map_or(at, |f| f.min(at)));
                    logs.last_commit = Some(logs.last_commit.map_or(at, |l| l.max(at)));
                }
            }
        }
        if logs.without_claim_ms > 0 {
            return Err(format!(
                "{} \"batch committed\" lines without claim_ms: the relay binary predates \
                 the field; run `cargo build --release` (or point JOBRELAY_BIN at a current \
                 binary)",
                logs.without_claim_ms
            )
            .into());
        }
        Ok(logs)
    }
}
