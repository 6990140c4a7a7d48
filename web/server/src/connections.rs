//! The dashboard's open connections, so that a new client is not kept waiting behind
//! connections that send nothing: when every slot is taken (or the descriptors have run
//! out), the connection idle longest is closed for the new one. Idle means no request
//! in flight and no response still streaming: waiting for its first byte, its headers,
//! or its next request on a kept-alive connection. This is how a server survives a
//! slowloris client it cannot tell apart by address (on loopback, every client is
//! 127.0.0.1): the half-open connections are evicted oldest first, while a client that
//! sends a request at once is busy before its turn comes. A client that stops reading
//! its response is treated the same way: its connection counts as idle once hyper has
//! waited [`STALLED`] to write the next piece, and is closed outright after
//! [`SEND_TIMEOUT`] (nginx's `send_timeout`), so that responses nobody reads cannot
//! hold every connection either.
//!
//! May call: hyper, tokio. Called by: lib.rs's accept loop.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// How long a response may wait for its client to read before its connection may be
/// closed for a new client when every slot is taken.
pub const STALLED: Duration = Duration::from_secs(2);

/// How long a response may wait for its client to read before its connection is closed.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// Every open connection by the order it was accepted.
pub(crate) struct Connections {
    open: Mutex<BTreeMap<u64, Arc<Connection>>>,
    next: AtomicU64,
    since: Instant,
}

impl Default for Connections {
    fn default() -> Self {
        Connections {
            open: Mutex::default(),
            next: AtomicU64::new(0),
            since: Instant::now(),
        }
    }
}

/// One open connection: its requests in flight and the signal that closes it.
pub(crate) struct Connection {
    busy: AtomicUsize,
    /// When a response last handed hyper a piece to write that it has not yet asked
    /// past (microseconds after `since`, plus one; 0: none waiting).
    waiting: AtomicU64,
    since: Instant,
    /// Told to close and not yet gone (so that it is not chosen twice).
    evicting: AtomicBool,
    close: tokio::sync::Notify,
}

/// A connection's place in [`Connections`], given up when dropped.
pub(crate) struct Registered {
    connections: Arc<Connections>,
    id: u64,
    /// The connection itself.
    pub(crate) connection: Arc<Connection>,
}

impl Connections {
    /// Adds a newly accepted connection (the newest, so the last one evicted).
    pub(crate) fn register(self: &Arc<Self>) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(Connection {
            busy: AtomicUsize::new(0),
            waiting: AtomicU64::new(0),
            since: self.since,
            evicting: AtomicBool::new(false),
            close: tokio::sync::Notify::new(),
        });
        self.lock().insert(id, connection.clone());
        Registered {
            connections: self.clone(),
            id,
            connection,
        }
    }

    /// Tells the oldest idle connection not told yet to close; false when there is
    /// none (every one is busy or already closing).
    pub(crate) fn evict_oldest_idle(&self) -> bool {
        let open = self.lock();
        let idle = open
            .values()
            .find(|c| c.idle_or_stalled_for(STALLED) && !c.evicting.load(Ordering::Acquire));
        match idle {
            Some(c) => {
                c.evicting.store(true, Ordering::Release);
                // `notify_one` keeps the signal for a task not yet waiting on it.
                c.close.notify_one();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Connection>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.id);
    }
}

impl Connection {
    /// Resolves when the connection is evicted and still idle (or stalled), or when a
    /// response has waited [`SEND_TIMEOUT`] for its client to read; one that a request
    /// made busy meanwhile keeps serving and can be chosen again later.
    pub(crate) async fn evicted(&self) {
        let mut check = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = self.close.notified() => {
                    if self.idle_or_stalled_for(STALLED) {
                        return;
                    }
                    self.evicting.store(false, Ordering::Release);
                }
                _ = check.tick() => {
                    if self.stalled_for().is_some_and(|d| d >= SEND_TIMEOUT) {
                        return;
                    }
                }
            }
        }
    }

    /// Whether no request is in flight, or a response has waited `limit` for its client.
    fn idle_or_stalled_for(&self, limit: Duration) -> bool {
        self.busy.load(Ordering::Acquire) == 0 || self.stalled_for().is_some_and(|d| d >= limit)
    }

    /// How long hyper has held a piece of a response without asking for the next one
    /// (the client does not read).
    fn stalled_for(&self) -> Option<Duration> {
        match self.waiting.load(Ordering::Acquire) {
            0 => None,
            t => Some(self.since.elapsed().saturating_sub(Duration::from_micros(t - 1))),
        }
    }

    fn now(&self) -> u64 {
        self.since.elapsed().as_micros() as u64 + 1
    }

    /// Marks a request in flight until the guard (and the response body holding it) is
    /// dropped.
    pub(crate) fn busy(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }
}

/// A request in flight on a connection.
pub(crate) struct Busy(Arc<Connection>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.waiting.store(0, Ordering::Release);
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its connection busy until it has been sent (a live
/// stream: for as long as it streams).
pub(crate) struct Guarded<B> {
    pub(crate) body: B,
    pub(crate) _busy: Busy,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        // Asked again: the last piece went out. Handing over a new one starts the clock
        // until hyper asks past it.
        self._busy.0.waiting.store(0, Ordering::Release);
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            let connection = &self._busy.0;
            connection.waiting.store(connection.now(), Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_idle_connection_is_evicted_and_busy_ones_are_kept() {
        let all = Arc::new(Connections::default());
        let (a, b, c) = (all.register(), all.register(), all.register());
        let busy_a = a.connection.busy();
        assert!(all.evict_oldest_idle());
        // b (the oldest idle one) has the signal; c has none.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let got = |conn: &Arc<Connection>| {
            rt.block_on(async {
                tokio::time::timeout(std::time::Duration::from_millis(20), conn.evicted())
                    .await
                    .is_ok()
            })
        };
        assert!(got(&b.connection));
        assert!(!got(&c.connection));
        assert!(!got(&a.connection));
        drop(b);
        let busy_c = c.connection.busy();
        assert!(!all.evict_oldest_idle(), "every connection left is busy");
        drop((busy_a, busy_c));
        assert!(all.evict_oldest_idle());
        assert!(got(&a.connection));
    }

    #[test]
    fn a_response_whose_next_piece_is_not_asked_for_counts_as_stalled() {
        use hyper::body::Body;
        let all = Arc::new(Connections::default());
        let conn = all.register();
        let mut guarded = Guarded {
            body: axum::body::Body::from("0123456789"),
            _busy: conn.connection.busy(),
        };
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(conn.connection.stalled_for().is_none(), "nothing handed over yet");
        assert!(matches!(Pin::new(&mut guarded).poll_frame(&mut cx), Poll::Ready(Some(Ok(_)))));
        std::thread::sleep(Duration::from_millis(30));
        let stalled = conn.connection.stalled_for().expect("a piece is waiting");
        assert!(stalled >= Duration::from_millis(30), "{stalled:?}");
        assert!(conn.connection.idle_or_stalled_for(Duration::from_millis(20)));
        assert!(!conn.connection.idle_or_stalled_for(Duration::from_secs(60)));
        // Asked again: the clock stops; the response ended, the connection is idle.
        assert!(matches!(Pin::new(&mut guarded).poll_frame(&mut cx), Poll::Ready(None)));
        assert!(conn.connection.stalled_for().is_none());
        drop(guarded);
        assert!(conn.connection.idle_or_stalled_for(Duration::from_secs(60)));
    }
}
