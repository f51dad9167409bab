//! A hybrid logical clock, small enough to read at a glance.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A hybrid-logical-clock timestamp: wall-clock milliseconds plus a logical counter that orders
/// events within one millisecond and carries causality past a clock that lags.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Hlc {
    /// Milliseconds since the Unix epoch, never lower than any timestamp this clock has seen.
    pub wall_ms: u64,
    /// Events at the same `wall_ms`.
    pub counter: u32,
}

impl fmt::Display for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.wall_ms, self.counter)
    }
}

/// The clock of one store: the last timestamp issued or observed.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Clock {
    last: Hlc,
}

pub(crate) fn wall_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Clock {
    pub(crate) fn starting_at(last: Hlc) -> Clock {
        Clock { last }
    }

    /// A timestamp greater than every one issued or observed so far.
    pub(crate) fn tick(&mut self, now_ms: u64) -> Hlc {
        self.last = if now_ms > self.last.wall_ms {
            Hlc {
                wall_ms: now_ms,
                counter: 0,
            }
        } else if self.last.counter == u32::MAX {
            Hlc {
                wall_ms: self.last.wall_ms + 1,
                counter: 0,
            }
        } else {
            Hlc {
                wall_ms: self.last.wall_ms,
                counter: self.last.counter + 1,
            }
        };
        self.last
    }

    /// The last timestamp issued or observed.
    pub(crate) fn last(&self) -> Hlc {
        self.last
    }

    /// Takes a remote timestamp into account, so the next tick orders after it.
    pub(crate) fn observe(&mut self, remote: Hlc) {
        self.last = self.last.max(remote);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_strictly_increasing_even_when_the_wall_clock_goes_back() {
        let mut c = Clock::default();
        let a = c.tick(1000);
        let b = c.tick(1000);
        let d = c.tick(900);
        let e = c.tick(1001);
        assert!(a < b && b < d && d < e, "{a} {b} {d} {e}");
    }

    #[test]
    fn observing_a_future_timestamp_orders_later_ticks_after_it() {
        let mut c = Clock::default();
        c.tick(1000);
        let remote = Hlc {
            wall_ms: 5000,
            counter: 7,
        };
        c.observe(remote);
        assert!(c.tick(1001) > remote);
    }
}
