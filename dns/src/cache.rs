//! The cache of forwarded answers: what an upstream answered, kept for its TTL and handed to
//! the next client asking the same question without asking again.
//!
//! - Kept per question (name, compared case-insensitively, type and class) and per what the
//!   client asked for that changes an answer (recursion desired, checking disabled, whether it
//!   spoke EDNS and set DO).
//! - Positive answers live for the smallest TTL of their records; negative ones (NXDOMAIN, or
//!   NOERROR without answers) for the SOA's TTL or its MINIMUM, whichever is smaller (RFC 2308),
//!   and are not kept without an SOA. SERVFAIL, REFUSED, truncated or unreadable replies are
//!   never kept, nor a TTL of 0. At most [`MAX_TTL`] (positive) or [`MAX_NEGATIVE_TTL`].
//! - A hit is the stored reply with the client's ID and question (its case, for clients that
//!   randomise it) and every TTL counted down by the seconds it has been kept.
//! - Bounded in entries: a full shard first drops what expired, then its oldest entry.
//!   Sharded, each shard behind its own lock held only to copy an entry in or out.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::wire::{self, Query, Rcode};

/// The longest a positive answer is kept, whatever its TTL says (a day, as Unbound).
pub const MAX_TTL: u32 = 86_400;
/// The longest a negative answer is kept (an hour, as Unbound).
pub const MAX_NEGATIVE_TTL: u32 = 3_600;

/// Shards of the cache (a power of two).
const SHARDS: usize = 16;

const RTYPE_SOA: u16 = 6;
const RTYPE_OPT: u16 = 41;
const HEADER_LEN: usize = 12;

/// The forward cache. `capacity` 0 keeps nothing.
#[derive(Debug)]
pub(crate) struct ForwardCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
    hasher: std::collections::hash_map::RandomState,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<Key, Entry>,
    /// Keys in insertion order, with the sequence number of that insertion (an entry replaced
    /// since has another), for dropping the oldest.
    order: VecDeque<(Key, u64)>,
    next_seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    /// The question section, its name lowercased.
    question: Box<[u8]>,
    /// RD, CD, EDNS and DO of the query.
    flags: u8,
}

/// Where each TTL field of a reply is (OPT records excluded), and what it said.
type TtlFields = Box<[(usize, u32)]>;

#[derive(Debug)]
struct Entry {
    reply: Box<[u8]>,
    ttls: TtlFields,
    stored: Instant,
    expires: Instant,
    seq: u64,
}

