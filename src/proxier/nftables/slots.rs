//! Where a policy chain's endpoints live: a slot of draws in one of the table's shared endpoint
//! maps. A chain without session affinity DNATs through `numgen random mod DRAWS offset O map
//! @endpoints-PROTO-N`, each endpoint owning an interval of the slot's draws. Its rule names
//! only the slot, so a change of endpoints changes map elements and no rule: the kernel
//! validates the whole table at a commit that adds a NAT rule (most of a one-endpoint change at
//! 10,000 services), and not at one that only changes a data map's elements.
//!
//! The maps are shared (a map of its own per chain is quadratic in the kernel, which finds a
//! set by name by walking the table's list of sets), and sharded (a map's every element add
//! checks every rule bound to it). A chain's slot is its name's hash, so a restarted daemon
//! places every chain where the earlier run did without reading anything; the rare chain whose
//! slot another chain holds keeps upstream's anonymous map instead.

use std::collections::HashMap;

/// How many values a policy chain's `numgen` draws from: each endpoint gets an equal share of
/// them, to within one draw in 16,384.
pub const DRAWS: u32 = 16_384;
/// Endpoint maps per transport protocol, in each family's table.
pub const MAPS_PER_PROTOCOL: u32 = 64;
/// Slots per map: an interval's end is its last draw plus one, which must fit in 32 bits.
const SLOTS_PER_MAP: u32 = u32::MAX / DRAWS;
/// The protocols with endpoint maps (a map's data type names its transport header).
pub const PROTOCOLS: [&str; 3] = ["tcp", "udp", "sctp"];

/// The name of endpoint map `index` of `protocol`.
pub fn map_name(protocol: &str, index: u32) -> String {
    format!("endpoints-{protocol}-{index}")
}

/// Whether a set of our table is one of the endpoint maps.
pub fn is_endpoint_map(name: &str) -> bool {
    name.strip_prefix("endpoints-")
        .and_then(|rest| rest.split_once('-'))
        .is_some_and(|(protocol, index)| {
            PROTOCOLS.contains(&protocol) && index.parse::<u32>().is_ok()
        })
}

/// A chain's place: the map and the first of its draws there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub map: String,
    pub offset: u32,
}

/// A slot of one protocol's maps, as one number (protocol, map, slot).
type SlotKey = u64;

/// A slot held: its key and its holder (kept with the holder's objects).
pub type Claim = (u64, u64);

/// A chain, as the 64-bit hash of its name (two of a node's chains sharing one is as likely as
/// one in 10^11 at 10,000 services).
type Holder = u64;

/// FNV-1a of a chain's name: stable across builds and releases, as a restart needs.
fn name_hash(chain: &str) -> u64 {
    chain.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The slot `chain`'s name hashes to among `protocol`'s maps, and that slot's place.
fn home(protocol: &str, chain: &str) -> Option<(SlotKey, Placement)> {
    let protocol_index = PROTOCOLS.iter().position(|p| *p == protocol)?;
    let hash = name_hash(chain);
    let map = ((hash >> 32) % u64::from(MAPS_PER_PROTOCOL)) as u32;
    let slot = ((hash & 0xffff_ffff) % u64::from(SLOTS_PER_MAP)) as u32;
    let key = (protocol_index as u64) << 56 | u64::from(map) << 32 | u64::from(slot);
    Some((
        key,
        Placement {
            map: map_name(protocol, map),
            offset: slot * DRAWS,
        },
    ))
}

/// Which chain holds which slot, in one family's table.
#[derive(Clone, Debug, Default)]
pub struct SlotTable {
    holders: HashMap<SlotKey, Holder>,
}

impl SlotTable {
    /// The table of these claims.
    pub fn of<'a>(claims: impl IntoIterator<Item = &'a [Claim]>) -> Self {
        let mut table = SlotTable::default();
        for claims in claims {
            table.add(claims);
        }
        table
    }

    /// `chain`'s slot among `protocol`'s maps, taken for it, and the claim to keep with it;
    /// `None` when another chain holds it (or the protocol has no maps).
    pub fn claim(&mut self, protocol: &str, chain: &str) -> Option<(Placement, Claim)> {
        let (key, placement) = home(protocol, chain)?;
        let me = name_hash(chain);
        if *self.holders.entry(key).or_insert(me) != me {
            return None;
        }
        Some((placement, (key, me)))
    }

    /// Records `claims`.
    pub fn add(&mut self, claims: &[Claim]) {
        for (key, holder) in claims {
            self.holders.insert(*key, *holder);
        }
    }

    /// Frees the slots of `claims` (those their holders still hold).
    pub fn release(&mut self, claims: &[Claim]) {
        for (key, holder) in claims {
            if self.holders.get(key) == Some(holder) {
                self.holders.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_is_placed_by_its_name_alone_and_a_taken_slot_is_refused() {
        let chain = "service-ULMVA6XW-ns1/svc1/tcp/p80";
        let mut table = SlotTable::default();
        let (placed, claim) = table.claim("tcp", chain).unwrap();
        // The same name, the same place, in any table (a restart needs no reading).
        let again = SlotTable::default().claim("tcp", chain).unwrap();
        assert_eq!((placed.clone(), claim), again);
        assert!(placed.offset.is_multiple_of(DRAWS));
        assert!(u64::from(placed.offset) + u64::from(DRAWS) <= u64::from(u32::MAX));
        assert!(is_endpoint_map(&placed.map), "{}", placed.map);
        // Its own slot again: granted. Another chain hashing to it: refused until it is free.
        assert_eq!(table.claim("tcp", chain), Some((placed, claim)));
        let key = claim.0;
        let other = [(key, name_hash("someone-else"))];
        table.release(&[claim]);
        table.add(&other);
        assert_eq!(table.claim("tcp", chain), None);
        table.release(&other);
        assert!(table.claim("tcp", chain).is_some());
        // Releasing what another chain holds frees nothing.
        table.release(&other);
        assert_eq!(
            SlotTable::of([&[claim][..]]).holders.get(&key),
            Some(&name_hash(chain))
        );
        assert_eq!(home("icmp", chain), None);
        assert!(!is_endpoint_map("endpoints-tcp-x") && !is_endpoint_map("service-ips"));
    }

    #[test]
    fn ten_thousand_chains_spread_over_the_maps_and_rarely_collide() {
        let mut table = SlotTable::default();
        let mut per_map: HashMap<String, usize> = HashMap::new();
        let mut refused = 0;
        for index in 0..10_000 {
            let chain = format!("service-{index:08}-ns/svc-{index}/tcp/p80");
            match table.claim("tcp", &chain) {
                Some((placement, _)) => *per_map.entry(placement.map).or_default() += 1,
                None => refused += 1,
            }
        }
        assert_eq!(per_map.len(), MAPS_PER_PROTOCOL as usize);
        assert!(per_map.values().all(|n| *n < 300), "{per_map:?}");
        assert!(refused < 10, "{refused}");
    }
}
