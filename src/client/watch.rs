//! Following a SINGLETON subscription's leadership without joining it
//! (docs/semantics.md#watching-leadership): [`Client::watch_leadership`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Client, Error, Result};
use crate::pb;

/// A SINGLETON subscription's leadership at one moment, as the server last told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderState {
    /// The active member's id, if one is active.
    pub active_member_id: Option<u64>,
    /// The active member's epoch; with none active, the last one handed out (0 before any).
    pub epoch: u64,
    /// The active member's metadata, as it joined with or last proclaimed; empty with none
    /// active or none declared (docs/semantics.md#member-metadata).
    pub metadata: String,
    /// By the answering server's clock: embedded, when this state began; through a gateway,
    /// when that gateway saw it (docs/semantics.md#watching-leadership).
    pub since: SystemTime,
}

impl From<pb::LeadershipFrame> for LeaderState {
    fn from(frame: pb::LeadershipFrame) -> Self {
        let since = frame.since.map_or(UNIX_EPOCH, |t| {
            let seconds = u64::try_from(t.seconds).unwrap_or(0);
            let nanos = u32::try_from(t.nanos).unwrap_or(0);
            UNIX_EPOCH + Duration::new(seconds, nanos.min(999_999_999))
        });
        Self {
            active_member_id: (frame.active_member_id != 0).then_some(frame.active_member_id),
            epoch: frame.epoch,
            metadata: frame.metadata,
            since,
        }
    }
}

/// A watch of one subscription's leadership: the state when it was opened, then each change.
/// Not reading costs nothing at the server: it sends the latest state when read again.
#[derive(Debug)]
pub struct LeadershipWatch {
    frames: tonic::Streaming<pb::LeadershipFrame>,
}

impl LeadershipWatch {
    /// The next state: the current one first, then one per change.
    ///
    /// # Errors
    /// [`Error::NotFound`] once the subscription expired or was deleted, [`Error::Unavailable`]
    /// when the server stops (watch again, at any gateway in cluster mode), or a transport
    /// failure.
    pub async fn next(&mut self) -> Result<LeaderState> {
        match self.frames.message().await? {
            Some(frame) => Ok(frame.into()),
            None => Err(Error::Unavailable(
                "the server ended the leadership watch".into(),
            )),
        }
    }
}

impl Client {
    /// Watches SINGLETON subscription `subscription_id`'s leadership, member or not. In
    /// cluster mode the watch follows the whole cluster from any gateway.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown subscription, [`Error::FailedPrecondition`] for a
    /// BROADCAST or QUEUE one, [`Error::InvalidArgument`] for a malformed id.
    pub async fn watch_leadership(&self, subscription_id: &str) -> Result<LeadershipWatch> {
        let frames = self
            .raw
            .clone()
            .watch_leadership(pb::WatchLeadershipRequest {
                subscription_id: subscription_id.into(),
            })
            .await?
            .into_inner();
        Ok(LeadershipWatch { frames })
    }
}
