//! The in-memory model of the backplane: JetStream KV semantics behind one lock, so every
//! operation is linearizable, with one revision counter for the bucket and watches that deliver
//! changes in revision order. A bucket keeps one revision per key, so a NATS watch that has not
//! yet read a change when the key changes again never sees it; the model always skips such a
//! change (the harshest case, where NATS skips it only when its consumer is behind). Each gateway talks through its own [`ModelClient`]; a
//! partitioned client's operations fail with `Unavailable` (the driver delays that answer by its
//! request timeout, as a real client cut off from NATS would see) and its watches stop, then
//! resume after healing from where they stopped.
//!
//! Deletions of keys under a prefix expire as JetStream's delete markers do when they carry a
//! TTL: the driver sets the time ([`Model::advance`]), the TTL and the prefix
//! ([`Model::expire_deletions_after`]); an expired deletion
//! is gone from the bucket (the key is as if never written) and from every watch that had not
//! delivered it yet (a watch cut off past the TTL never sees it).

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll, Waker},
};

use bytes::Bytes;
use futures_core::Stream;
use tinybroker::cluster::backplane::{Backplane, BoxFuture, Entry, KvError, Revision, Watch};

#[derive(Default)]
struct State {
    revision: Revision,
    /// Latest entry per key (deletions kept as entries without a value).
    keys: BTreeMap<String, Entry>,
    watchers: Vec<Watcher>,
    partitioned: BTreeSet<u64>,
    /// The driver's time (ns) and how long a deletion stays (`None`: forever).
    now: u64,
    deletion_ttl: Option<u64>,
    /// Only deletions of keys under this prefix expire.
    expiring: String,
    /// Deletions that may still expire: when, and the key with its deletion's revision.
    deletions: VecDeque<(u64, String, Revision)>,
    /// How many deletions expired before some watch delivered them.
    skipped: u64,
}

struct Watcher {
    client: u64,
    prefix: String,
    queue: VecDeque<Entry>,
    waker: Option<Waker>,
    dropped: bool,
}

/// The shared store.
#[derive(Clone, Default)]
pub struct Model(Arc<Mutex<State>>);

impl Model {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A client for gateway (or observer) `client`.
    pub fn client(&self, client: u64) -> ModelClient {
        ModelClient {
            model: self.clone(),
            client,
        }
    }

    /// Cuts `client` off: its operations fail, its watches stop.
    pub fn partition(&self, client: u64) {
        self.lock().partitioned.insert(client);
    }

    /// Deletions of keys under `prefix` expire `ttl` (ns) after they were written, from now on.
    pub fn expire_deletions_after(&self, ttl: u64, prefix: &str) {
        let mut s = self.lock();
        s.deletion_ttl = Some(ttl);
        s.expiring = prefix.to_string();
    }

    /// How many watch deliveries expired deletions have skipped so far.
    pub fn skipped_deletions(&self) -> u64 {
        self.lock().skipped
    }

    /// The time is `now` (ns): deletions older than the TTL expire.
    pub fn advance(&self, now: u64) {
        let mut s = self.lock();
        s.now = s.now.max(now);
        let Some(ttl) = s.deletion_ttl else {
            return;
        };
        while let Some((at, _, _)) = s.deletions.front()
            && at.saturating_add(ttl) <= s.now
        {
            let Some((_, key, revision)) = s.deletions.pop_front() else {
                break;
            };
            if s.keys.get(&key).is_some_and(|e| e.revision == revision) {
                s.keys.remove(&key);
            }
            let mut skipped = 0;
            for w in &mut s.watchers {
                let before = w.queue.len();
                w.queue
                    .retain(|e| !(e.key == key && e.revision == revision));
                skipped += (before - w.queue.len()) as u64;
            }
            s.skipped += skipped;
        }
    }

    /// Reconnects `client`: its watches deliver what they missed, in order.
    pub fn heal(&self, client: u64) {
        let mut s = self.lock();
        s.partitioned.remove(&client);
        for w in s.watchers.iter_mut().filter(|w| w.client == client) {
            if let Some(waker) = w.waker.take() {
                waker.wake();
            }
        }
    }
}

impl State {
    fn current(&self, key: &str) -> Revision {
        match self.keys.get(key) {
            Some(e) if e.value.is_some() => e.revision,
            _ => 0,
        }
    }

