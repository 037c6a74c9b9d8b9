//! A map kept as a sorted vector, for the small maps every service carries (its ports, its
//! endpoints by port, its slices). A `BTreeMap` allocates a whole node for eleven entries even
//! when it holds one: with a service port as the value that was 3 KB per service, 30 MB per copy
//! of 10,000 services. Lookups are binary searches; iteration is in key order, as a BTreeMap's.

use std::borrow::Borrow;

/// A sorted-vector map with the part of `BTreeMap`'s interface this program uses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VecMap<K, V> {
    entries: Vec<(K, V)>,
}

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        VecMap {
            entries: Vec::new(),
        }
    }
}

impl<K: Ord, V> VecMap<K, V> {
    pub fn new() -> Self {
        VecMap::default()
    }

    fn position<Q>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.entries.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    /// Inserts `value` under `key`, returning the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.position(&key) {
            Ok(index) => Some(std::mem::replace(&mut self.entries[index].1, value)),
            Err(index) => {
                self.entries.insert(index, (key, value));
                None
            }
        }
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).ok().map(|index| &self.entries[index].1)
    }

    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key)
            .ok()
            .map(|index| &mut self.entries[index].1)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).is_ok()
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key)
            .ok()
            .map(|index| self.entries.remove(index).1)
    }

    /// The value under `key`, inserted with `make` when there is none.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let index = match self.position(&key) {
            Ok(index) => index,
            Err(index) => {
                self.entries.insert(index, (key, make()));
                index
            }
        };
        &mut self.entries[index].1
    }

    /// The value under `key`, inserted by `make` if missing; `key` is copied only then.
    pub fn get_or_insert_by_ref<Q>(&mut self, key: &Q, make: impl FnOnce() -> V) -> &mut V
    where
        K: Borrow<Q>,
        Q: Ord + ToOwned<Owned = K> + ?Sized,
    {
        let index = match self.position(key) {
            Ok(index) => index,
            Err(index) => {
                self.entries.insert(index, (key.to_owned(), make()));
                index
            }
        };
        &mut self.entries[index].1
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> + ExactSizeIterator {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub fn iter_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = (&K, &mut V)> + ExactSizeIterator {
        self.entries.iter_mut().map(|(k, v)| (&*k, v))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator {
        self.entries.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.entries.iter().map(|(_, v)| v)
    }

    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut V> + ExactSizeIterator {
        self.entries.iter_mut().map(|(_, v)| v)
    }

    /// Gives back unused capacity (maps that stay in memory for long).
    pub fn shrink_to_fit(&mut self) {
        self.entries.shrink_to_fit();
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for VecMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(items: I) -> Self {
        let mut entries: Vec<(K, V)> = items.into_iter().collect();
        // Stable sort, then keep the last of equal keys, as repeated inserts would.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut deduplicated: Vec<(K, V)> = Vec::with_capacity(entries.len());
        for entry in entries {
            match deduplicated.last_mut() {
                Some(last) if last.0 == entry.0 => *last = entry,
                _ => deduplicated.push(entry),
            }
        }
        VecMap {
            entries: deduplicated,
        }
    }
}

impl<K: Ord, V> Extend<(K, V)> for VecMap<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, items: I) {
        for (key, value) in items {
            self.insert(key, value);
        }
    }
}

impl<K: Ord, V, const N: usize> From<[(K, V); N]> for VecMap<K, V> {
    fn from(items: [(K, V); N]) -> Self {
        items.into_iter().collect()
    }
}

impl<K: Ord + Borrow<Q>, Q: Ord + ?Sized, V> std::ops::Index<&Q> for VecMap<K, V> {
    type Output = V;

    /// Panics when `key` is absent, as a BTreeMap's index does (tests use it).
    fn index(&self, key: &Q) -> &V {
        match self.get(key) {
            Some(value) => value,
            None => panic!("no entry for the key in the map"),
        }
    }
}

impl<K, V> IntoIterator for VecMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<'a, K, V> IntoIterator for &'a VecMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_a_sorted_map() {
        let mut map = VecMap::new();
        assert_eq!(map.insert("b", 2), None);
        assert_eq!(map.insert("a", 1), None);
        assert_eq!(map.insert("c", 3), None);
        assert_eq!(map.insert("b", 20), Some(2));
        assert_eq!(map.keys().copied().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(map.get("b"), Some(&20));
        assert!(map.contains_key("c") && !map.contains_key("d"));
        assert_eq!(map.remove("a"), Some(1));
        assert_eq!(map.len(), 2);
        *map.get_or_insert_with("d", || 0) += 4;
        assert_eq!(map.get("d"), Some(&4));
        let mut owned: VecMap<String, i32> = VecMap::new();
        *owned.get_or_insert_by_ref("k", || 1) += 1;
        *owned.get_or_insert_by_ref("k", || 100) += 1;
        assert_eq!(owned.get("k"), Some(&3));
        assert_eq!(owned.len(), 1);
        let collected: VecMap<&str, i32> = [("z", 1), ("y", 2), ("z", 3)].into_iter().collect();
        assert_eq!(
            collected.iter().collect::<Vec<_>>(),
            [(&"y", &2), (&"z", &3)]
        );
    }
}
