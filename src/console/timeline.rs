//! A SINGLETON subscription's leadership timeline, as the console shows it
//! (docs/operations.md#console): each epoch, its member, when it began and ended, and why it
//! ended. Pure: it is told what was seen and when, and keeps the last [`MAX_REIGNS`].
//!
//! The console learns leadership by looking (after each change the broker or the cluster's
//! lines report, and every second), so why an epoch ended is read from what is seen next:
//! the member gone from the line ("closed stream"), still in it behind a member of higher
//! priority ("priority") or after a `HandOver` ("hand-over"), its successor taking over from a
//! gateway whose lease lapsed ("lease lapse"). No epoch ends with a delete: a subscription is
//! deleted only once no member is joined. Epochs that began and ended between two looks are
//! not seen.

use std::collections::VecDeque;

use serde::Serialize;

/// Epochs kept per subscription, newest first.
pub const MAX_REIGNS: usize = 32;

/// Why an epoch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Cause {
    /// The active member's stream ended (closed by its client, or its connection lost).
    #[serde(rename = "closed stream")]
    ClosedStream,
    /// A `HandOver` stepped it down.
    #[serde(rename = "hand-over")]
    HandOver,
    /// A member of higher priority joined and it stepped down.
    #[serde(rename = "priority")]
    Priority,
    /// Cluster mode: its gateway's lease lapsed and another gateway's member took over.
    #[serde(rename = "lease lapse")]
    LeaseLapse,
}

/// One epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reign {
    /// Its epoch (a string: it may pass 2^53).
    #[serde(serialize_with = "as_string")]
    pub epoch: u64,
    /// Its member.
    #[serde(serialize_with = "as_string")]
    pub member: u64,
    /// Cluster mode: the gateway holding the member.
    #[serde(serialize_with = "opt_as_string")]
    pub gateway: Option<u64>,
    /// The member's metadata, as last seen.
    pub metadata: String,
    /// When it began, in ms since the Unix epoch.
    pub start_ms: u64,
    /// When it was seen ended.
    pub end_ms: Option<u64>,
    /// Why it ended.
    pub cause: Option<Cause>,
}

/// Serializes a number as a JSON string (ids and epochs pass 2^53).
pub(super) fn as_string<S: serde::Serializer>(n: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(n)
}

/// [`as_string`], or `null`.
pub(super) fn opt_as_string<S: serde::Serializer>(
    n: &Option<u64>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match n {
        Some(n) => s.collect_str(n),
        None => s.serialize_none(),
    }
}

/// A member as the timeline tells members apart: cluster mode adds its gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Who {
    /// The member's id.
    pub member: u64,
    /// Cluster mode: its gateway's id.
    pub gateway: Option<u64>,
}

/// What one look at a SINGLETON subscription saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The active member, if any.
    pub active: Option<Who>,
    /// The epoch (the active member's, else the last handed out).
    pub epoch: u64,
    /// The active member's metadata.
    pub metadata: String,
    /// Every member in line, with its priority.
    pub line: Vec<(Who, u32)>,
    /// A `HandOver` was asked since the last look (or is recorded as asked).
    pub handed_over: bool,
    /// Cluster mode: the active member took over from one whose gateway's lease lapsed.
    pub took_over: bool,
}

/// One subscription's timeline.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timeline {
    /// Newest first.
    reigns: VecDeque<Reign>,
    /// The line at the last look, with priorities.
    line: Vec<(Who, u32)>,
}

impl Timeline {
    /// The epochs kept, newest first.
    pub fn reigns(&self) -> impl Iterator<Item = &Reign> {
        self.reigns.iter()
    }

    /// The current reign's start, when one is open.
    pub fn since(&self) -> Option<u64> {
        self.reigns
            .front()
            .filter(|r| r.end_ms.is_none())
            .map(|r| r.start_ms)
    }

    /// Takes in one look at `now_ms`.
    pub fn observe(&mut self, now_ms: u64, seen: &Seen) {
        let previous_line = std::mem::replace(&mut self.line, seen.line.clone());
        if let Some(current) = self.reigns.front_mut()
            && current.end_ms.is_none()
        {
            let same = seen.active.is_some_and(|a| {
                a.member == current.member
                    && a.gateway == current.gateway
                    && seen.epoch == current.epoch
            });
            if same {
                current.metadata.clone_from(&seen.metadata);
                return;
            }
            let was = Who {
                member: current.member,
                gateway: current.gateway,
            };
            current.end_ms = Some(now_ms.max(current.start_ms));
            current.cause = Some(cause(was, &previous_line, seen));
        }
        let Some(active) = seen.active else {
            return;
        };
        if self.reigns.front().is_some_and(|r| r.epoch == seen.epoch) {
            // An epoch seen ended is not begun again by a stale look.
            return;
        }
        let start_ms = now_ms.max(self.reigns.front().and_then(|r| r.end_ms).unwrap_or(0));
        self.reigns.push_front(Reign {
            epoch: seen.epoch,
            member: active.member,
            gateway: active.gateway,
            metadata: seen.metadata.clone(),
            start_ms,
            end_ms: None,
            cause: None,
        });
        self.reigns.truncate(MAX_REIGNS);
    }
}

