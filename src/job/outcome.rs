//! What happened to a job that Redis accepted.

/// The outcome of enqueueing one job (docs/layouts/algorithm.md#the-enqueue-algorithm).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Pushed onto `queue:<queue>`.
    Queued,
    /// Added to the `scheduled` sorted set (its `run_at` is in the future by Redis's clock).
    Scheduled,
    /// Held in its parent's children list until its live parent releases it.
    Children,
    /// Held in its predecessor's onComplete list until its predecessor completes.
    OnComplete,
    /// Its dedup marker already existed: nothing was written.
    Duplicate,
    /// Conveyor layout: a child or heir whose parent or predecessor had already finished, sent
    /// out as a job of its own (parent and predecessor cleared), to its queue or, with a
    /// `run_at` in the future, to the scheduled set.
    Late,
}

impl Outcome {
    /// Every outcome, in the order of the script's codes.
    pub const ALL: [Outcome; 6] = [
        Outcome::Queued,
        Outcome::Scheduled,
        Outcome::Children,
        Outcome::OnComplete,
        Outcome::Duplicate,
        Outcome::Late,
    ];

    /// The label used in metrics and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Queued => "queued",
            Outcome::Scheduled => "scheduled",
            Outcome::Children => "children",
            Outcome::OnComplete => "on_complete",
            Outcome::Duplicate => "duplicate",
            Outcome::Late => "late",
        }
    }

    pub(crate) fn from_code(code: i64) -> Option<Outcome> {
        usize::try_from(code)
            .ok()
            .and_then(|c| c.checked_sub(1))
            .and_then(|i| Outcome::ALL.get(i).copied())
    }

    /// This outcome's position in [`Outcome::ALL`] (and in report arrays).
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
