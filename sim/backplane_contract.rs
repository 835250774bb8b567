//! The backplane contract (`tinybroker::cluster::backplane`'s module doc), as generic checks any
//! implementation must pass: here against the in-memory model; the NATS adapter runs the same
//! functions against a real nats-server (`backplane_nats.rs`, through [`every_contract_check`]).
//! Each takes a fresh, empty bucket.

use std::time::Duration;

use bytes::Bytes;
use tinybroker::cluster::backplane::{Backplane, BoxFuture, Entry, KvError, Revision, Watch};

use crate::backplane::Model;

/// Calls `$run!(check)` for every check of the contract, so each implementation's runner runs
/// all of them (`backplane_nats.rs` for NATS): a new check goes here too.
#[macro_export]
macro_rules! every_contract_check {
    ($run:ident) => {
        $run!(compare_and_set);
        $run!(revisions_increase_across_keys);
        $run!(watch_delivers_every_change_in_order);
        $run!(live_keys_name_every_key_holding_a_value);
        $run!(last_revision_is_the_latest_write_of_any_key);
        $run!(gateways_started_together_claim_routes_of_their_own_and_raise_the_floor);
        $run!(a_start_over_a_deleted_identity_key_is_refused_naming_it);
    };
}

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

async fn next(w: &mut Watch) -> Entry {
    let item = tokio::time::timeout(
        Duration::from_secs(5),
        std::future::poll_fn(|cx| w.as_mut().poll_next(cx)),
    )
    .await
    .expect("watch delivered nothing within 5 s")
    .expect("watch ended");
    item.expect("watch failed")
}

/// Create fails on an existing key; update and delete are compare-and-set on the key's revision.
pub async fn compare_and_set(kv: &impl Backplane) {
    let r1 = kv.create("a", b("1")).await.unwrap();
    assert_eq!(
        kv.create("a", b("2")).await,
        Err(KvError::Exists { current: r1 })
    );
    let r2 = kv.update("a", b("2"), r1).await.unwrap();
    assert!(
        matches!(
            kv.update("a", b("3"), r1).await,
            Err(KvError::WrongRevision { .. })
        ),
        "a stale revision must lose"
    );
    assert!(matches!(
        kv.delete("a", r1).await,
        Err(KvError::WrongRevision { .. })
    ));
    assert_eq!(kv.get("a").await.unwrap().unwrap().value, Some(b("2")));
    let r3 = kv.delete("a", r2).await.unwrap();
    let gone = kv.get("a").await.unwrap().unwrap();
    assert_eq!((gone.value, gone.revision), (None, r3));
    assert!(
        matches!(
            kv.update("a", b("4"), r3).await,
            Err(KvError::WrongRevision { .. })
        ),
        "a deleted key cannot be updated"
    );
    let r4 = kv.create("a", b("5")).await.unwrap();
    assert!(
        r4 > r3,
        "a deleted key can be created again, at a newer revision"
    );
    assert_eq!(kv.get("never").await.unwrap(), None);
}

/// The live keys under a prefix are those whose latest entry is a value, in key order: a
/// deleted key is not among them, one made again is; keys needing escapes come back as
/// written.
pub async fn live_keys_name_every_key_holding_a_value(kv: &impl Backplane) {
    for key in ["lease.10", "lease.2", "sub.a", "lease.1", "lease.a b/c"] {
        kv.create(key, b("v")).await.unwrap();
    }
    let r = kv.get("lease.2").await.unwrap().unwrap().revision;
    kv.delete("lease.2", r).await.unwrap();
    assert_eq!(
        kv.live_keys("lease.").await.unwrap(),
        ["lease.1", "lease.10", "lease.a b/c"]
    );
    kv.create("lease.2", b("again")).await.unwrap();
    assert_eq!(
        kv.live_keys("").await.unwrap(),
        ["lease.1", "lease.10", "lease.2", "lease.a b/c", "sub.a"]
    );
    assert_eq!(
        kv.live_keys("nothing.").await.unwrap(),
        Vec::<String>::new()
    );
}

/// Every write to any key gets a revision above all earlier ones.
pub async fn revisions_increase_across_keys(kv: &impl Backplane) {
    let mut last = 0;
    for key in ["x", "y", "x.z", "y"] {
        let r = match kv.get(key).await.unwrap() {
            Some(e) if e.value.is_some() => kv.update(key, b("v"), e.revision).await.unwrap(),
            _ => kv.create(key, b("v")).await.unwrap(),
        };
        assert!(r > last, "revision {r} after {last}");
        last = r;
    }
}

/// The bucket's last revision is its latest write's, whatever the key, a deletion included.
pub async fn last_revision_is_the_latest_write_of_any_key(kv: &impl Backplane) {
    let r1 = kv.create("lr.a", b("1")).await.unwrap();
    assert_eq!(kv.last_revision().await.unwrap(), r1);
    let r2 = kv.create("lr.b", b("1")).await.unwrap();
    assert_eq!(kv.last_revision().await.unwrap(), r2);
    let r3 = kv.delete("lr.a", r1).await.unwrap();
    assert_eq!(kv.last_revision().await.unwrap(), r3, "a deletion too");
    assert!(kv.update("lr.b", b("2"), r1).await.is_err());
    assert_eq!(
        kv.last_revision().await.unwrap(),
        r3,
        "a refused write is none"
    );
}

