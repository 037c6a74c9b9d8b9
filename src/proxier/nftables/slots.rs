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
//! places every chain where the earlier run did without reading anything. Of chains whose
//! names hash to one slot (about 3 in 10,000), the one with the smallest hash holds it, however
//! they came, and the others keep upstream's anonymous map: a restart decides as the running
//! daemon did. A newcomer that wins a slot evicts its holder, whose service is rewritten in the
//! same transaction (see [`SlotTable::take_evicted`]).

use std::collections::{BTreeSet, HashMap};

use crate::model::NamespacedName;

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
pub type SlotKey = u64;

/// A chain, as the 64-bit hash of its name (two of a node's chains sharing one is as likely as
/// one in 10^11 at 10,000 services).
type Holder = u64;

/// A service, as the hash of its `namespace/name` (which service an eviction concerns).
type ServiceTag = u64;

/// A slot held: its key, its holder and the holder's service (kept with the holder's objects).
pub type Claim = (SlotKey, Holder, ServiceTag);

/// A chain's name, hashed the same way in every build and release, as a restart needs:
/// FNV-1a, 64 bits.
pub(crate) fn name_hash(chain: &str) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    chain.bytes().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

fn service_tag(service: &NamespacedName) -> ServiceTag {
    name_hash(&format!("{}/{}", service.namespace, service.name))
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

/// The endpoint map of a slot, as one number (protocol, map).
pub fn map_id(key: SlotKey) -> u32 {
    (key >> 32) as u32
}

/// The name of the endpoint map [`map_id`] numbers.
pub fn map_named(id: u32) -> String {
    let protocol = PROTOCOLS[((id >> 24) as usize).min(PROTOCOLS.len() - 1)];
    map_name(protocol, id & 0x00ff_ffff)
}

/// The endpoint maps these claims hold slots in.
pub fn maps_of<'a>(claims: impl IntoIterator<Item = &'a Claim>) -> BTreeSet<String> {
    let ids: BTreeSet<u32> = claims.into_iter().map(|(key, _, _)| map_id(*key)).collect();
    ids.into_iter().map(map_named).collect()
}

/// Which chain holds which slot, in one family's table.
#[derive(Clone, Debug, Default)]
pub struct SlotTable {
    /// Each slot's holder and the holder's service.
    holders: HashMap<SlotKey, (Holder, ServiceTag)>,
    /// How many slots are held in each endpoint map (by [`map_id`]): the table declares a map
    /// while it holds one.
    held_per_map: HashMap<u32, usize>,
    /// Services whose chain lost its slot to a newcomer since the last look.
    evicted: Vec<ServiceTag>,
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

    /// `chain`'s (of `service`) slot among `protocol`'s maps, taken for it, and the claim to
    /// keep with it; `None` when a chain with a smaller hash holds it (or the protocol has no
    /// maps). A holder with a larger hash is evicted: its service must be rendered again.
    pub fn claim(
        &mut self,
        protocol: &str,
        chain: &str,
        service: &NamespacedName,
    ) -> Option<(Placement, Claim)> {
        let (key, placement) = home(protocol, chain)?;
        let me = name_hash(chain);
        match self.holders.get(&key) {
            Some((holder, _)) if *holder < me => return None,
            Some((holder, loser)) if *holder > me => self.evicted.push(*loser),
            _ => {}
        }
        let tag = service_tag(service);
        self.hold(key, (me, tag));
        Some((placement, (key, me, tag)))
    }

