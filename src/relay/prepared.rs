//! `--prepared-statements`, and what a relay does when a connection's named statements turn
//! out not to stay with it (docs/cli.md#postgres-connections).
//!
//! Behind PgBouncer in transaction mode before 1.21 (or without `max_prepared_statements`), a
//! named statement stays on the server connection it was prepared on, which the next
//! transaction may not get, and which other clients get: a claim then finds its statement
//! missing, or one of the same name there already, or runs another client's statement of the
//! same name (another relay's claim, of another table). Each claim carries its relay's own
//! tag ([`super::Queries::claim_tag`]) in every row it returns, so that rows of another's
//! statement are known before anything is pushed. Any of these, and a cached plan whose
//! result type a migration changed, end the named claims of the whole relay: the batch rolls
//! back untouched and is claimed again at once, unnamed, and the relay says so once.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::Error;

/// Whether a relay's claims run as named statements: as asked, until a claim shows that
/// they cannot; shared by the relay's workers.
#[derive(Debug)]
pub struct PreparedClaims {
    on: AtomicBool,
}

impl PreparedClaims {
    /// Named claims when `asked` (`--prepared-statements`).
    pub fn new(asked: bool) -> Self {
        PreparedClaims {
            on: AtomicBool::new(asked),
        }
    }

    /// Whether the next claim is a named statement.
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Claims unnamed from now on, saying why once (whichever worker finds out first).
    pub(crate) fn give_up(&self, why: &str) {
        if self.on.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                error = why,
                "claims unnamed: --prepared-statements, but a named claim failed (PgBouncer in \
                 transaction mode before 1.21 or without max_prepared_statements?); the batch \
                 is rolled back and every claim from now on is unnamed \
                 (docs/cli.md#postgres-connections)"
            );
        }
    }
}

/// Whether `e`, from a named claim, says that the connection does not keep its named
/// statements or their plans: a statement missing (`26000`), one of the same name there
/// already (`42P05`), another's statement taking other parameters (`08P01`) or returning other
/// columns, or a cached plan whose result type changed.
pub(crate) fn not_kept(e: &Error) -> bool {
    let Error::Database(e) = e else {
        return false;
    };
    match e {
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("26000" | "42P05" | "08P01"))
                || db
                    .message()
                    .contains("cached plan must not change result type")
        }
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::ColumnNotFound(_) => true,
        _ => false,
    }
}
