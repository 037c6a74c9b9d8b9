//! The elements of one set or map as this program keeps them: sorted by key, each element's key
//! and the rest of its text (` comment "ns/svc:p" : goto chain`, or empty) in one allocation.
//! A service holds tens of them (hairpin pairs, its slot's shares of an endpoint map), so at
//! 10,000 services a pair of `String`s per element cost 7 MB more than this.

use std::cmp::Ordering;
use std::fmt;

/// Separates an element's key from the rest of its text (never in either).
const SEPARATOR: char = '\0';

/// Elements of one set or map, by key (`172.30.0.41 . tcp . 80`), each with the rest of its
/// text.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Elements {
    /// `KEY\0REST`, sorted by key.
    entries: Vec<Box<str>>,
}

fn split(entry: &str) -> (&str, &str) {
    entry.split_once(SEPARATOR).unwrap_or((entry, ""))
}

/// How the key of `entry` compares with `key`, without looking for the separator: a key never
/// holds it, so where the entry's key ends the entry holds it (or ends).
fn compare_key(entry: &str, key: &str) -> Ordering {
    let (entry, key) = (entry.as_bytes(), key.as_bytes());
    let shared = entry.len().min(key.len());
    match entry[..shared].cmp(&key[..shared]) {
        Ordering::Equal if shared < key.len() => Ordering::Less,
        Ordering::Equal => match entry.get(shared) {
            None | Some(0) => Ordering::Equal,
            Some(_) => Ordering::Greater,
        },
        unequal => unequal,
    }
}

impl Elements {
    fn position(&self, key: &str) -> Result<usize, usize> {
        self.entries
            .binary_search_by(|entry| compare_key(entry, key))
    }

    /// Adds or replaces the element `key`.
    pub fn insert(&mut self, key: &str, rest: &str) {
        let mut entry = String::with_capacity(key.len() + 1 + rest.len());
        entry.push_str(key);
        entry.push(SEPARATOR);
        entry.push_str(rest);
        let entry = entry.into_boxed_str();
        match self.position(key) {
            Ok(index) => self.entries[index] = entry,
            Err(index) => self.entries.insert(index, entry),
        }
    }

    /// The rest of the text of element `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        let index = self.position(key).ok()?;
        Some(split(&self.entries[index]).1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    /// Each element's key and rest, in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&str, &str)> + ExactSizeIterator {
        self.entries.iter().map(|entry| split(entry))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &str> + ExactSizeIterator {
        self.iter().map(|(key, _)| key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn shrink_to_fit(&mut self) {
        self.entries.shrink_to_fit();
    }
}

impl<K: AsRef<str>, R: AsRef<str>> FromIterator<(K, R)> for Elements {
    fn from_iter<I: IntoIterator<Item = (K, R)>>(items: I) -> Self {
        let mut elements = Elements::default();
        elements.extend(items);
        elements
    }
}

impl<K: AsRef<str>, R: AsRef<str>> Extend<(K, R)> for Elements {
    fn extend<I: IntoIterator<Item = (K, R)>>(&mut self, items: I) {
        for (key, rest) in items {
            self.insert(key.as_ref(), rest.as_ref());
        }
    }
}

impl<'a> IntoIterator for &'a Elements {
    type Item = (&'a str, &'a str);
    type IntoIter =
        std::iter::Map<std::slice::Iter<'a, Box<str>>, fn(&'a Box<str>) -> (&'a str, &'a str)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|entry| split(entry))
    }
}

impl fmt::Debug for Elements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_as_split_keys_do() {
        let keys = [
            "",
            "1",
            "10",
            "10.0.0.1",
            "10.0.0.1 . tcp . 80",
            "10.0.0.2",
            "9",
            "a",
        ];
        for entry_key in keys {
            for rest in ["", " : goto x", "\0"] {
                let entry = format!("{entry_key}{SEPARATOR}{rest}");
                for key in keys {
                    assert_eq!(
                        compare_key(&entry, key),
                        entry_key.cmp(key),
                        "{entry:?} against {key:?}"
                    );
                }
            }
        }
        assert_eq!(compare_key("10", "10"), Ordering::Equal);
        assert_eq!(compare_key("10", "1"), Ordering::Greater);
    }

    #[test]
    fn elements_keep_key_order_and_replace_by_key() {
        let mut elements = Elements::default();
        elements.insert("10.0.0.2 . tcp . 80", " : goto b");
        elements.insert("10.0.0.1 . tcp . 80", " : goto a");
        elements.insert("10.0.0.3", "");
        elements.insert("10.0.0.2 . tcp . 80", " : goto c");
        assert_eq!(
            elements.iter().collect::<Vec<_>>(),
            [
                ("10.0.0.1 . tcp . 80", " : goto a"),
                ("10.0.0.2 . tcp . 80", " : goto c"),
                ("10.0.0.3", ""),
            ]
        );
        assert_eq!(elements.get("10.0.0.3"), Some(""));
        assert_eq!(elements.get("10.0.0.4"), None);
        assert!(elements.contains_key("10.0.0.1 . tcp . 80"));
        assert_eq!(elements.len(), 3);
        let again: Elements = elements.iter().collect();
        assert_eq!(again, elements);
    }
}
