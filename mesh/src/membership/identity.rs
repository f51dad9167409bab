//! Who a member is on the wire: the Machine ID, where it gossips, and which start of it speaks.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ployz_core::MachineId;
use serde::{Deserialize, Serialize};

/// A member's SWIM identity: one start of one Machine.
///
/// SWIM never lets an identity come back once it has been declared down, so the identity carries a
/// `bump` besides the Machine ID: every start of the membership picks a fresh one (from the clock,
/// see [`MemberIdentity::fresh`]), and a member that learns the Cluster declared it down renews
/// itself with `bump + 1` ([`foca::Identity::renew`]) and rejoins at once.
///
/// foca's notion of "the same member" ([`foca::Identity::addr`]) is the Machine ID: it keeps one
/// entry per Machine, and when two identities of one Machine meet, the one with the larger
/// `(bump, gossip)` wins ([`foca::Identity::win_addr_conflict`]), so a restarted Machine replaces
/// its previous start everywhere.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemberIdentity {
    /// The Machine this member is.
    pub machine: MachineId,
    /// Where the member receives gossip: its Management Address and the gossip port in production.
    pub gossip: SocketAddr,
    /// Which start (or renewal) of the Machine this is: larger is newer.
    pub bump: u64,
}

/// The largest bump handed out by this process, so that two starts in one process (a restart
/// within a millisecond, or tests) still get strictly increasing bumps.
static LAST_BUMP: AtomicU64 = AtomicU64::new(0);

impl MemberIdentity {
    /// A new identity for a start of `machine`, with a bump from the clock: microseconds since the
    /// Unix epoch, and above every bump this process handed out before.
    ///
    /// A renewal adds 1 to the bump, so a later start beats every renewal of an earlier one unless
    /// the earlier one renewed more times than microseconds passed in between (each renewal takes a
    /// round of being declared down, seconds at least). A clock stepped back between two starts
    /// can make the new start lose against the old identity still remembered as down; the new
    /// start is then told it is down and renews until it wins, one round trip per renewal.
    pub fn fresh(machine: MachineId, gossip: SocketAddr) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let previous = LAST_BUMP
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
                Some(now.max(last.saturating_add(1)))
            })
            // The closure always returns Some.
            .unwrap_or_else(|last| last);
        let bump = now.max(previous.saturating_add(1));
        Self {
            machine,
            gossip,
            bump,
        }
    }

    /// The identity used to announce to a Machine whose current bump is not known: foca accepts an
    /// announce addressed to any identity of its Machine ID.
    pub(crate) fn announce_target(machine: MachineId, gossip: SocketAddr) -> Self {
        Self {
            machine,
            gossip,
            bump: 0,
        }
    }
}

impl fmt::Debug for MemberIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}#{}", self.machine, self.gossip, self.bump)
    }
}

impl foca::Identity for MemberIdentity {
    type Addr = MachineId;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            machine: self.machine.clone(),
            gossip: self.gossip,
            bump: self.bump.wrapping_add(1),
        })
    }

    fn addr(&self) -> MachineId {
        self.machine.clone()
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        // The gossip address breaks ties, so the order is total and two identities never both win.
        (self.bump, self.gossip) > (adversary.bump, adversary.gossip)
    }
}

#[cfg(test)]
mod tests {
    use foca::Identity;

    use super::*;

    fn addr() -> SocketAddr {
        "127.0.0.1:51001".parse().unwrap()
    }

    #[test]
    fn a_later_start_wins_and_so_does_a_renewal() {
        let machine = MachineId::generate();
        let first = MemberIdentity::fresh(machine.clone(), addr());
        let second = MemberIdentity::fresh(machine.clone(), addr());
        assert!(second.bump > first.bump);
        assert!(second.win_addr_conflict(&first));
        assert!(!first.win_addr_conflict(&second));

        let renewed = first.renew().unwrap();
        assert_eq!(renewed.machine, machine);
        assert!(renewed.win_addr_conflict(&first));
        assert_eq!(renewed.addr(), first.addr());
    }

    #[test]
    fn equal_bumps_are_ordered_by_address() {
        let machine = MachineId::generate();
        let a = MemberIdentity {
            machine: machine.clone(),
            gossip: "127.0.0.1:1".parse().unwrap(),
            bump: 7,
        };
        let b = MemberIdentity {
            gossip: "127.0.0.1:2".parse().unwrap(),
            ..a.clone()
        };
        assert!(b.win_addr_conflict(&a));
        assert!(!a.win_addr_conflict(&b));
    }
}
