//! Ordering keys held by a dead-lettered row (docs/runbook.md#jobrelayorderingkeyheld): the
//! probe's gauges at every sample, and the episode, once: a WARN when a key becomes held, an
//! INFO when none is any more.

use super::Event;
use crate::admin::held_keys::HeldKeys;
use crate::telemetry::metrics;

/// One sample of the held keys (`jobrelay_held_keys`, `jobrelay_held_key_oldest_age_seconds`).
/// No log line: one every 5 s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeldKeysSampled {
    /// Keys held.
    pub keys: i64,
    /// How long the oldest hold has lasted, in seconds (0 when none).
    pub oldest_age_seconds: f64,
}

impl Event for HeldKeysSampled {
    fn emit(self) {
        metrics::held_keys(self.keys, self.oldest_age_seconds);
    }
}

/// Ordering keys are held: their rows wait behind a dead-lettered row of theirs (WARN, once per
/// episode), naming the first key, its dead head and the fix.
#[derive(Debug)]
pub struct OrderingKeyHeld<'a> {
    /// The sample that found them (at least one key named).
    pub held: &'a HeldKeys,
}

impl Event for OrderingKeyHeld<'_> {
    fn emit(self) {
        let Some(line) = self.held.warning() else {
            return;
        };
        let k = &self.held.first[0];
        tracing::warn!(
            failure = "ordering_key_held",
            keys = self.held.keys,
            rows = self.held.rows,
            ordering_key = %k.ordering_key,
            dead_id = k.dead_id,
            dead_uuid = %k.dead_uuid,
            waiting = k.waiting,
            age_seconds = k.age_seconds.round(),
            "{line}"
        );
    }
}

/// No ordering key is held any more: the dead heads [`OrderingKeyHeld`] told of were requeued or
/// purged (INFO).
#[derive(Debug)]
pub struct OrderingKeysReleased;

impl Event for OrderingKeysReleased {
    fn emit(self) {
        tracing::info!("no ordering key is held by a dead-lettered row any more");
    }
}