/// docs/semantics.md#cluster-restart-identity, through the seam: gateways starting at once
/// each claim a member-id route of their own, above every one before and above the time, and
/// each raises the epoch floor above the time, whatever order their compare-and-sets land in.
pub async fn gateways_started_together_claim_routes_of_their_own_and_raise_the_floor(
    kv: &impl Backplane,
) {
    use tinybroker::cluster::identity::{claim_route, raise_epoch_floor};
    const SHIFT: u32 = tinybroker::broker::GATEWAY_ROUTE_SHIFT;
    // Each operation lets the others run first, so their compare-and-sets interleave (the
    // model answers at once).
    let kv = &Interleaved(kv);
    // A start time past any first sequence the bucket may have been given.
    let now = tinybroker::clock::system_unix_micros() + 3_600_000_000;
    let (a, b_, c, d) = tokio::join!(
        claim_route(kv, now, SHIFT),
        claim_route(kv, now, SHIFT),
        claim_route(kv, now, SHIFT),
        claim_route(kv, now, SHIFT),
    );
    let mut routes = [a.unwrap(), b_.unwrap(), c.unwrap(), d.unwrap()];
    routes.sort_unstable();
    assert!(
        routes.windows(2).all(|w| w[0] < w[1]),
        "one route each: {routes:?}"
    );
    assert!(routes[0] << SHIFT > now, "ids above the start time");
    let later = claim_route(kv, now, SHIFT).await.unwrap();
    assert!(later > routes[3], "a later start's route is above all");
    let (a, b_, c) = tokio::join!(
        raise_epoch_floor(kv, now),
        raise_epoch_floor(kv, now),
        raise_epoch_floor(kv, now),
    );
    for floor in [a, b_, c] {
        let floor = floor.unwrap();
        assert!(
            floor > now,
            "epochs above the start: floor {floor}, start {now}"
        );
    }
    // The next epoch, from any revision the bucket gives later, stays above the time.
    let held = kv.get("ids").await.unwrap().expect("the floor is written");
    let offset: tinybroker::cluster::values::IdsValue =
        serde_json::from_slice(held.value.as_deref().unwrap()).unwrap();
    let next = kv.create("after", b("")).await.unwrap();
    assert!(next + offset.epoch_offset > now);
}

/// A start over a bucket whose `routes` or `ids` key an operator deleted is refused with an
/// error naming the key, at once, not after ten tries as if other gateways kept writing it.
pub async fn a_start_over_a_deleted_identity_key_is_refused_naming_it(kv: &impl Backplane) {
    use tinybroker::cluster::identity::{claim_route, raise_epoch_floor};
    const SHIFT: u32 = tinybroker::broker::GATEWAY_ROUTE_SHIFT;
    let now = tinybroker::clock::system_unix_micros() + 3_600_000_000;
    claim_route(kv, now, SHIFT).await.unwrap();
    raise_epoch_floor(kv, now).await.unwrap();
    for key in ["ids", "routes"] {
        let held = kv.get(key).await.unwrap().expect("written");
        kv.delete(key, held.revision).await.unwrap();
    }
    for refused in [
        claim_route(kv, now, SHIFT).await.map(|_| ()),
        raise_epoch_floor(kv, now).await.map(|_| ()),
    ] {
        match refused {
            Err(KvError::Unavailable(why)) => assert!(why.contains("was deleted"), "{why}"),
            other => panic!("a start over a deleted key: {other:?}"),
        }
    }
}

/// A backplane whose every operation first yields to the other tasks polled with it.
struct Interleaved<'a, K>(&'a K);

impl<K: Backplane> Interleaved<'_, K> {
    fn after_a_yield<'s, T: 's>(
        &'s self,
        op: impl FnOnce(&'s K) -> BoxFuture<'s, T> + Send + 's,
    ) -> BoxFuture<'s, T> {
        Box::pin(async move {
            tokio::task::yield_now().await;
            op(self.0).await
        })
    }
}