    /// Those of `services` whose chains were evicted since the last call: rendered again, they
    /// do without the slot.
    pub fn take_evicted<'a>(
        &mut self,
        services: impl IntoIterator<Item = &'a NamespacedName>,
    ) -> Vec<&'a NamespacedName> {
        let evicted = std::mem::take(&mut self.evicted);
        if evicted.is_empty() {
            return Vec::new();
        }
        services
            .into_iter()
            .filter(|service| evicted.contains(&service_tag(service)))
            .collect()
    }

    /// Takes in what `other`, a copy of this table, granted while services rendered on
    /// another thread: `claims` (of its services), settled against this table's as
    /// [`SlotTable::claim`] settles them (the smaller hash holds; a loser's service is
    /// evicted), and the evictions it made.
    pub fn merge<'a>(&mut self, other: SlotTable, claims: impl IntoIterator<Item = &'a [Claim]>) {
        self.evicted.extend(other.evicted);
        for (key, holder, service) in claims.into_iter().flatten() {
            match self.holders.get(key) {
                Some((held, _)) if held == holder => {}
                Some((held, _)) if held < holder => self.evicted.push(*service),
                Some((_, loser)) => {
                    self.evicted.push(*loser);
                    self.hold(*key, (*holder, *service));
                }
                None => {
                    self.hold(*key, (*holder, *service));
                }
            }
        }
    }

    /// The endpoint maps a chain holds a slot in: the only ones the table declares.
    pub fn maps_in_use(&self) -> BTreeSet<String> {
        self.held_per_map.keys().map(|id| map_named(*id)).collect()
    }

    /// How many slots are held in the map of slot `key`.
    pub fn held_in_map_of(&self, key: SlotKey) -> usize {
        self.held_per_map.get(&map_id(key)).copied().unwrap_or(0)
    }

    /// Whether `claim` is held by its holder.
    pub fn holds(&self, claim: &Claim) -> bool {
        self.holders
            .get(&claim.0)
            .is_some_and(|(h, _)| *h == claim.1)
    }

    fn hold(&mut self, key: SlotKey, holder: (Holder, ServiceTag)) {
        if self.holders.insert(key, holder).is_none() {
            *self.held_per_map.entry(map_id(key)).or_default() += 1;
        }
    }

    fn unhold(&mut self, key: SlotKey) {
        if self.holders.remove(&key).is_some()
            && let Some(count) = self.held_per_map.get_mut(&map_id(key))
        {
            *count -= 1;
            if *count == 0 {
                self.held_per_map.remove(&map_id(key));
            }
        }
    }

    /// Records `claims`.
    pub fn add(&mut self, claims: &[Claim]) {
        for (key, holder, service) in claims {
            self.hold(*key, (*holder, *service));
        }
    }

    /// Frees the slots of `claims` (those their holders still hold).
    pub fn release(&mut self, claims: &[Claim]) {
        for (key, holder, _) in claims {
            if self.holders.get(key).is_some_and(|(h, _)| h == holder) {
                self.unhold(*key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_is_in_use_while_a_slot_in_it_is_held() {
        let service = NamespacedName::new("ns1", "svc1");
        let mut table = SlotTable::default();
        let (placed, claim) = table.claim("tcp", "chain-a", &service).unwrap();
        assert_eq!(table.maps_in_use(), BTreeSet::from([placed.map.clone()]));
        assert_eq!(table.held_in_map_of(claim.0), 1);
        assert!(table.holds(&claim));
        // Claimed again by its holder, and merged from a copy: still one slot held.
        table.claim("tcp", "chain-a", &service);
        let copy = table.clone();
        table.merge(copy, [std::slice::from_ref(&claim)]);
        assert_eq!(table.held_in_map_of(claim.0), 1);
        table.release(&[claim]);
        assert!(table.maps_in_use().is_empty());
        assert_eq!(table.held_in_map_of(claim.0), 0);
        assert!(!table.holds(&claim));
    }

    #[test]
    fn names_hash_as_the_published_fnv_1a() {
        // From the FNV authors' test vectors.
        assert_eq!(name_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(name_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(name_hash("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn a_chain_is_placed_by_its_name_alone_and_the_smaller_hash_holds_a_slot() {
        let chain = "service-ULMVA6XW-ns1/svc1/tcp/p80";
        let service = NamespacedName::new("ns1", "svc1");
        let mut table = SlotTable::default();
        let (placed, claim) = table.claim("tcp", chain, &service).unwrap();
        // The same name, the same place, in any table (a restart needs no reading).
        let again = SlotTable::default().claim("tcp", chain, &service).unwrap();
        assert_eq!((placed.clone(), claim), again);
        assert!(placed.offset.is_multiple_of(DRAWS));
        assert!(u64::from(placed.offset) + u64::from(DRAWS) <= u64::from(u32::MAX));
        assert!(is_endpoint_map(&placed.map), "{}", placed.map);
        // Its own slot again: granted, nobody evicted.
        assert_eq!(table.claim("tcp", chain, &service), Some((placed, claim)));
        assert!(table.take_evicted([&service]).is_empty());
        // A holder with a smaller hash keeps the slot; one with a larger hash is evicted.
        let key = claim.0;
        table.add(&[(key, 0, 7)]);
        assert_eq!(table.claim("tcp", chain, &service), None);
        table.release(&[(key, 0, 7)]);
        let other = NamespacedName::new("ns9", "svc9");
        table.add(&[(key, u64::MAX, service_tag(&other))]);
        assert!(table.claim("tcp", chain, &service).is_some());
        assert_eq!(table.take_evicted([&service, &other]), [&other]);
        // Releasing what another chain holds frees nothing.
        table.release(&[(key, u64::MAX, service_tag(&other))]);
        assert_eq!(
            SlotTable::of([&[claim][..]]).holders.get(&key),
            Some(&(name_hash(chain), service_tag(&service)))
        );
        assert_eq!(home("icmp", chain), None);
        assert!(!is_endpoint_map("endpoints-tcp-x") && !is_endpoint_map("service-ips"));
    }

    #[test]
    fn tables_filled_apart_merge_as_if_filled_in_one() {
        let (a, b) = (
            NamespacedName::new("ns1", "a"),
            NamespacedName::new("ns2", "b"),
        );
        let chain = "service-ULMVA6XW-ns1/svc1/tcp/p80";
        let (_, claim) = SlotTable::default().claim("tcp", chain, &a).unwrap();
        let key = claim.0;
        // The other table granted the slot to a chain with a larger hash: it loses.
        let mut table = SlotTable::default();
        table.claim("tcp", chain, &a).unwrap();
        let larger = (key, u64::MAX, service_tag(&b));
        table.merge(SlotTable::default(), [&[larger][..]]);
        assert_eq!(table.take_evicted([&a, &b]), [&b]);
        assert_eq!(table.holders[&key].1, service_tag(&a));
        // ... to one with a smaller hash: it wins, and this table's holder is evicted.
        let smaller = (key, 0, service_tag(&b));
        table.merge(SlotTable::default(), [&[smaller][..]]);
        assert_eq!(table.take_evicted([&a, &b]), [&a]);
        assert_eq!(table.holders[&key], (0, service_tag(&b)));
        // The same claim in both: nothing changes. Evictions the other table made come along.
        let mut other = table.clone();
        other.evicted.push(service_tag(&a));
        table.merge(other, [&[smaller][..]]);
        assert_eq!(table.take_evicted([&a, &b]), [&a]);
        assert_eq!(table.holders[&key], (0, service_tag(&b)));
    }

    #[test]
    fn ten_thousand_chains_spread_over_the_maps_and_rarely_collide() {
        let mut table = SlotTable::default();
        let mut per_map: HashMap<String, usize> = HashMap::new();
        let mut refused = 0;
        for index in 0..10_000 {
            let chain = format!("service-{index:08}-ns/svc-{index}/tcp/p80");
            match table.claim(
                "tcp",
                &chain,
                &NamespacedName::new("ns", format!("svc-{index}")),
            ) {
                Some((placement, _)) => *per_map.entry(placement.map).or_default() += 1,
                None => refused += 1,
            }
            refused += std::mem::take(&mut table.evicted).len();
        }
        assert_eq!(per_map.len(), MAPS_PER_PROTOCOL as usize);
        assert!(per_map.values().all(|n| *n < 300), "{per_map:?}");
        assert!(refused < 10, "{refused}");
    }
}
