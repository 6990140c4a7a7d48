//! The dashboard's open connections, so that a new client is not kept waiting behind
//! connections that send nothing: when every slot is taken (or the descriptors have run
//! out), the connection idle longest is closed for the new one. Idle means no request
//! in flight and no response still streaming: waiting for its first byte, its headers,
//! or its next request on a kept-alive connection. This is how a server survives a
//! slowloris client it cannot tell apart by address (on loopback, every client is
//! 127.0.0.1): the half-open connections are evicted oldest first, while a client that
//! sends a request at once is busy before its turn comes.
//!
//! May call: hyper, tokio. Called by: lib.rs's accept loop.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// Every open connection by the order it was accepted.
#[derive(Default)]
pub(crate) struct Connections {
    open: Mutex<BTreeMap<u64, Arc<Connection>>>,
    next: std::sync::atomic::AtomicU64,
}

/// One open connection: its requests in flight and the signal that closes it.
#[derive(Default)]
pub(crate) struct Connection {
    busy: AtomicUsize,
    /// Told to close and not yet gone (so that it is not chosen twice).
    evicting: std::sync::atomic::AtomicBool,
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
        let connection = Arc::new(Connection::default());
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
            .find(|c| c.busy.load(Ordering::Acquire) == 0 && !c.evicting.load(Ordering::Acquire));
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
    /// Resolves when the connection is evicted and still idle; one that a request
    /// made busy meanwhile keeps serving and can be chosen again later.
    pub(crate) async fn evicted(&self) {
        loop {
            self.close.notified().await;
            if self.busy.load(Ordering::Acquire) == 0 {
                return;
            }
            self.evicting.store(false, Ordering::Release);
        }
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
        Pin::new(&mut self.body).poll_frame(cx)
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
}
