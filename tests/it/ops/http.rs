//! The HTTP listener cannot exhaust the relay (docs/metrics.md, `src/http.rs`).
//!
//! The daemon runs as a child process on a fresh database, the shared Redis (a random
//! namespace) and `--http-addr` on a free port. Each test opens sockets that a careless or
//! hostile client would leave open, checks that the relay closes them within its timeouts
//! while `/healthz` keeps answering, and counts the relay's descriptors in `/proc/<pid>/fd`.

use std::time::{Duration, Instant};

use crate::common::child::RelayChild;
use crate::common::http::{http_get, parse_response};
use crate::common::*;
use jobrelay::http::{HEADER_READ_TIMEOUT, IDLE_TIMEOUT, MAX_CONNECTIONS};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

// ------------------------------------------------------------------------------------------
// Helpers

/// Reads one response on a kept-alive connection (header, then `content-length` bytes),
/// leaving the connection open; returns its status.
async fn read_one_response(s: &mut TcpStream) -> u16 {
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).await.expect("response header");
        assert_eq!(n, 1, "connection closed inside a response header: {raw:?}");
        raw.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().expect("content-length is a number"))
        .unwrap_or_else(|| panic!("no content-length in {head:?}"));
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).await.expect("response body");
    parse_response(&raw).expect("a response").0
}

/// Resolves when the peer closed `s` (a read returns end of file or an error), discarding
/// whatever it sends before that.
async fn closed_by_peer(mut s: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Open descriptors of process `pid`.
fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/<pid>/fd readable")
        .count()
}

/// The inode of the relay's end of the TCP connection from 127.0.0.1:`client_port` to its
/// listener on `server_port` (from /proc/net/tcp), if the kernel still has it.
fn server_side_inode(server_port: u16, client_port: u16) -> Option<u64> {
    let local = format!("0100007F:{server_port:04X}");
    let remote = format!("0100007F:{client_port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .expect("/proc/net/tcp readable")
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 9 && f[1] == local && f[2] == remote)
        .and_then(|f| f[9].parse().ok())
        .filter(|&inode| inode != 0)
}

/// Whether process `pid` has the socket `inode` open.
fn holds_socket(pid: i32, inode: u64) -> bool {
    let wanted = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/<pid>/fd readable")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .any(|target| target.to_string_lossy() == wanted)
}

/// The relay with its HTTP listener on a free port and its logs in a file.
struct Relay {
    child: RelayChild,
    port: u16,
    dir: tempfile::TempDir,
}

impl Relay {
    /// Starts the daemon on `pool`'s database and `ns`, and waits until `/readyz` says 200.
    async fn start(pool: &PgPool, ns: &Namespace) -> Relay {
        let db = database_url_of(pool).await;
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let dir = tempfile::tempdir().unwrap();
        let child = RelayChild::start_logged(
            &db,
            &ns.url,
            &ns.prefix,
            &["--http-addr", &addr],
            &dir.path().join("stderr"),
            "info",
        );
        let relay = Relay { child, port, dir };
        let ready = || async { http_get(port, "/readyz").await.map(|r| r.0).ok() == Some(200) };
        let ready = eventually_every(Duration::from_secs(30), Duration::from_millis(50), ready);
        assert!(
            ready.await,
            "relay not ready after 30 s; logs:\n{}",
            relay.logs()
        );
        relay
    }

    fn pid(&self) -> i32 {
        self.child.pid()
    }

    fn fds(&self) -> usize {
        fd_count(self.pid())
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// Log events whose message is `message`.
    fn count_events(&self, message: &str) -> usize {
        self.logs()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["message"] == message)
            .count()
    }

    /// `/healthz` must answer 200 now.
    async fn assert_healthy(&self, when: &str) {
        match http_get(self.port, "/healthz").await {
            Ok((200, _)) => {}
            other => panic!("/healthz {when}: {other:?}\nlogs:\n{}", self.logs()),
        }
    }

