//! `/proc/<pid>/stat` for the benchmark examples. Included by each with `#[path]`.

/// Clock ticks per second of `/proc` times (USER_HZ, 100 on Linux).
pub const TICKS: f64 = 100.0;

/// The name and utime + stime (seconds) of one `/proc/<pid>/stat` line.
pub fn stat_cpu(stat: &str) -> Option<(&str, f64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = &stat[open + 1..close];
    // After ')': state is field 3 of the line; utime and stime are fields 14 and 15.
    let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((name, (utime + stime) / TICKS))
}