impl<K: Backplane> Backplane for Interleaved<'_, K> {
    fn create(&self, key: &str, value: Bytes) -> BoxFuture<'_, Result<Revision, KvError>> {
        let key = key.to_string();
        self.after_a_yield(move |kv| Box::pin(async move { kv.create(&key, value).await }))
    }

    fn update(
        &self,
        key: &str,
        value: Bytes,
        expected: Revision,
    ) -> BoxFuture<'_, Result<Revision, KvError>> {
        let key = key.to_string();
        self.after_a_yield(move |kv| {
            Box::pin(async move { kv.update(&key, value, expected).await })
        })
    }

    fn delete(&self, key: &str, expected: Revision) -> BoxFuture<'_, Result<Revision, KvError>> {
        let key = key.to_string();
        self.after_a_yield(move |kv| Box::pin(async move { kv.delete(&key, expected).await }))
    }

    fn get(&self, key: &str) -> BoxFuture<'_, Result<Option<Entry>, KvError>> {
        let key = key.to_string();
        self.after_a_yield(move |kv| Box::pin(async move { kv.get(&key).await }))
    }

    fn watch(&self, prefix: &str) -> BoxFuture<'_, Result<Watch, KvError>> {
        self.0.watch(prefix)
    }

    fn live_keys(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<String>, KvError>> {
        self.0.live_keys(prefix)
    }

    fn last_revision(&self) -> BoxFuture<'_, Result<Revision, KvError>> {
        self.after_a_yield(|kv| kv.last_revision())
    }
}

/// A watch delivers the latest entry of each matching key, then the changes, in revision order,
/// deletions included, and nothing outside its prefix. A change overwritten before the watch
/// read it may be skipped (the bucket keeps one revision per key); the last one of each key
/// never is.
pub async fn watch_delivers_every_change_in_order(kv: &impl Backplane) {
    let r1 = kv.create("sub.a", b("1")).await.unwrap();
    let r2 = kv.update("sub.a", b("2"), r1).await.unwrap();
    let r3 = kv.create("sub.b", b("1")).await.unwrap();
    let mut w = kv.watch("sub.").await.unwrap();
    let first = next(&mut w).await;
    let second = next(&mut w).await;
    assert_eq!((first.key.as_str(), first.revision), ("sub.a", r2));
    assert_eq!((second.key.as_str(), second.revision), ("sub.b", r3));
    kv.create("lease.1", b("")).await.unwrap();
    let r4 = kv.update("sub.b", b("2"), r3).await.unwrap();
    let r5 = kv.update("sub.b", b("3"), r4).await.unwrap();
    let r6 = kv.delete("sub.a", r2).await.unwrap();
    let mut seen = Vec::new();
    while seen.last().map(|(_, rev, _)| *rev) != Some(r6) {
        let e = next(&mut w).await;
        seen.push((e.key, e.revision, e.value));
    }
    let expected = [
        ("sub.b".to_string(), r4, Some(b("2"))),
        ("sub.b".to_string(), r5, Some(b("3"))),
        ("sub.a".to_string(), r6, None),
    ];
    let skipped_r4 = &expected[1..];
    assert!(
        seen[..] == expected[..] || seen[..] == skipped_r4[..],
        "watch delivered {seen:?}"
    );
}

fn run(f: impl AsyncFnOnce(&crate::backplane::ModelClient)) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let model = Model::new();
    let client = model.client(1);
    rt.block_on(f(&client));
}

#[test]
fn cluster_backplane_model_keeps_compare_and_set_semantics() {
    run(async |kv| compare_and_set(kv).await);
}

#[test]
fn cluster_backplane_model_revisions_increase_across_keys() {
    run(async |kv| revisions_increase_across_keys(kv).await);
}

#[test]
fn cluster_backplane_model_watch_delivers_every_change_in_order() {
    run(async |kv| watch_delivers_every_change_in_order(kv).await);
}

#[test]
fn cluster_backplane_model_last_revision_is_the_latest_write_of_any_key() {
    run(async |kv| last_revision_is_the_latest_write_of_any_key(kv).await);
}

#[test]
fn cluster_backplane_model_gateways_started_together_claim_routes_of_their_own() {
    run(async |kv| {
        gateways_started_together_claim_routes_of_their_own_and_raise_the_floor(kv).await;
    });
}

#[test]
fn cluster_backplane_model_a_start_over_a_deleted_identity_key_is_refused() {
    run(async |kv| a_start_over_a_deleted_identity_key_is_refused_naming_it(kv).await);
}

#[test]
fn cluster_backplane_model_live_keys_name_every_key_holding_a_value() {
    run(async |kv| live_keys_name_every_key_holding_a_value(kv).await);
}

// The model's fault hook: a cut-off client fails every operation and its watch stops, then
// resumes with what it missed.
#[test]
fn cluster_backplane_model_partition_fails_operations_and_pauses_the_watch() {
    let rt = crate::clock::paused_runtime();
    rt.block_on(async {
        let model = Model::new();
        let (cut, other) = (model.client(1), model.client(2));
        let mut w = cut.watch("k").await.unwrap();
        model.partition(1);
        assert!(matches!(
            cut.create("k", b("1")).await,
            Err(KvError::Unavailable(_))
        ));
        let r = other.create("k", b("1")).await.unwrap();
        let paused = tokio::time::timeout(
            Duration::from_secs(1),
            std::future::poll_fn(|cx| w.as_mut().poll_next(cx)),
        )
        .await;
        assert!(paused.is_err(), "a cut-off watch delivers nothing");
        model.heal(1);
        assert_eq!(next(&mut w).await.revision, r);
    });
}