    /// Waits until the relay holds at least `n` descriptors.
    async fn wait_fds_at_least(&self, n: usize, what: &str) {
        wait_until(what, Duration::from_secs(10), || async { self.fds() >= n }).await;
    }

    /// Waits until the relay's descriptors are back within `slack` of `baseline`.
    async fn wait_fds_back(&self, baseline: usize, slack: usize, deadline: Duration) {
        let what = format!("relay's descriptors back to {baseline} (+{slack})");
        wait_until(&what, deadline, || async { self.fds() <= baseline + slack }).await;
    }

    /// SIGTERM: the daemon (HTTP listener included) stops cleanly.
    async fn terminate(mut self) {
        self.child.signal("TERM");
        let code = self.child.wait(Duration::from_secs(30)).await;
        assert_eq!(
            code,
            Some(0),
            "exit code after SIGTERM; logs:\n{}",
            self.logs()
        );
    }
}

/// Descriptors the relay may open or close on its own meanwhile (a Postgres connection of its
/// pool, a Redis reconnect).
const FD_SLACK: usize = 3;

// ------------------------------------------------------------------------------------------
// 1. Forty idle, half-sent and kept-alive connections are closed by the relay within 35 s,
//    while /healthz keeps answering; the relay's descriptors come back to their baseline.

#[sqlx::test]
async fn idle_half_sent_and_kept_alive_connections_are_closed_while_healthz_answers(pool: PgPool) {
    const SOCKETS: usize = 40;
    const DEADLINE: Duration = Duration::from_secs(35);
    let ns = Namespace::new();
    let relay = Relay::start(&pool, &ns).await;
    let baseline = relay.fds();

    let opened = Instant::now();
    let mut sockets = Vec::new();
    for i in 0..SOCKETS {
        let mut s = TcpStream::connect(("127.0.0.1", relay.port)).await.unwrap();
        let kind = match i % 3 {
            0 => "idle",
            1 => {
                // A header without its final blank line.
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                    .await
                    .unwrap();
                "half-sent"
            }
            _ => {
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    .await
                    .unwrap();
                assert_eq!(read_one_response(&mut s).await, 200);
                "kept-alive"
            }
        };
        sockets.push((kind, s));
    }
    // The relay really holds them (one descriptor each).
    relay
        .wait_fds_at_least(
            baseline + SOCKETS - FD_SLACK,
            "the relay to hold the 40 connections",
        )
        .await;
    let held = relay.fds();

    let waiters: Vec<_> = sockets
        .into_iter()
        .map(|(kind, s)| {
            tokio::spawn(async move {
                closed_by_peer(s).await;
                (kind, opened.elapsed())
            })
        })
        .collect();

    // /healthz keeps answering while they are open, until the relay has closed them all.
    let answers = std::cell::Cell::new(0);
    let left = DEADLINE.saturating_sub(opened.elapsed());
    let closed_all = eventually_every(left, Duration::from_millis(200), || async {
        if waiters.iter().all(|w| w.is_finished()) {
            return true;
        }
        relay
            .assert_healthy("while the bad connections are open")
            .await;
        answers.set(answers.get() + 1);
        false
    })
    .await;
    assert!(
        closed_all,
        "{} of {SOCKETS} connections still open after {DEADLINE:?}; logs:\n{}",
        waiters.iter().filter(|w| !w.is_finished()).count(),
        relay.logs()
    );
    let answers = answers.get();
    let mut closed = Vec::new();
    for w in waiters {
        closed.push(w.await.unwrap());
    }
    for kind in ["idle", "half-sent", "kept-alive"] {
        let times: Vec<Duration> = closed
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|c| c.1)
            .collect();
        let (min, max) = (times.iter().min().unwrap(), times.iter().max().unwrap());
        eprintln!(
            "{} {kind} connections closed after {min:.2?} to {max:.2?}",
            times.len()
        );
        // Closed by the header timeout, not by accident before it.
        assert!(
            *min >= HEADER_READ_TIMEOUT - Duration::from_millis(500),
            "{kind}: {min:?}"
        );
        assert!(*max < DEADLINE, "{kind}: {max:?}");
    }
    assert!(answers >= 10, "/healthz answered only {answers} times");

    relay
        .wait_fds_back(baseline, FD_SLACK, Duration::from_secs(5))
        .await;
    eprintln!(
        "relay descriptors: {baseline} before, {held} holding {SOCKETS} connections, {} after; \
         /healthz answered 200 {answers} times meanwhile",
        relay.fds()
    );
    relay.assert_healthy("after").await;
    relay.terminate().await;
}

