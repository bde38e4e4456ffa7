//! A TCP proxy for fault tests: forwards 127.0.0.1:<port> to an upstream address, and on
//! command stalls the traffic (accepts, never answers), rejects connections, cuts the live
//! ones, or blackholes them (frozen for good, never closed). It runs on a thread and runtime of its own, so a test that blocks its own runtime (a
//! synchronous restart, a long verification) never stalls the proxy by accident.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Bytes flow both ways.
    Forward,
    /// Connections are accepted, but no byte moves in either direction until the mode changes:
    /// a peer that hangs. Bytes held back are delivered, in order, when forwarding resumes.
    Stall,
    /// New connections are accepted and closed at once, live ones are cut: a peer that is down.
    Reject,
    /// Every live connection freezes for good: no byte moves either way and none is closed,
    /// not even when upstream closes its side, until the proxy is dropped (or cut). New
    /// connections are accepted and frozen too. A primary gone silent behind a network that
    /// drops its packets (no RST). Leaving the mode serves new connections; the frozen stay
    /// frozen.
    Blackhole,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    mode: Mode,
    /// Bumped by [`Proxy::cut`]: connections opened before the bump are closed.
    cuts: u64,
    /// Bumped by [`Proxy::blackhole`]: connections opened before the bump are frozen.
    blackholes: u64,
    /// Where new connections go ([`Proxy::redirect`]); live ones stay where they went.
    upstream: SocketAddr,
    closed: bool,
}

/// A running proxy. Dropping it closes the listener and every connection.
pub struct Proxy {
    pub port: u16,
    state: watch::Sender<State>,
    accepted: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts forwarding a free port on 127.0.0.1 to `upstream`.
    pub fn start(upstream: SocketAddr) -> Proxy {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy binds");
        std_listener.set_nonblocking(true).unwrap();
        let port = std_listener.local_addr().unwrap().port();
        let (state, rx) = watch::channel(State {
            mode: Mode::Forward,
            cuts: 0,
            blackholes: 0,
            upstream,
            closed: false,
        });
        let accepted = Arc::new(AtomicU64::new(0));
        let counter = accepted.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(accept_loop(std_listener, rx, counter));
        });
        Proxy {
            port,
            state,
            accepted,
            thread: Some(thread),
        }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sets the mode; [`Mode::Reject`] also cuts every live connection.
    pub fn set_mode(&self, mode: Mode) {
        self.state.send_modify(|s| s.mode = mode);
    }

    /// Stops every byte (see [`Mode::Stall`]).
    pub fn stall(&self) {
        self.set_mode(Mode::Stall);
    }

    /// Freezes every connection for good, and every new one until the mode changes (see
    /// [`Mode::Blackhole`]).
    #[allow(dead_code)] // not every test binary that includes the helper uses it
    pub fn blackhole(&self) {
        self.state.send_modify(|s| {
            s.mode = Mode::Blackhole;
            s.blackholes += 1;
        });
    }

    /// Forwards again; held-back bytes flow on (frozen connections stay frozen).
    pub fn heal(&self) {
        self.set_mode(Mode::Forward);
    }

    /// Closes every live connection (the peer sees a reset or EOF); new ones are served.
    #[allow(dead_code)] // the helper's API; no test needs it today
    pub fn cut(&self) {
        self.state.send_modify(|s| s.cuts += 1);
    }

    /// Sends new connections to `upstream` from now on (a virtual IP or a DNS name that moves);
    /// live connections stay with the old one.
    pub fn redirect(&self, upstream: SocketAddr) {
        self.state.send_modify(|s| s.upstream = upstream);
    }

    /// Connections accepted so far (in any mode).
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.send_modify(|s| s.closed = true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    mut state: watch::Receiver<State>,
    accepted: Arc<AtomicU64>,
) {
    let listener = TcpListener::from_std(listener).expect("tokio listener");
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            changed = state.changed() => {
                if changed.is_err() || state.borrow().closed {
                    break;
                }
            }
            conn = listener.accept() => {
                let Ok((client, _)) = conn else { continue };
                accepted.fetch_add(1, Ordering::SeqCst);
                let now = *state.borrow();
                if now.mode == Mode::Reject {
                    drop(client);
                    continue;
                }
                let birth = Birth {
                    cuts: now.cuts,
                    blackholes: now.blackholes,
                    frozen: now.mode == Mode::Blackhole,
                };
                conns.spawn(serve(client, now.upstream, state.clone(), birth));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// What a connection was born into.
#[derive(Debug, Clone, Copy)]
struct Birth {
    cuts: u64,
    blackholes: u64,
    /// Accepted while blackholed: frozen from the start.
    frozen: bool,
}

/// Serves one connection until either side closes, or it is cut or rejected. A frozen
/// connection is held open, silent, until it must die.
async fn serve(
    mut client: TcpStream,
    upstream: SocketAddr,
    state: watch::Receiver<State>,
    born: Birth,
) {
    let mut gate = state.clone();
    // A stalled proxy accepts but does not even reach upstream until forwarding resumes.
    if !wait_forward(&mut gate, born).await {
        if frozen(&state.borrow(), born) {
            doomed(state, born).await;
        }
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    {
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        tokio::select! {
            _ = pump(cr, sw, state.clone(), born) => {}
            _ = pump(sr, cw, state.clone(), born) => {}
            _ = doomed(state.clone(), born) => {}
        }
    }
    if frozen(&state.borrow(), born) {
        // Neither side learns anything: both sockets stay open until the connection must die.
        doomed(state, born).await;
    }
}

/// Copies bytes one way; each chunk read waits for [`Mode::Forward`] before it is written.
async fn pump(
    mut from: tokio::net::tcp::ReadHalf<'_>,
    mut to: tokio::net::tcp::WriteHalf<'_>,
    mut state: watch::Receiver<State>,
    born: Birth,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if !wait_forward(&mut state, born).await {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Whether this connection must die: cut, rejected or proxy closed.
fn dead(s: &State, born: Birth) -> bool {
    s.closed || s.cuts != born.cuts || s.mode == Mode::Reject
}

/// Whether this connection is blackholed for good.
fn frozen(s: &State, born: Birth) -> bool {
    born.frozen || s.blackholes != born.blackholes
}

/// Waits until the mode is [`Mode::Forward`] (and this connection is not frozen); false if
/// the connection must die, or is frozen, instead.
async fn wait_forward(state: &mut watch::Receiver<State>, born: Birth) -> bool {
    loop {
        let s = *state.borrow_and_update();
        if dead(&s, born) || frozen(&s, born) {
            return false;
        }
        if s.mode == Mode::Forward {
            return true;
        }
        if state.changed().await.is_err() {
            return false;
        }
    }
}

/// Resolves when the connection must die.
async fn doomed(mut state: watch::Receiver<State>, born: Birth) {
    loop {
        if dead(&state.borrow_and_update(), born) {
            return;
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}