    fn write(&mut self, key: &str, value: Option<Bytes>) -> Revision {
        self.revision += 1;
        let entry = Entry {
            key: key.to_string(),
            value,
            revision: self.revision,
        };
        self.keys.insert(key.to_string(), entry.clone());
        if entry.value.is_none() && key.starts_with(&self.expiring) {
            self.deletions
                .push_back((self.now, key.to_string(), self.revision));
        }
        for w in &mut self.watchers {
            if !w.dropped && key.starts_with(&w.prefix) {
                w.queue.retain(|queued| queued.key != key);
                w.queue.push_back(entry.clone());
                if let Some(waker) = w.waker.take() {
                    waker.wake();
                }
            }
        }
        self.revision
    }
}

/// One gateway's connection to the model.
#[derive(Clone)]
pub struct ModelClient {
    model: Model,
    client: u64,
}

impl ModelClient {
    fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(&mut State) -> Result<T, KvError>,
    ) -> BoxFuture<'static, Result<T, KvError>> {
        let mut s = self.model.lock();
        let result = if s.partitioned.contains(&self.client) {
            Err(KvError::Unavailable("cut off from the backplane".into()))
        } else {
            op(&mut s)
        };
        Box::pin(std::future::ready(result))
    }
}

impl Backplane for ModelClient {
    fn create(&self, key: &str, value: Bytes) -> BoxFuture<'_, Result<Revision, KvError>> {
        self.run(|s| match s.current(key) {
            0 => Ok(s.write(key, Some(value))),
            current => Err(KvError::Exists { current }),
        })
    }

    fn update(
        &self,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> BoxFuture<'_, Result<Revision, KvError>> {
        self.run(|s| match s.current(key) {
            current if current == expected && current != 0 => Ok(s.write(key, Some(value))),
            current => Err(KvError::WrongRevision { expected, current }),
        })
    }

    fn delete(&self, key: &str, expected: Revision) -> BoxFuture<'_, Result<Revision, KvError>> {
        self.run(|s| match s.current(key) {
            current if current == expected && current != 0 => Ok(s.write(key, None)),
            current => Err(KvError::WrongRevision { expected, current }),
        })
    }

    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, KvError>> {
        self.run(|s| Ok(s.keys.get(key).cloned()))
    }

    fn live_keys(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<String>, KvError>> {
        let prefix = prefix.to_string();
        self.run(move |s| {
            let mut keys: Vec<String> = s
                .keys
                .values()
                .filter(|e| e.key.starts_with(&prefix) && e.value.is_some())
                .map(|e| e.key.clone())
                .collect();
            keys.sort();
            Ok(keys)
        })
    }

    fn last_revision(&self) -> BoxFuture<'_, Result<Revision, KvError>> {
        self.run(|s| Ok(s.revision))
    }

    fn watch(&self, prefix: &str) -> BoxFuture<'_, Result<Watch, KvError>> {
        let model = self.model.clone();
        let client = self.client;
        let prefix = prefix.to_string();
        let started = self.run(move |s| {
            let mut initial: Vec<Entry> = s
                .keys
                .values()
                .filter(|e| e.key.starts_with(&prefix))
                .cloned()
                .collect();
            initial.sort_by_key(|e| e.revision);
            s.watchers.push(Watcher {
                client,
                prefix,
                queue: initial.into(),
                waker: None,
                dropped: false,
            });
            Ok(s.watchers.len() - 1)
        });
        Box::pin(async move {
            let index = started.await?;
            Ok(Box::pin(ModelWatch { model, index }) as Watch)
        })
    }
}

struct ModelWatch {
    model: Model,
    index: usize,
}

impl Stream for ModelWatch {
    type Item = Result<Entry, KvError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut s = self.model.lock();
        let cut_off = {
            let client = s.watchers[self.index].client;
            s.partitioned.contains(&client)
        };
        let w = &mut s.watchers[self.index];
        match w.queue.pop_front() {
            Some(e) if !cut_off => Poll::Ready(Some(Ok(e))),
            popped => {
                if let Some(e) = popped {
                    w.queue.push_front(e);
                }
                w.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for ModelWatch {
    fn drop(&mut self) {
        let mut s = self.model.lock();
        let w = &mut s.watchers[self.index];
        w.dropped = true;
        w.queue.clear();
    }
}