// ------------------------------------------------------------------------------------------
// 2. A client that pipelines requests and never reads the responses (hyper then waits on a
//    full socket, where its header timer does not run) is cut off after IDLE_TIMEOUT.

#[sqlx::test]
async fn a_client_that_never_reads_its_responses_is_cut_off(pool: PgPool) {
    let ns = Namespace::new();
    let relay = Relay::start(&pool, &ns).await;
    let baseline = relay.fds();

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket
        .connect(([127, 0, 0, 1], relay.port).into())
        .await
        .unwrap();
    // Pipeline scrapes until the relay stops reading them: its socket buffer is full of
    // responses nobody reads, and then ours of requests.
    let chunk = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(256);
    let mut sent = 0usize;
    loop {
        match tokio::time::timeout(Duration::from_secs(2), s.write_all(&chunk)).await {
            Ok(Ok(())) => sent += chunk.len(),
            Ok(Err(e)) => panic!("the relay closed the connection while it still read: {e}"),
            Err(_) => break,
        }
        assert!(sent < 256 << 20, "the relay never stopped reading");
    }
    let stalled = Instant::now();
    eprintln!(
        "pipelined {} KiB of requests before the relay stalled",
        sent >> 10
    );
    let client_port = s.local_addr().unwrap().port();
    let inode = server_side_inode(relay.port, client_port).expect("the relay's end of it");
    assert!(
        holds_socket(relay.pid(), inode),
        "the relay holds the stalled connection"
    );
    relay.assert_healthy("while a connection is stalled").await;

    // The relay closes it: its descriptor goes within IDLE_TIMEOUT of the relay's last
    // progress on it, which came before our writes stopped.
    wait_until(
        "the relay to close the stalled connection",
        IDLE_TIMEOUT + Duration::from_secs(5),
        || async { !holds_socket(relay.pid(), inode) },
    )
    .await;
    eprintln!(
        "stalled connection closed by the relay {:.2?} after our writes stopped \
         (IDLE_TIMEOUT {IDLE_TIMEOUT:?})",
        stalled.elapsed()
    );
    relay
        .wait_fds_back(baseline, FD_SLACK, Duration::from_secs(5))
        .await;
    // And the client sees it closed.
    tokio::time::timeout(Duration::from_secs(10), closed_by_peer(s))
        .await
        .expect("client sees the connection closed");
    relay.assert_healthy("after").await;
    relay.terminate().await;
}

// ------------------------------------------------------------------------------------------
// 3. Connections over MAX_CONNECTIONS are answered 503 and closed at once (one warning per
//    episode); the relay's descriptors stay bounded; /healthz answers again once the idle ones
//    are timed out.

