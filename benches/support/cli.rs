//! Whether `cargo bench` started the program.
//!
//! `cargo bench --bench <name>` runs a benchmark with the argument `--bench`. `cargo test
//! --benches` (and `--all-targets`) runs the same program without it, as if it were a test: a
//! full-size benchmark would then take minutes of the machine and its shared Postgres and Redis.
//! Started that way, a benchmark says so and does nothing; `tests/it/bench/` runs each with tiny
//! sizes instead.

/// True when the arguments include `--bench`; else a line on stderr saying how to run
/// `program`.
pub fn started_by_cargo_bench(program: &str) -> bool {
    if std::env::args().skip(1).any(|a| a == "--bench") {
        return true;
    }
    note!(
        "{program}: not started by `cargo bench` (no --bench argument): nothing run; `cargo bench \
         --bench {program}` runs it"
    );
    false
}