/// Why `was`'s epoch ended, from the line it stood in and what is seen now.
fn cause(was: Who, previous_line: &[(Who, u32)], seen: &Seen) -> Cause {
    if seen.took_over
        && seen.active.is_some()
        && seen.active.map(|a| a.gateway) != Some(was.gateway)
    {
        return Cause::LeaseLapse;
    }
    let Some(&(_, was_priority)) = seen.line.iter().find(|(who, _)| *who == was) else {
        return Cause::ClosedStream;
    };
    if seen.handed_over {
        return Cause::HandOver;
    }
    let successor_priority = seen
        .active
        .and_then(|a| seen.line.iter().find(|(who, _)| *who == a))
        .map_or(0, |(_, p)| *p);
    let before = previous_line
        .iter()
        .find(|(who, _)| *who == was)
        .map_or(was_priority, |(_, p)| *p);
    if successor_priority > before {
        Cause::Priority
    } else {
        Cause::HandOver
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(member: u64) -> Who {
        Who {
            member,
            gateway: None,
        }
    }

    fn seen(active: Option<u64>, epoch: u64, line: &[(u64, u32)]) -> Seen {
        Seen {
            active: active.map(who),
            epoch,
            metadata: String::new(),
            line: line.iter().map(|&(m, p)| (who(m), p)).collect(),
            handed_over: false,
            took_over: false,
        }
    }

    fn causes(t: &Timeline) -> Vec<(u64, u64, Option<Cause>)> {
        t.reigns().map(|r| (r.epoch, r.member, r.cause)).collect()
    }

    #[test]
    fn a_closed_stream_ends_the_epoch_and_the_next_in_line_begins_one() {
        let mut t = Timeline::default();
        t.observe(10, &seen(Some(1), 1, &[(1, 0), (2, 0)]));
        t.observe(20, &seen(Some(1), 1, &[(1, 0), (2, 0)]));
        t.observe(30, &seen(Some(2), 2, &[(2, 0)]));
        assert_eq!(
            causes(&t),
            vec![(2, 2, None), (1, 1, Some(Cause::ClosedStream))]
        );
        assert_eq!(t.reigns().nth(1).unwrap().end_ms, Some(30));
        assert_eq!(t.since(), Some(30));
    }

    #[test]
    fn a_member_left_in_line_behind_a_higher_priority_stepped_down_for_priority() {
        let mut t = Timeline::default();
        t.observe(10, &seen(Some(1), 1, &[(1, 0)]));
        t.observe(20, &seen(Some(3), 2, &[(3, 5), (1, 0)]));
        assert_eq!(causes(&t)[1].2, Some(Cause::Priority));
    }

    #[test]
    fn a_hand_over_is_named_as_such() {
        let mut t = Timeline::default();
        t.observe(10, &seen(Some(1), 1, &[(1, 0), (2, 0)]));
        let mut next = seen(Some(2), 2, &[(2, 0), (1, 0)]);
        next.handed_over = true;
        t.observe(20, &next);
        assert_eq!(causes(&t)[1].2, Some(Cause::HandOver));
        // Without the signal, a member left in line behind one of its own priority handed over.
        let mut u = Timeline::default();
        u.observe(10, &seen(Some(1), 1, &[(1, 0), (2, 0)]));
        u.observe(20, &seen(Some(2), 2, &[(2, 0), (1, 0)]));
        assert_eq!(causes(&u)[1].2, Some(Cause::HandOver));
    }

    #[test]
    fn a_take_over_from_another_gateway_is_a_lease_lapse() {
        let mut t = Timeline::default();
        let a = Who {
            member: 1,
            gateway: Some(7),
        };
        let b = Who {
            member: 1,
            gateway: Some(8),
        };
        let mut first = seen(None, 1, &[]);
        first.active = Some(a);
        first.line = vec![(a, 0), (b, 0)];
        t.observe(10, &first);
        let mut next = seen(None, 2, &[]);
        next.active = Some(b);
        next.line = vec![(b, 0)];
        next.took_over = true;
        t.observe(20, &next);
        let reigns: Vec<_> = t.reigns().collect();
        assert_eq!(reigns[0].gateway, Some(8));
        assert_eq!(reigns[1].cause, Some(Cause::LeaseLapse));
    }

    #[test]
    fn no_one_active_ends_the_reign_and_a_stale_look_does_not_reopen_it() {
        let mut t = Timeline::default();
        t.observe(10, &seen(Some(1), 1, &[(1, 0)]));
        t.observe(20, &seen(None, 1, &[]));
        assert_eq!(causes(&t), vec![(1, 1, Some(Cause::ClosedStream))]);
        // A stale look at the ended epoch does not begin it again.
        t.observe(25, &seen(Some(1), 1, &[(1, 0)]));
        assert_eq!(causes(&t).len(), 1);
        t.observe(30, &seen(Some(2), 2, &[(2, 0)]));
        assert_eq!(causes(&t)[0], (2, 2, None));
    }

    #[test]
    fn it_keeps_the_newest_epochs_only() {
        let mut t = Timeline::default();
        for epoch in 1..=(MAX_REIGNS as u64 + 20) {
            t.observe(epoch * 10, &seen(Some(epoch), epoch, &[(epoch, 0)]));
        }
        assert_eq!(t.reigns().count(), MAX_REIGNS);
        assert_eq!(t.reigns().next().unwrap().epoch, MAX_REIGNS as u64 + 20);
    }

    #[test]
    fn epochs_serialize_as_strings_and_causes_as_words() {
        let reign = Reign {
            epoch: u64::MAX,
            member: 3,
            gateway: None,
            metadata: "<b>".into(),
            start_ms: 1,
            end_ms: Some(2),
            cause: Some(Cause::LeaseLapse),
        };
        let json = serde_json::to_string(&reign).unwrap();
        assert!(
            json.contains("\"epoch\":\"18446744073709551615\""),
            "{json}"
        );
        assert!(json.contains("\"cause\":\"lease lapse\""), "{json}");
        assert!(json.contains("\"metadata\":\"<b>\""), "{json}");
    }
}
