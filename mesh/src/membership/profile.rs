//! How eagerly membership probes, per kind of network.

use std::num::{NonZeroU32, NonZeroU8, NonZeroUsize};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The largest datagram membership sends or accepts. Gossip runs inside the WireGuard tunnel
/// (MTU 1420); 1200 bytes of payload plus the IPv6 and UDP headers stay under it with room to
/// spare, so a datagram is never fragmented.
pub(crate) const MAX_PACKET_SIZE: usize = 1200;

/// Which timing membership uses: the daemon's `[mesh] profile` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// Machines on one local network (or one data centre): round trips of a few milliseconds.
    ///
    /// Tuned so a stopped Machine is observed `suspect` and then `down` within 5 s, while a
    /// link losing 20% of datagrams with 50 ms of one-way delay yields no false `down`. Starting
    /// from foca's LAN configuration (memberlist's defaults):
    ///
    /// - **probe period 500 ms** (foca: 1 s). Detection takes: the wait until some observer
    ///   probes the stopped Machine (each observer probes one member per period, in a shuffled
    ///   round, so usually within a period, at worst a few), one period to conclude the probe
    ///   failed, `suspect_to_down_after`, and a gossip round (200 ms) for the other observers.
    ///   With 1 s periods that sum leaves too little of the 5 s for the suspicion to be refuted.
    /// - **probe rtt 200 ms** (foca: 500 ms): the direct ping's wait before asking others. A 50 ms
    ///   link is a 100 ms round trip; the indirect round (four 50 ms hops) then still ends within
    ///   the period (200 + 200 < 500 ms).
    /// - **3 indirect probes** (foca's value): a lost ping or ack is retried through up to three
    ///   other members, so a 20% lossy link rarely fails a whole probe.
    /// - **suspect_to_down_after 2.5 s** up to 10 Machines (foca: 4 s), growing like foca's with
    ///   log10 of the Cluster's size beyond (3.3 s for 20 Machines, 5 s for 100: news takes
    ///   longer to reach everyone). Five probe periods for the suspected Machine to hear the
    ///   suspicion and refute it: under 20% loss a refutation needs one of the several messages
    ///   it rides on (pings, acks, gossip every 200 ms, from every member that heard it) to
    ///   arrive, and all of them being lost for 2.5 s is vanishingly rare. Detection is then about
    ///   0.25 + 0.5 + 2.5 + 0.2 ≈ 3.5 s, and 4.7 s when the first probe comes late.
    /// - **max transmissions at least 8** (foca: 4 log10(n + 1), 2 for three Machines): each update
    ///   (a suspicion, its refutation, a down) rides on at least eight messages, so one lost
    ///   datagram cannot leave the suspected Machine unaware of the suspicion.
    ///
    /// foca's periodic gossip (200 ms), periodic announce (30 s) and announce to down members
    /// (65 s) are kept: they spread news between probes and let a healed partition find itself.
    #[default]
    Lan,
    /// Machines across the internet: foca's WAN configuration (memberlist's defaults), with
    /// 5 s probes, 3 s probe rtt and a suspicion of 6 s or more. A stopped Machine is observed
    /// down after some 15 to 20 s.
    Wan,
}

impl Profile {
    /// The profile's word, as the daemon's settings spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Lan => "lan",
            Profile::Wan => "wan",
        }
    }

    /// foca's configuration for a Cluster of `cluster_size` Machines (this one included).
    pub(crate) fn foca_config(self, cluster_size: NonZeroU32) -> foca::Config {
        let mut config = match self {
            Profile::Lan => {
                let mut config = foca::Config::new_lan(cluster_size);
                config.probe_period = Duration::from_millis(500);
                config.probe_rtt = Duration::from_millis(200);
                config.num_indirect_probes = NonZeroUsize::new(3).unwrap_or(NonZeroUsize::MIN);
                config.suspect_to_down_after =
                    Duration::from_secs_f64(2.5 * f64::from(cluster_size.get()).log10().max(1.0));
                config.max_transmissions = config
                    .max_transmissions
                    .max(NonZeroU8::new(8).unwrap_or(NonZeroU8::MIN));
                config
            }
            Profile::Wan => foca::Config::new_wan(cluster_size),
        };
        config.max_packet_size = NonZeroUsize::new(MAX_PACKET_SIZE).unwrap_or(NonZeroUsize::MIN);
        config
    }

    /// How often membership announces itself to the Machines it should know but does not
    /// observe up (bootstrap, a restarted peer, a healed partition).
    pub(crate) fn announce_interval(self) -> Duration {
        match self {
            Profile::Lan => Duration::from_secs(2),
            Profile::Wan => Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lan_detects_within_five_seconds_by_construction() {
        let config = Profile::Lan.foca_config(NonZeroU32::new(3).unwrap());
        // One period to reach the member, one to conclude, the suspicion, one gossip round.
        let detection = config.probe_period * 2
            + config.suspect_to_down_after
            + config
                .periodic_gossip
                .as_ref()
                .map(|g| g.frequency)
                .unwrap_or_default();
        assert!(detection < Duration::from_secs(5), "{detection:?}");
        assert!(config.probe_rtt * 2 < config.probe_period);
        assert!(config.max_transmissions.get() >= 8);
        assert_eq!(config.max_packet_size.get(), MAX_PACKET_SIZE);
        assert!(config.notify_down_members);
        assert!(config.periodic_announce.is_some());
        assert!(config.periodic_announce_to_down_members.is_some());
    }

    #[test]
    fn lan_suspicion_grows_slowly_with_the_cluster() {
        let suspicion = |n| {
            Profile::Lan
                .foca_config(NonZeroU32::new(n).unwrap())
                .suspect_to_down_after
        };
        assert_eq!(suspicion(1), Duration::from_millis(2500));
        assert_eq!(suspicion(10), Duration::from_millis(2500));
        assert_eq!(suspicion(100), Duration::from_secs(5));
        assert!(suspicion(20) > suspicion(10));
    }

    #[test]
    fn wan_is_foca_wan() {
        let size = NonZeroU32::new(10).unwrap();
        let ours = Profile::Wan.foca_config(size);
        let foca = foca::Config::new_wan(size);
        assert_eq!(ours.probe_period, foca.probe_period);
        assert_eq!(ours.suspect_to_down_after, foca.suspect_to_down_after);
    }
}
