//! Where a broker run starts numbering, so that epochs, member ids and system ids never repeat
//! across broker restarts (docs/semantics.md#restart-identity), with nothing kept on disk.
//!
//! The rule: a run that starts when the wall clock reads `t` microseconds since the Unix epoch
//! hands out every kind of id above `t`, counting up by one within the run (consecutive epochs
//! still differ by 1). The next run starts above its own start time `t'`, so its ids are above the
//! last run's as long as `t'` is past `t` plus the ids the last run handed out: the clock may not
//! have gone back by more than the last run's uptime plus the downtime, less one microsecond per
//! id handed out. A run that sustains over a million ids a second for its whole uptime, or a
//! clock set back further than that, breaks it, and ids may then repeat.
//!
//! Microseconds keep ids below 2^53 until the year 2255, so they survive JSON and JavaScript
//! numbers (doubles) exactly.
//!
//! The shell reads the clock once at start and passes the reading in: the core never does.

use super::{
    Floors, SystemId,
    planted::{PlantedBug, active as planted},
};

/// The floor of one broker run: every epoch, member id and system id it hands out is above it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct IdFloor {
    unix_micros: u64,
}

impl IdFloor {
    /// The floor of a run that started when the wall clock read `unix_micros` microseconds since
    /// the Unix epoch.
    pub fn at_start(unix_micros: u64) -> Self {
        Self {
            unix_micros: if planted(PlantedBug::CountersRestartAtZero) {
                0
            } else {
                unix_micros
            },
        }
    }

    /// The floor itself, in microseconds since the Unix epoch: ids handed out are above it.
    pub fn unix_micros(self) -> u64 {
        self.unix_micros
    }

    /// The system id counter's starting value: the first message gets the next one.
    pub fn last_system_id(self) -> SystemId {
        self.unix_micros
    }

    /// Where every subscription created in this run starts numbering epochs and member ids
    /// (raised further for one recreated after expiry).
    pub fn floors(self) -> Floors {
        Floors {
            epoch: self.unix_micros,
            member_id: self.unix_micros,
        }
    }
}

impl Floors {
    /// The higher of two floors, field by field.
    pub fn max(self, other: Floors) -> Floors {
        Floors {
            epoch: self.epoch.max(other.epoch),
            member_id: self.member_id.max(other.member_id),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::core::{MemberOptions, Mode, Pattern, QueueLimits, Subscription, SubscriptionSpec};

    const START: u64 = 1_767_225_600_000_000;

    fn subscription(floors: Floors) -> Subscription {
        let spec = SubscriptionSpec {
            mode: Mode::Singleton,
            consumer_group: "g".into(),
            patterns: vec![Pattern::parse("a.b").unwrap()],
            max_delivery_attempts: 0,
            dead_letter_topic: None,
            ack_mode: Default::default(),
            overflow: Default::default(),
        };
        let limits = QueueLimits {
            max_messages: 10,
            max_bytes: 1 << 20,
            max_members: 10,
            idle_timeout: Duration::from_secs(60),
        };
        Subscription::new("s".into(), spec, limits, floors, Duration::ZERO)
    }

    /// (member id, epoch) of a first member joining a fresh subscription with `floors`.
    fn first_join(floors: Floors) -> (u64, u64) {
        let mut s = subscription(floors);
        let spec = s.spec().clone();
        let (member, _) = s.join(&spec, MemberOptions::default()).unwrap();
        (member, s.epoch())
    }

    // docs/semantics.md#restart-identity: every id a run hands out is above the wall-clock time it started at, and a later
    // start gives higher ids, also where the earlier run handed out many.
    #[test]
    fn ids_start_above_the_start_time_and_a_later_start_starts_higher() {
        let first = IdFloor::at_start(START);
        assert_eq!(
            (first.unix_micros(), first.last_system_id()),
            (START, START)
        );
        assert_eq!(first_join(first.floors()), (START + 1, START + 1));
        let later = IdFloor::at_start(START + 5_000_000);
        assert!(later > first);
        assert_eq!(
            first_join(later.floors()),
            (START + 5_000_001, START + 5_000_001)
        );
    }

    // A subscription recreated after expiry starts above both the run's floor and its retired
    // predecessor.
    #[test]
    fn floors_take_the_higher_of_each_field() {
        let run = IdFloor::at_start(100).floors();
        let retired = Floors {
            epoch: 250,
            member_id: 50,
        };
        assert_eq!(
            run.max(retired),
            Floors {
                epoch: 250,
                member_id: 100
            }
        );
        assert_eq!(retired.max(run), run.max(retired));
    }

    // Ids stay exact as JSON numbers (doubles) for centuries of start times.
    #[test]
    fn microsecond_ids_stay_below_2_to_the_53() {
        let year_2200 = 7_258_118_400_000_000u64;
        assert!(year_2200 + 1_000_000_000 < 1 << 53);
    }

    #[cfg(feature = "planted-bugs")]
    #[test]
    fn counters_restart_at_zero_ignores_the_start_time() {
        use crate::core::planted::plant;
        plant(Some(PlantedBug::CountersRestartAtZero));
        let floor = IdFloor::at_start(START);
        plant(None);
        assert_eq!(floor.last_system_id(), 0);
        assert_eq!(first_join(floor.floors()), (1, 1));
    }
}
