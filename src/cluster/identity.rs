//! What a gateway claims in the coordination bucket as it starts, before its coordinator runs
//! (docs/semantics.md#cluster-restart-identity): the cluster's epoch floor raised above its
//! start time, and a member-id route of its own. Both are compare-and-set loops over the
//! [`Backplane`] seam, so gateways started together each get their own, and the simulation
//! runs them as production does.

use bytes::Bytes;

use super::backplane::{Backplane, KvError, Revision};
use super::values::{IDS_KEY, IdsValue, ROUTES_KEY, RoutesValue};

/// Tries of each compare-and-set loop before it gives up (others kept writing at once).
const TRIES: usize = 10;

/// Raises the cluster's epoch floor ([`IdsValue`]) so that every epoch made from now on is
/// above `now_micros`: its offset becomes `now_micros` less the bucket's last revision, unless
/// it is higher already (another gateway's clock ahead, or one started later). Epochs are then
/// above the time the gateway started, so above every id an embedded broker that ran before
/// handed out. Returns the floor the next epoch is above: the floor's revision plus its offset.
///
/// # Errors
/// [`KvError::Unavailable`] when the bucket does not answer, or other gateways keep raising it
/// at once (ten tries).
pub async fn raise_epoch_floor(kv: &dyn Backplane, now_micros: u64) -> Result<u64, KvError> {
    for _ in 0..TRIES {
        let (held, expected): (IdsValue, _) = read_json(kv, IDS_KEY).await?;
        let last = kv.last_revision().await?;
        let wanted = now_micros.saturating_sub(last);
        if wanted <= held.epoch_offset {
            return Ok(expected.max(1).saturating_add(held.epoch_offset));
        }
        let value = IdsValue {
            epoch_offset: wanted,
        };
        match write_json(kv, IDS_KEY, &value, expected).await {
            Ok(revision) => return Ok(revision.saturating_add(wanted)),
            // Another gateway raised it meanwhile: look again.
            Err(error) if error.is_conflict() => {}
            Err(error) => return Err(error),
        }
    }
    Err(KvError::Unavailable(
        "the epoch floor kept changing under ten tries".into(),
    ))
}

/// Claims a gateway's member-id route: the next above every route claimed before and above
/// `now_micros` (its ids, `route << shift` and up, are then above its start time in µs), so
/// member ids rise across gateway starts and stand above every id an embedded broker handed
/// out before.
///
/// # Errors
/// [`KvError::Unavailable`] when the bucket does not answer, other gateways keep claiming at
/// once (ten tries), or the route would put ids past 2^53 (a clock past the year 2255).
pub async fn claim_route(kv: &dyn Backplane, now_micros: u64, shift: u32) -> Result<u64, KvError> {
    let by_time = (now_micros >> shift) + 1;
    for _ in 0..TRIES {
        let (held, expected): (RoutesValue, _) = read_json(kv, ROUTES_KEY).await?;
        let route = by_time.max(held.last.saturating_add(1));
        if route >= 1 << (53 - shift) {
            return Err(KvError::Unavailable(format!(
                "no member-id route is left below 2^53 (route {route})"
            )));
        }
        match write_json(kv, ROUTES_KEY, &RoutesValue { last: route }, expected).await {
            Ok(_) => return Ok(route),
            // Another gateway claimed one meanwhile: look again.
            Err(error) if error.is_conflict() => {}
            Err(error) => return Err(error),
        }
    }
    Err(KvError::Unavailable(
        "the member-id routes kept changing under ten tries".into(),
    ))
}

/// The value of `key` as `T` (its default when it has none, or one that does not parse, which
/// a write replaces), and the revision to compare-and-set against (0: none).
async fn read_json<T: serde::de::DeserializeOwned + Default>(
    kv: &dyn Backplane,
    key: &str,
) -> Result<(T, Revision), KvError> {
    Ok(match kv.get(key).await? {
        // Only an operator deletes these: named, not retried as if others kept writing it
        // (recreating `routes` from the clock could hand out a route claimed within the last
        // 2^shift µs again).
        Some(entry) if entry.value.is_none() => {
            return Err(KvError::Unavailable(format!(
                "the coordination bucket's {key:?} key was deleted (revision {}): a gateway cannot claim its identity without it; restore it, or make a new bucket (a new stream name)",
                entry.revision
            )));
        }
        Some(entry) => {
            let value = entry
                .value
                .as_deref()
                .and_then(|bytes| serde_json::from_slice(bytes).ok())
                .unwrap_or_default();
            (value, entry.revision)
        }
        None => (T::default(), 0),
    })
}

/// Writes `value` to `key` if its revision is still `expected` (0: it has none).
async fn write_json<T: serde::Serialize>(
    kv: &dyn Backplane,
    key: &str,
    value: &T,
    expected: Revision,
) -> Result<Revision, KvError> {
    let bytes = Bytes::from(serde_json::to_vec(value).unwrap_or_default());
    if expected == 0 {
        kv.create(key, bytes).await
    } else {
        kv.update(key, bytes, expected).await
    }
}
