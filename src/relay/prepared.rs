//! `--prepared-statements`: whether claims run as named statements (planned once per
//! connection) or unnamed (planned at every claim), and what a relay does when a connection's
//! named statements turn out not to stay with it (docs/cli.md#postgres-connections).
//!
//! A named statement stays on the server connection it was prepared on. That is the client's
//! own connection when it talks to Postgres directly or through a session pooler; behind
//! PgBouncer in transaction mode before 1.21 (or without `max_prepared_statements`) it is a
//! server connection the next transaction may not get, and which other clients get. So by
//! default (`auto`) claims are unnamed until the relay has proved that its connections are
//! sessions of their own: the notification listener proves that of its connection before it
//! listens (src/relay/wakeup/listen.rs), and where it connects as the pool does (no
//! `--listen-url`), its proof is the pool's. `true` names claims from the first; `false`
//! never.
//!
//! Named claims that meet a connection which does not keep them find their statement
//! missing, or one of the same name there already, or run another client's statement of the
//! same name (another relay's claim, of another table). Each claim carries its relay's own tag
//! ([`super::Queries::claim_tag`]) in every row it returns, so that rows of another's
//! statement are known before anything is pushed. Any of these, and a cached plan whose result
//! type a migration changed, end the named claims of the whole relay: the batch rolls back
//! untouched and is claimed again at once, unnamed, and the relay says so once.

use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::Error;
use crate::telemetry::events::{ClaimsNamed, ClaimsUnnamed, Event as _};

/// `--prepared-statements`: when claims run as named statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreparedStatements {
    /// Once the relay proved that its pool's connections are sessions of their own (the
    /// notification listener's proof, where it connects as the pool does); unnamed until then,
    /// and wherever nothing proves it (`--listen-url`, too few connections for a listener, the
    /// library's [`super::Batcher`] alone).
    #[default]
    Auto,
    /// From the first claim (`true`): the operator vouches for the connections.
    Always,
    /// Never (`false`): every claim is planned anew, which any pooler passes on.
    Never,
}

impl FromStr for PreparedStatements {
    type Err = String;

    /// `auto`, or a boolean: `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(PreparedStatements::Auto),
            "true" | "1" | "yes" | "on" => Ok(PreparedStatements::Always),
            "false" | "0" | "no" | "off" => Ok(PreparedStatements::Never),
            _ => Err(format!("{s:?} is not auto, true or false")),
        }
    }
}

/// Unnamed, waiting for the proof that `auto` needs.
const WAITING: u8 = 0;
/// Named, `auto` and proved.
const PROVED: u8 = 1;
/// Named, asked for (`true`): a listener's proof either way does not change it.
const ASKED: u8 = 2;
/// Unnamed for good: asked so, or a named claim failed.
const UNNAMED: u8 = 3;

/// Whether a relay's claims run as named statements now: shared by the relay's workers and the
/// listener that proves their connections sessions.
#[derive(Debug)]
pub struct PreparedClaims {
    state: AtomicU8,
}

impl PreparedClaims {
    /// Claims as `asked` (`--prepared-statements`).
    pub fn new(asked: PreparedStatements) -> Self {
        let state = match asked {
            PreparedStatements::Auto => WAITING,
            PreparedStatements::Always => ASKED,
            PreparedStatements::Never => UNNAMED,
        };
        PreparedClaims {
            state: AtomicU8::new(state),
        }
    }

    /// Whether the next claim is a named statement.
    pub fn on(&self) -> bool {
        matches!(self.state.load(Ordering::Relaxed), PROVED | ASKED)
    }

    /// The pool's connections proved sessions of their own: `auto` names claims from now on,
    /// saying so once.
    pub(crate) fn sessions_proved(&self) {
        if self
            .state
            .compare_exchange(WAITING, PROVED, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            ClaimsNamed.emit();
        }
    }

    /// The pool's connections proved not to be sessions of their own (a transaction pooler;
    /// or no longer, after a proof that they were): `auto` claims unnamed from now on, saying
    /// so once if they were named. Named claims asked for stay (PgBouncer 1.21+ keeps them in
    /// transaction mode).
    pub(crate) fn no_sessions(&self) {
        let was = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                matches!(now, WAITING | PROVED).then_some(UNNAMED)
            });
        if was == Ok(PROVED) {
            ClaimsUnnamed {
                error: "the relay's connection is no longer a session of its own",
            }
            .emit();
        }
    }

    /// Claims unnamed from now on, saying why once if they were named (whichever worker finds
    /// out first).
    pub(crate) fn give_up(&self, why: &str) {
        if matches!(self.state.swap(UNNAMED, Ordering::Relaxed), PROVED | ASKED) {
            ClaimsUnnamed { error: why }.emit();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_names_claims_once_sessions_are_proved_and_never_after_a_failure() {
        let p = PreparedClaims::new(PreparedStatements::Auto);
        assert!(!p.on(), "unnamed until proved");
        p.sessions_proved();
        assert!(p.on());
        p.give_up("a claim failed");
        assert!(!p.on());
        p.sessions_proved();
        assert!(!p.on(), "a failure is for good");
    }

    #[test]
    fn true_and_false_hold_whatever_the_listener_proves() {
        let never = PreparedClaims::new(PreparedStatements::Never);
        never.sessions_proved();
        assert!(!never.on());
        let always = PreparedClaims::new(PreparedStatements::Always);
        assert!(always.on());
        always.no_sessions();
        assert!(
            always.on(),
            "asked for: PgBouncer 1.21+ keeps them without sessions"
        );
        always.give_up("a claim failed");
        assert!(!always.on());
    }

    #[test]
    fn auto_stays_unnamed_without_sessions_and_ends_when_they_are_lost() {
        let pooled = PreparedClaims::new(PreparedStatements::Auto);
        pooled.no_sessions();
        pooled.sessions_proved();
        assert!(!pooled.on(), "a pooler found once is not forgotten");
        let lost = PreparedClaims::new(PreparedStatements::Auto);
        lost.sessions_proved();
        lost.no_sessions();
        assert!(!lost.on());
    }

    #[test]
    fn the_setting_reads_auto_or_a_boolean() {
        for (s, want) in [
            ("auto", PreparedStatements::Auto),
            (" AUTO ", PreparedStatements::Auto),
            ("true", PreparedStatements::Always),
            ("on", PreparedStatements::Always),
            ("0", PreparedStatements::Never),
            ("no", PreparedStatements::Never),
        ] {
            assert_eq!(s.parse::<PreparedStatements>(), Ok(want), "{s:?}");
        }
        assert_eq!(
            "sometimes".parse::<PreparedStatements>(),
            Err("\"sometimes\" is not auto, true or false".to_owned())
        );
    }
}
