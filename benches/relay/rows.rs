//! The rows the stages write and the queues their jobs land in: 200-byte payloads over 8
//! queues, COPYed in one transaction.

use std::time::Duration;

use jobrelay::broker::layout::Payload;
use jobrelay::{Enqueuer, LayoutKind};

use super::support::sandbox::Sandbox;
use super::BoxError;

pub const QUEUES: usize = 8;
pub const PAYLOAD_BYTES: usize = 200;

/// Row `i`'s payload: `PAYLOAD_BYTES` bytes, a JSON array in a layout whose payloads are
/// arguments (`[{"thing_id":i,"pad":"xx..."}]`), else `{"thing_id":i,"pad":"xx...` cut off.
fn payload(layout: LayoutKind, i: usize) -> Vec<u8> {
    let (head, tail) = if takes_args(layout) {
        (format!("[{{\"thing_id\":{i},\"pad\":\""), "\"}]")
    } else {
        (format!("{{\"thing_id\":{i},\"pad\":\""), "")
    };
    let pad = PAYLOAD_BYTES.saturating_sub(head.len() + tail.len());
    let mut p = head.into_bytes();
    p.resize(p.len() + pad, b'x');
    p.extend_from_slice(tail.as_bytes());
    p
}

/// Whether the layout's payloads are a JSON array of the job's arguments, as the layout says.
fn takes_args(layout: LayoutKind) -> bool {
    layout.layout().payload() == Payload::JsonArgs
}

/// The SQL literal of a one-row insert's payload: `[]` (empty `args`) where the layout takes
/// args, else `otherwise`.
pub fn tiny_payload(layout: LayoutKind, otherwise: &'static str) -> &'static str {
    if takes_args(layout) {
        "'\\x5b5d'"
    } else {
        otherwise
    }
}

/// COPYs `n` rows in one transaction: 200-byte payloads, round-robin over 8 queues named
/// `<prefix>0..7`, each with the job options `options` (JSON object text; `{}`: the column
/// left to its default) and, with `ordering_keys` > 0, the ordering key `k<i % ordering_keys>`
/// (the transaction turns the ordering trigger's key locks off, as a bulk load that is the only
/// writer of its keys may: one lock per key would not fit Postgres's lock table). No ANALYZE:
/// the statistics stay those of the empty table.
pub async fn copy_rows(
    sb: &Sandbox,
    layout: LayoutKind,
    n: usize,
    prefix: &str,
    options: &str,
    ordering_keys: usize,
) -> Result<(), BoxError> {
    let mut conn = sb.pool.acquire().await?;
    // COPY's text format: a backslash in the JSON is written doubled.
    let options_field = (options != "{}").then(|| format!("\t{}", options.replace('\\', "\\\\")));
    let mut columns = String::from("queue, job_type, payload");
    if options_field.is_some() {
        columns.push_str(", options");
    }
    if ordering_keys > 0 {
        columns.push_str(", ordering_key");
        sqlx::raw_sql("BEGIN; SET LOCAL jobrelay.ordering_lock = off")
            .execute(&mut *conn)
            .await?;
    }
    let mut copy = conn
        .copy_in_raw(&format!("COPY pending_jobs ({columns}) FROM STDIN"))
        .await?;
    let mut buf = String::with_capacity(1 << 20);
    for i in 0..n {
        let mut hex = String::with_capacity(PAYLOAD_BYTES * 2);
        for b in payload(layout, i) {
            hex.push_str(&format!("{b:02x}"));
        }
        buf.push_str(&format!(
            "{prefix}{}\tProcessThing\t\\\\x{hex}{}",
            i % QUEUES,
            options_field.as_deref().unwrap_or("")
        ));
        if ordering_keys > 0 {
            buf.push_str(&format!("\tk{}", i % ordering_keys));
        }
        buf.push('\n');
        if buf.len() > (1 << 20) {
            copy.send(buf.as_bytes()).await?;
            buf.clear();
        }
    }
    copy.send(buf.as_bytes()).await?;
    copy.finish().await?;
    if ordering_keys > 0 {
        sqlx::raw_sql("COMMIT").execute(&mut *conn).await?;
    }
    Ok(())
}

/// The jobs in the queues `<prefix>0..7`.
pub async fn jobs_in_queues(
    sb: &Sandbox,
    layout: LayoutKind,
    prefix: &str,
) -> Result<usize, BoxError> {
    let mut con = sb.redis_con().await?;
    let mut total = 0usize;
    for q in 0..QUEUES {
        let n: usize = redis::cmd("LLEN")
            .arg(queue_key(sb, layout, &format!("{prefix}{q}")))
            .query_async(&mut con)
            .await?;
        total += n;
    }
    Ok(total)
}

/// The list of `queue` in the bench's layout and namespace.
pub fn queue_key(sb: &Sandbox, layout: LayoutKind, queue: &str) -> String {
    Enqueuer::new(sb.namespace().to_owned(), Duration::ZERO)
        .with_layout(layout)
        .queue_key(queue)
}