impl ForwardCache {
    /// A cache of at most about `capacity` entries.
    pub(crate) fn new(capacity: usize) -> ForwardCache {
        ForwardCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: Default::default(),
        }
    }

    fn key(q: &Query<'_>) -> Key {
        let mut question: Box<[u8]> = q.question.into();
        // Label lengths are below 64, so lowercasing touches letters only.
        question.make_ascii_lowercase();
        let flags = u8::from(q.rd)
            | u8::from(q.cd) << 1
            | u8::from(q.edns.is_some()) << 2
            | u8::from(q.edns.is_some_and(|e| e.dnssec_ok)) << 3;
        Key { question, flags }
    }

    fn shard(&self, key: &Key) -> &Mutex<Shard> {
        &self.shards[self.hasher.hash_one(key) as usize & (SHARDS - 1)]
    }

    /// Writes the kept answer to `q` into `out` (the client's ID and question, TTLs counted
    /// down) and returns true, or returns false when none is kept.
    pub(crate) fn answer(&self, q: &Query<'_>, out: &mut Vec<u8>) -> bool {
        if self.per_shard == 0 {
            return false;
        }
        let key = ForwardCache::key(q);
        let now = Instant::now();
        {
            let shard = self.shard(&key).lock().unwrap_or_else(|e| e.into_inner());
            let Some(entry) = shard.entries.get(&key).filter(|e| e.expires > now) else {
                return false;
            };
            out.clear();
            out.extend_from_slice(&entry.reply);
            let kept =
                u32::try_from(now.duration_since(entry.stored).as_secs()).unwrap_or(u32::MAX);
            for &(at, ttl) in entry.ttls.iter() {
                out[at..at + 4].copy_from_slice(&ttl.saturating_sub(kept).to_be_bytes());
            }
        }
        wire::set_id(out, q.id);
        out[HEADER_LEN..HEADER_LEN + q.question.len()].copy_from_slice(q.question);
        true
    }

    /// Keeps `reply`, the upstream's answer to `q`, when it may be kept (see the module).
    pub(crate) fn insert(&self, q: &Query<'_>, reply: &[u8]) {
        if self.per_shard == 0 {
            return;
        }
        let Some((ttls, lifetime)) = lifetime(reply) else {
            return;
        };
        let key = ForwardCache::key(q);
        let now = Instant::now();
        let mut shard = self.shard(&key).lock().unwrap_or_else(|e| e.into_inner());
        if shard.entries.len() >= self.per_shard && !shard.entries.contains_key(&key) {
            shard.entries.retain(|_, e| e.expires > now);
            while shard.entries.len() >= self.per_shard {
                let Some((old, seq)) = shard.order.pop_front() else {
                    break;
                };
                if shard.entries.get(&old).is_some_and(|e| e.seq == seq) {
                    shard.entries.remove(&old);
                }
            }
        }
        let seq = shard.next_seq;
        shard.next_seq += 1;
        shard.order.push_back((key.clone(), seq));
        shard.entries.insert(
            key,
            Entry {
                reply: reply.into(),
                ttls,
                stored: now,
                expires: now + Duration::from_secs(u64::from(lifetime)),
                seq,
            },
        );
        // The order queue holds superseded keys too; keep it from growing without bound.
        if shard.order.len() > 2 * self.per_shard + 16 {
            let live: Vec<(Key, u64)> = shard
                .order
                .iter()
                .filter(|(k, s)| shard.entries.get(k).is_some_and(|e| e.seq == *s))
                .cloned()
                .collect();
            shard.order = live.into();
        }
    }

    /// How many answers are kept now (expired ones not yet dropped included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).entries.len())
            .sum()
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes([
        *b.get(at)?,
        *b.get(at + 1)?,
        *b.get(at + 2)?,
        *b.get(at + 3)?,
    ]))
}

/// The offset past the (possibly compressed) name at `at`.
fn skip_name(b: &[u8], mut at: usize) -> Option<usize> {
    for _ in 0..128 {
        let len = *b.get(at)?;
        match len & 0xC0 {
            0x00 if len == 0 => return Some(at + 1),
            0x00 => at += 1 + usize::from(len),
            0xC0 => return (at + 2 <= b.len()).then_some(at + 2),
            _ => return None,
        }
    }
    None
}