#[sqlx::test]
async fn connections_over_the_cap_are_refused_at_once(pool: PgPool) {
    const EXTRA: usize = 20;
    let ns = Namespace::new();
    let relay = Relay::start(&pool, &ns).await;
    let baseline = relay.fds();

    let mut idle = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        idle.push(TcpStream::connect(("127.0.0.1", relay.port)).await.unwrap());
    }
    relay
        .wait_fds_at_least(
            baseline + MAX_CONNECTIONS - FD_SLACK,
            "the relay to hold MAX_CONNECTIONS connections",
        )
        .await;

    for i in 0..EXTRA {
        let mut s = TcpStream::connect(("127.0.0.1", relay.port)).await.unwrap();
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut raw))
            .await
            .unwrap_or_else(|_| panic!("connection {i} over the cap not closed within 5 s"))
            .unwrap_or_else(|e| panic!("connection {i} over the cap: {e}"));
        let (status, body) = parse_response(&raw).unwrap();
        assert_eq!((status, body.as_str()), (503, "too many connections\n"));
    }
    let at_cap = relay.fds();
    assert!(
        at_cap <= baseline + MAX_CONNECTIONS + FD_SLACK,
        "{at_cap} descriptors at the cap, baseline {baseline}"
    );
    assert_eq!(
        relay.count_events("http connection limit reached: refusing new connections with 503"),
        1,
        "one warning per episode"
    );

    // The idle ones are timed out; then the relay serves again.
    let waiters: Vec<_> = idle
        .into_iter()
        .map(|s| tokio::spawn(closed_by_peer(s)))
        .collect();
    for w in waiters {
        tokio::time::timeout(HEADER_READ_TIMEOUT + Duration::from_secs(15), w)
            .await
            .expect("idle connection closed")
            .unwrap();
    }
    relay
        .wait_fds_back(baseline, FD_SLACK, Duration::from_secs(5))
        .await;
    relay
        .assert_healthy("once the idle connections are gone")
        .await;
    assert_eq!(
        relay.count_events("http connections below the limit again"),
        1
    );
    eprintln!(
        "relay descriptors: {baseline} before, {at_cap} at the cap, {} after",
        relay.fds()
    );
    relay.terminate().await;
}

// ------------------------------------------------------------------------------------------
// 4. Out of descriptors (RLIMIT_NOFILE lowered with prlimit): accepting fails, is logged once,
//    and does not end the listener; it serves again once descriptors free up.

#[sqlx::test]
async fn the_listener_survives_running_out_of_descriptors(pool: PgPool) {
    const SOCKETS: usize = 16;
    let ns = Namespace::new();
    let relay = Relay::start(&pool, &ns).await;
    let baseline = relay.fds();
    let limit = baseline + 10;
    let ok = std::process::Command::new("prlimit")
        .arg(format!("--pid={}", relay.pid()))
        .arg(format!("--nofile={limit}:{limit}"))
        .status()
        .expect("prlimit runs")
        .success();
    assert!(ok, "prlimit --nofile={limit}");

    // More idle connections than descriptors left: the kernel completes them all; the relay
    // accepts until EMFILE.
    let mut idle = Vec::new();
    for _ in 0..SOCKETS {
        idle.push(TcpStream::connect(("127.0.0.1", relay.port)).await.unwrap());
    }
    wait_until(
        "an accept failure logged",
        Duration::from_secs(10),
        || async { relay.count_events("http accept failing; retrying") > 0 },
    )
    .await;

    // They are timed out in turn; the listener recovers and answers.
    let waiters: Vec<_> = idle
        .into_iter()
        .map(|s| tokio::spawn(closed_by_peer(s)))
        .collect();
    for w in waiters {
        tokio::time::timeout(3 * HEADER_READ_TIMEOUT + Duration::from_secs(10), w)
            .await
            .expect("idle connection closed")
            .unwrap();
    }
    wait_until(
        "/healthz answers again",
        HEADER_READ_TIMEOUT + Duration::from_secs(5),
        || async { matches!(http_get(relay.port, "/healthz").await, Ok((200, _))) },
    )
    .await;
    // One error per episode: each logged failure was followed by a recovery (the last one
    // at the latest when /healthz answered).
    let (failing, recovered) = (
        relay.count_events("http accept failing; retrying"),
        relay.count_events("http accept recovered"),
    );
    eprintln!("{failing} accept-failure episodes, {recovered} recoveries");
    assert!(
        failing >= 1 && failing == recovered,
        "{failing} failing, {recovered} recovered"
    );
    relay.terminate().await;
}