/// Where the TTLs of a reply that may be kept are, and how long it may be kept; `None` for a
/// reply that may not (see the module).
fn lifetime(reply: &[u8]) -> Option<(TtlFields, u32)> {
    if reply.len() < HEADER_LEN || wire::is_truncated(reply) || be16(reply, 4)? != 1 {
        return None;
    }
    let rcode = Rcode::from_code(u16::from(wire::header_rcode(reply)));
    if !matches!(rcode, Some(Rcode::NoError | Rcode::NxDomain)) {
        return None;
    }
    let answers = be16(reply, 6)?;
    let authority = be16(reply, 8)?;
    let additional = be16(reply, 10)?;
    let mut at = skip_name(reply, HEADER_LEN)? + 4;
    let mut ttls = Vec::new();
    let mut smallest = u32::MAX;
    let mut soa: Option<u32> = None;
    for i in 0..u32::from(answers) + u32::from(authority) + u32::from(additional) {
        at = skip_name(reply, at)?;
        let rtype = be16(reply, at)?;
        let ttl = be32(reply, at + 4)?;
        let rdlen = usize::from(be16(reply, at + 8)?);
        let rdata = at + 10;
        if rdata + rdlen > reply.len() {
            return None;
        }
        if rtype != RTYPE_OPT {
            ttls.push((at + 4, ttl));
            smallest = smallest.min(ttl);
            let in_authority =
                i >= u32::from(answers) && i < u32::from(answers) + u32::from(authority);
            if rtype == RTYPE_SOA && in_authority {
                // MNAME, RNAME, then serial, refresh, retry, expire and MINIMUM.
                let fixed = skip_name(reply, skip_name(reply, rdata)?)?;
                let minimum = be32(reply, fixed + 16)?;
                soa = Some(ttl.min(minimum));
            }
        }
        at = rdata + rdlen;
    }
    if at != reply.len() {
        return None;
    }
    let negative = rcode == Some(Rcode::NxDomain) || answers == 0;
    let lifetime = if negative {
        soa?.min(MAX_NEGATIVE_TTL)
    } else {
        smallest.min(MAX_TTL)
    };
    (lifetime > 0).then_some((ttls.into(), lifetime))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::query;

    /// A reply to `q` (a query packet) with `rcode`, answer A records (address, TTL) and an
    /// optional authority SOA (TTL, MINIMUM), names compressed to the question.
    fn reply(q: &[u8], rcode: u8, answers: &[([u8; 4], u32)], soa: Option<(u32, u32)>) -> Vec<u8> {
        let parsed = wire::parse_query(q).unwrap();
        let mut r = Vec::new();
        r.extend_from_slice(&q[..2]);
        r.extend_from_slice(&[0x81, 0x80 | rcode]);
        r.extend_from_slice(&1u16.to_be_bytes());
        r.extend_from_slice(&(answers.len() as u16).to_be_bytes());
        r.extend_from_slice(&u16::from(soa.is_some()).to_be_bytes());
        r.extend_from_slice(&0u16.to_be_bytes());
        r.extend_from_slice(parsed.question);
        for (addr, ttl) in answers {
            r.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1]);
            r.extend_from_slice(&ttl.to_be_bytes());
            r.extend_from_slice(&4u16.to_be_bytes());
            r.extend_from_slice(addr);
        }
        if let Some((ttl, minimum)) = soa {
            r.extend_from_slice(&[0xC0, 12, 0, 6, 0, 1]);
            r.extend_from_slice(&ttl.to_be_bytes());
            let mut rdata = vec![0xC0, 12, 0xC0, 12];
            for v in [1u32, 7200, 3600, 1_209_600, minimum] {
                rdata.extend_from_slice(&v.to_be_bytes());
            }
            r.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
            r.extend_from_slice(&rdata);
        }
        r
    }

    fn ttls_of(packet: &[u8]) -> Vec<u32> {
        lifetime(packet)
            .map(|(t, _)| t.iter().map(|(at, _)| be32(packet, *at).unwrap()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn positive_answers_live_for_their_smallest_ttl_and_negative_ones_for_the_soa() {
        let q = query(1, "www.example.com", 1, None);
        let r = reply(&q, 0, &[([192, 0, 2, 1], 300), ([192, 0, 2, 2], 60)], None);
        assert_eq!(lifetime(&r).map(|l| l.1), Some(60));
        let r = reply(&q, 0, &[([192, 0, 2, 1], 10 * MAX_TTL)], None);
        assert_eq!(lifetime(&r).map(|l| l.1), Some(MAX_TTL));
        // NXDOMAIN: the smaller of the SOA's TTL and MINIMUM; without an SOA, not kept.
        let r = reply(&q, 3, &[], Some((900, 120)));
        assert_eq!(lifetime(&r).map(|l| l.1), Some(120));
        let r = reply(&q, 3, &[], Some((30, 120)));
        assert_eq!(lifetime(&r).map(|l| l.1), Some(30));
        let r = reply(&q, 3, &[], Some((86_400, 86_400)));
        assert_eq!(lifetime(&r).map(|l| l.1), Some(MAX_NEGATIVE_TTL));
        assert!(lifetime(&reply(&q, 3, &[], None)).is_none());
        // NODATA is negative too.
        assert_eq!(
            lifetime(&reply(&q, 0, &[], Some((50, 70)))).map(|l| l.1),
            Some(50)
        );
        // Never kept: SERVFAIL, REFUSED, TTL 0, truncated, cut short.
        assert!(lifetime(&reply(&q, 2, &[([192, 0, 2, 1], 300)], None)).is_none());
        assert!(lifetime(&reply(&q, 5, &[([192, 0, 2, 1], 300)], None)).is_none());
        assert!(lifetime(&reply(&q, 0, &[([192, 0, 2, 1], 0)], None)).is_none());
        let mut tc = reply(&q, 0, &[([192, 0, 2, 1], 300)], None);
        wire::set_truncated(&mut tc);
        assert!(lifetime(&tc).is_none());
        let whole = reply(&q, 0, &[([192, 0, 2, 1], 300)], None);
        assert!(lifetime(&whole[..whole.len() - 1]).is_none());
    }

    #[test]
    fn a_hit_carries_the_clients_id_and_case_and_counted_down_ttls() {
        let cache = ForwardCache::new(100);
        let asked = query(7, "www.example.com", 1, None);
        let q = wire::parse_query(&asked).unwrap();
        let mut out = Vec::new();
        assert!(!cache.answer(&q, &mut out));
        let r = reply(&asked, 0, &[([192, 0, 2, 1], 300)], None);
        cache.insert(&q, &r);
        // Another client, another ID, the name in other case.
        let again = query(9, "WwW.ExAmple.COM", 1, None);
        let q2 = wire::parse_query(&again).unwrap();
        assert!(cache.answer(&q2, &mut out));
        assert_eq!(&out[..2], &9u16.to_be_bytes());
        assert_eq!(
            &out[HEADER_LEN..HEADER_LEN + q2.question.len()],
            q2.question
        );
        assert_eq!(
            &out[HEADER_LEN + q2.question.len()..],
            &r[HEADER_LEN + q.question.len()..]
        );
        // Counted down: an entry stored 100 s ago answers 200.
        {
            let key = ForwardCache::key(&q);
            let mut shard = cache.shard(&key).lock().unwrap();
            shard.entries.get_mut(&key).unwrap().stored -= Duration::from_secs(100);
        }
        assert!(cache.answer(&q2, &mut out));
        assert_eq!(ttls_of(&out), vec![200]);
        // Expired: no answer.
        {
            let key = ForwardCache::key(&q);
            let mut shard = cache.shard(&key).lock().unwrap();
            shard.entries.get_mut(&key).unwrap().expires = Instant::now();
        }
        assert!(!cache.answer(&q2, &mut out));
    }

    #[test]
    fn answers_are_kept_per_type_and_per_edns_and_do() {
        let cache = ForwardCache::new(100);
        let a = query(1, "example.com", 1, None);
        let qa = wire::parse_query(&a).unwrap();
        cache.insert(&qa, &reply(&a, 0, &[([192, 0, 2, 1], 300)], None));
        let mut out = Vec::new();
        for other in [
            query(1, "example.com", 28, None),
            query(1, "example.com", 1, Some(1232)),
            query(1, "example.org", 1, None),
        ] {
            let q = wire::parse_query(&other).unwrap();
            assert!(!cache.answer(&q, &mut out), "{other:?}");
        }
        assert!(cache.answer(&qa, &mut out));
    }

    #[test]
    fn a_full_cache_drops_the_expired_then_the_oldest() {
        let cache = ForwardCache::new(SHARDS * 4);
        for i in 0..1000u32 {
            let name = format!("host{i}.example.com");
            let p = query(1, &name, 1, None);
            let q = wire::parse_query(&p).unwrap();
            cache.insert(&q, &reply(&p, 0, &[([192, 0, 2, 1], 300)], None));
            assert!(cache.len() <= SHARDS * 4, "{} entries", cache.len());
        }
        // The newest is kept.
        let p = query(1, "host999.example.com", 1, None);
        let mut out = Vec::new();
        assert!(cache.answer(&wire::parse_query(&p).unwrap(), &mut out));
        // Nothing is kept with no room at all.
        let none = ForwardCache::new(0);
        none.insert(
            &wire::parse_query(&p).unwrap(),
            &reply(&p, 0, &[([192, 0, 2, 1], 300)], None),
        );
        assert!(!none.answer(&wire::parse_query(&p).unwrap(), &mut out));
    }
}
