//! A stateful fake of nftables for tests: it interprets the part of nft's command language this
//! program writes (tables, chains, rules, sets, maps, elements, named counters), checks what
//! the kernel checks (objects exist, references resolve, a chain, set, counter or flowtable in
//! use is not deleted, a flowtable's devices are only ever added to, a map key is not added twice with other data) and applies a transaction all or
//! nothing.

use std::collections::{BTreeMap, BTreeSet};

use super::{NftError, Nftables, RuleComments, SetElements, TableNames, family_keyword};
use crate::model::IpFamily;

/// A set or map: its spec and elements (key -> the text after it, as written).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeSet {
    pub kind: String,
    pub spec: String,
    pub elements: BTreeMap<String, String>,
}

/// One table's contents.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FakeTable {
    /// Chain -> (spec, rules as written after the chain's name).
    pub chains: BTreeMap<String, (String, Vec<String>)>,
    pub sets: BTreeMap<String, FakeSet>,
    /// Named counters.
    pub counters: BTreeSet<String>,
    /// Flowtables and their devices.
    pub flowtables: BTreeMap<String, BTreeSet<String>>,
}

/// The fake ruleset: tables by (family keyword, name).
#[derive(Clone, Debug, Default)]
pub struct FakeNftables {
    pub tables: BTreeMap<(String, String), FakeTable>,
    /// Every transaction applied (or refused), in order.
    pub transactions: Vec<String>,
    /// A line holding one of these is refused, as the kernel refuses what it cannot take.
    pub refuse_containing: Vec<String>,
    /// How many `names` reads were made.
    pub name_reads: usize,
    /// How many rule reads were made.
    pub rule_reads: usize,
    /// How many element reads were made.
    pub element_reads: usize,
    /// The sets whose elements were read, in order.
    pub sets_read: Vec<String>,
    /// The chains whose rules were read, in order.
    pub chains_read: Vec<String>,
}

impl FakeNftables {
    /// `table` of `family`, if it exists.
    pub fn table(&self, family: IpFamily, table: &str) -> Option<&FakeTable> {
        self.tables
            .get(&(family_keyword(family).to_string(), table.to_string()))
    }

    /// A kernel without flowtables (no NF_FLOW_TABLE): it refuses to create one, as Linux does.
    pub fn without_flowtables() -> Self {
        FakeNftables {
            refuse_containing: vec![" flowtable ".into()],
            ..FakeNftables::default()
        }
    }

    /// Lines of the transactions applied so far.
    pub fn lines_written(&self) -> usize {
        self.transactions.iter().map(|t| t.lines().count()).sum()
    }
}

impl Nftables for FakeNftables {
    fn apply(&mut self, commands: &str) -> Result<(), NftError> {
        self.transactions.push(commands.to_string());
        let mut tables = self.tables.clone();
        for (index, line) in commands.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let refused = self
                .refuse_containing
                .iter()
                .any(|needle| line.contains(needle.as_str()));
            let result = if refused {
                Err("Operation not supported".to_string())
            } else {
                command(&mut tables, line)
            };
            if let Err(reason) = result {
                return Err(NftError::Transaction {
                    reason: format!(
                        "nft -f - exited with status 1: /dev/stdin:{}: Error: {reason}",
                        index + 1
                    ),
                    line: Some(index + 1),
                    context: line.to_string(),
                });
            }
        }
        self.tables = tables;
        Ok(())
    }

    fn names(&mut self, family: IpFamily, table: &str) -> Result<TableNames, NftError> {
        self.name_reads += 1;
        Ok(self
            .table(family, table)
            .map(|t| TableNames {
                chains: t.chains.keys().cloned().collect(),
                sets: t.sets.keys().cloned().collect(),
                counters: t.counters.clone(),
                flowtables: t.flowtables.keys().cloned().collect(),
            })
            .unwrap_or_default())
    }

    fn table_exists(&mut self, family: IpFamily, table: &str) -> Result<bool, NftError> {
        Ok(self.table(family, table).is_some())
    }

    fn flowtable_devices(
        &mut self,
        family: IpFamily,
        table: &str,
        flowtable: &str,
    ) -> Result<Option<std::collections::BTreeSet<String>>, NftError> {
        Ok(self
            .table(family, table)
            .and_then(|t| t.flowtables.get(flowtable).cloned()))
    }

    fn rule_comments(
        &mut self,
        family: IpFamily,
        table: &str,
        chains: &std::collections::BTreeSet<String>,
    ) -> Result<RuleComments, NftError> {
        self.rule_reads += 1;
        self.chains_read.extend(chains.iter().cloned());
        let comment = |rule: &String| {
            let after = rule.rsplit_once(" comment \"")?.1;
            Some(after.strip_suffix('"')?.to_string())
        };
        Ok(self
            .table(family, table)
            .map(|t| {
                t.chains
                    .iter()
                    .filter(|(name, (_, rules))| !rules.is_empty() && chains.contains(*name))
                    .map(|(name, (_, rules))| {
                        (
                            name.clone(),
                            (rules.len(), rules.iter().filter_map(comment).collect()),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    fn elements(
        &mut self,
        family: IpFamily,
        table: &str,
        sets: &[(String, String)],
    ) -> Result<SetElements, NftError> {
        self.element_reads += 1;
        self.sets_read
            .extend(sets.iter().map(|(name, _)| name.clone()));
        Ok(self.set_elements(family, table, sets))
    }
}

impl FakeNftables {
    fn set_elements(
        &self,
        family: IpFamily,
        table: &str,
        sets: &[(String, String)],
    ) -> SetElements {
        let Some(table) = self.table(family, table) else {
            return SetElements::new();
        };
        sets.iter()
            .filter_map(|(name, _)| Some((name.clone(), table.sets.get(name)?.elements.clone())))
            .collect()
    }
}

type Tables = BTreeMap<(String, String), FakeTable>;

/// Applies one command line to `tables`.
fn command(tables: &mut Tables, line: &str) -> Result<(), String> {
    let words: Vec<&str> = line.splitn(6, ' ').collect();
    let (verb, object) = match words.as_slice() {
        [verb, object, ..] => (*verb, *object),
        _ => return Err(format!("syntax error: {line}")),
    };
    let family = words.get(2).copied().unwrap_or_default();
    let table_name = words
        .get(3)
        .copied()
        .unwrap_or_default()
        .trim_end_matches(';');
    let key = (family.to_string(), table_name.to_string());
    if object == "table" {
        return match verb {
            "add" => {
                tables.entry(key).or_default();
                Ok(())
            }
            "delete" => tables
                .remove(&key)
                .map(drop)
                .ok_or_else(|| "No such file or directory".to_string()),
            "flush" => {
                let table = tables.get_mut(&key).ok_or("No such file or directory")?;
                table
                    .chains
                    .values_mut()
                    .for_each(|(_, rules)| rules.clear());
                table.sets.values_mut().for_each(|s| s.elements.clear());
                Ok(())
            }
            _ => Err(format!("syntax error: {line}")),
        };
    }
    let table = tables
        .get_mut(&key)
        .ok_or_else(|| "No such file or directory (table)".to_string())?;
    let name = words.get(4).copied().unwrap_or_default().to_string();
    let rest = words.get(5).copied().unwrap_or_default();
    match (verb, object) {
        ("add", "chain") => {
            let spec = rest.to_string();
            match table.chains.get(&name) {
                Some((existing, _)) if !spec.is_empty() && *existing != spec => {
                    Err("File exists (chain with another spec)".into())
                }
                Some(_) => Ok(()),
                None => {
                    table.chains.insert(name, (spec, Vec::new()));
                    Ok(())
                }
            }
        }
        ("flush", "chain") => {
            let (_, rules) = table
                .chains
                .get_mut(&name)
                .ok_or("No such file or directory")?;
            rules.clear();
            Ok(())
        }
        ("delete", "chain") => {
            if !table.chains.contains_key(&name) {
                return Err("No such file or directory".into());
            }
            if chain_in_use(table, &name) {
                return Err("Device or resource busy".into());
            }
            table.chains.remove(&name);
            Ok(())
        }
        ("add", "rule") => {
            check_references(table, rest)?;
            let (_, rules) = table
                .chains
                .get_mut(&name)
                .ok_or("No such file or directory")?;
            rules.push(rest.to_string());
            Ok(())
        }
        ("add", "set" | "map") => {
            let spec = rest.to_string();
            match table.sets.get(&name) {
                Some(existing) if existing.spec != spec || existing.kind != object => {
                    Err("File exists (set with another spec)".into())
                }
                Some(_) => Ok(()),
                None => {
                    table.sets.insert(
                        name,
                        FakeSet {
                            kind: object.to_string(),
                            spec,
                            elements: BTreeMap::new(),
                        },
                    );
                    Ok(())
                }
            }
        }
        ("flush", "set" | "map") => {
            let set = table
                .sets
                .get_mut(&name)
                .ok_or("No such file or directory")?;
            set.elements.clear();
            Ok(())
        }
        ("delete", "set" | "map") => {
            let exists = table.sets.contains_key(&name);
            deletable(table, exists, |refs| refs.sets.contains(&name))?;
            table.sets.remove(&name);
            Ok(())
        }
        ("add", "counter") => {
            table.counters.insert(name);
            Ok(())
        }
        ("delete", "counter") => {
            let exists = table.counters.contains(&name);
            deletable(table, exists, |refs| refs.counters.contains(&name))?;
            table.counters.remove(&name);
            Ok(())
        }
        ("add", "flowtable") => {
            let devices = rest
                .split_once("devices = {")
                .and_then(|(_, listed)| listed.split_once('}'))
                .map(|(listed, _)| listed)
                .unwrap_or_default()
                .split(',')
                .map(|device| device.trim().trim_matches('"'))
                .filter(|device| !device.is_empty())
                .map(str::to_string);
            table.flowtables.entry(name).or_default().extend(devices);
            Ok(())
        }
        ("delete", "flowtable") => {
            let exists = table.flowtables.contains_key(&name);
            deletable(table, exists, |refs| refs.flowtables.contains(&name))?;
            table.flowtables.remove(&name);
            Ok(())
        }
        ("add" | "delete", "element") => {
            let inner = rest
                .trim()
                .strip_prefix('{')
                .and_then(|r| r.strip_suffix('}'))
                .ok_or_else(|| format!("syntax error: {line}"))?;
            for element in split_elements(inner) {
                let (key, data) = split_element(element.trim());
                if verb == "add" {
                    check_references(table, &data)?;
                }
                let set = table
                    .sets
                    .get_mut(&name)
                    .ok_or("No such file or directory")?;
                if verb == "delete" {
                    set.elements
                        .remove(&key)
                        .ok_or("No such file or directory (element)")?;
                    continue;
                }
                match set.elements.get(&key) {
                    Some(existing) if verdict(existing) != verdict(&data) => {
                        return Err("File exists (element)".into());
                    }
                    Some(_) => {}
                    None => {
                        set.elements.insert(key, data);
                    }
                }
            }
            Ok(())
        }
        _ => Err(format!("syntax error: {line}")),
    }
}

/// Elements separated by `,` outside quotes.
fn split_elements(inner: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (index, c) in inner.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&inner[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// An element's key and the rest (` comment "..." : verdict`, or empty), as the renderer keeps them.
fn split_element(element: &str) -> (String, String) {
    let cut = [" comment ", " : "]
        .iter()
        .filter_map(|marker| element.find(marker))
        .min();
    match cut {
        Some(at) => (element[..at].to_string(), element[at..].to_string()),
        None => (element.to_string(), String::new()),
    }
}

/// The verdict part of an element's data (` : goto x`), which the kernel compares.
fn verdict(data: &str) -> &str {
    data.rsplit_once(" : ").map_or("", |(_, v)| v)
}

/// What a rule or a map element refers to, by name: the kernel refuses it while one is missing,
/// and refuses to delete one while a rule refers to it.
struct References {
    /// The chains it jumps or goes to.
    chains: Vec<String>,
    /// The sets and maps it names (`@name`).
    sets: Vec<String>,
    /// The named counters it counts with (`counter name "x"`), unquoted.
    counters: Vec<String>,
    /// The flowtables it offloads to (`flow add @name`).
    flowtables: Vec<String>,
}

fn references(text: &str) -> References {
    let words: Vec<&str> = text.split_whitespace().collect();
    let chains = words
        .windows(2)
        .filter(|w| w[0] == "jump" || w[0] == "goto")
        .map(|w| w[1].trim_end_matches([',', '}']).to_string())
        .collect();
    let named = |flowtable: bool| {
        words
            .iter()
            .enumerate()
            .filter(|(index, _)| {
                let after_flow_add = *index >= 2 && words[index - 2..*index] == ["flow", "add"];
                after_flow_add == flowtable
            })
            .filter_map(|(_, w)| w.strip_prefix('@'))
            .map(|s| s.trim_end_matches([',', '}']).to_string())
            .collect::<Vec<_>>()
    };
    let (sets, flowtables) = (named(false), named(true));
    let counters = words
        .windows(3)
        .filter(|w| w[0] == "counter" && w[1] == "name")
        .map(|w| w[2].trim_matches('"').to_string())
        .collect();
    References {
        chains,
        sets,
        counters,
        flowtables,
    }
}

/// Whether an object may be deleted, as the kernel decides: it `exists`, and no rule of `table`
/// refers to it (`referred` says whether a rule's references name it).
fn deletable(
    table: &FakeTable,
    exists: bool,
    referred: impl Fn(&References) -> bool,
) -> Result<(), String> {
    if !exists {
        return Err("No such file or directory".into());
    }
    let used = table
        .chains
        .values()
        .any(|(_, rules)| rules.iter().any(|rule| referred(&references(rule))));
    if used {
        return Err("Device or resource busy".into());
    }
    Ok(())
}

fn check_references(table: &FakeTable, text: &str) -> Result<(), String> {
    let References {
        chains,
        sets,
        counters,
        flowtables,
    } = references(text);
    if let Some(missing) = flowtables
        .iter()
        .find(|f| !table.flowtables.contains_key(*f))
    {
        return Err(format!("No such file or directory (flowtable {missing})"));
    }
    if let Some(missing) = counters.iter().find(|n| !table.counters.contains(*n)) {
        return Err(format!("No such file or directory (counter {missing})"));
    }
    if let Some(missing) = chains.iter().find(|c| !table.chains.contains_key(*c)) {
        return Err(format!("No such file or directory (chain {missing})"));
    }
    if let Some(missing) = sets.iter().find(|s| !table.sets.contains_key(*s)) {
        return Err(format!("No such file or directory (set {missing})"));
    }
    Ok(())
}

/// Whether a rule or a map element refers to `chain`.
fn chain_in_use(table: &FakeTable, chain: &str) -> bool {
    let refers = |text: &str| references(text).chains.iter().any(|c| c == chain);
    table
        .chains
        .values()
        .any(|(_, rules)| rules.iter().any(|r| refers(r)))
        || table
            .sets
            .values()
            .any(|set| set.elements.values().any(|data| refers(data)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: IpFamily = IpFamily::V4;

    fn applied(nft: &mut FakeNftables, text: &str) -> Result<(), NftError> {
        nft.apply(text)
    }

    #[test]
    fn a_counter_a_rule_counts_with_must_exist_and_stays_while_used() {
        let mut nft = FakeNftables::default();
        applied(&mut nft, "add table ip t\nadd chain ip t a\n").unwrap();
        let err = applied(&mut nft, "add rule ip t a counter name \"c\" reject\n").unwrap_err();
        assert!(err.to_string().contains("(counter c)"), "{err}");
        applied(
            &mut nft,
            "add counter ip t c\nadd rule ip t a counter name \"c\" reject\n",
        )
        .unwrap();
        let err = applied(&mut nft, "delete counter ip t c\n").unwrap_err();
        assert!(err.to_string().contains("busy"), "{err}");
        applied(&mut nft, "flush chain ip t a\ndelete counter ip t c\n").unwrap();
        assert!(nft.table(V4, "t").unwrap().counters.is_empty());
    }

    #[test]
    fn a_flowtable_gains_devices_must_exist_stays_while_used_and_can_be_missing() {
        let spec = "{ hook ingress priority filter ; }";
        let mut nft = FakeNftables::default();
        applied(
            &mut nft,
            "add table ip t\nadd chain ip t a\nadd set ip t s { type ipv4_addr ; }\n",
        )
        .unwrap();
        let rule = "add rule ip t a ct original ip daddr @s flow add @f\n";
        let err = applied(&mut nft, rule).unwrap_err();
        assert!(err.to_string().contains("(flowtable f)"), "{err}");
        applied(&mut nft, &format!("add flowtable ip t f {spec}\n{rule}")).unwrap();
        for devices in ["eth0, veth1", "veth2"] {
            applied(
                &mut nft,
                &format!("add flowtable ip t f {{ hook ingress priority filter ; devices = {{ {devices} }} ; }}\n"),
            )
            .unwrap();
        }
        applied(&mut nft, &format!("add flowtable ip t f {spec}\n")).unwrap();
        let devices: Vec<&str> = nft.table(V4, "t").unwrap().flowtables["f"]
            .iter()
            .map(String::as_str)
            .collect();
        assert_eq!(devices, ["eth0", "veth1", "veth2"]);
        let err = applied(&mut nft, "delete flowtable ip t f\n").unwrap_err();
        assert!(err.to_string().contains("busy"), "{err}");
        applied(&mut nft, "flush chain ip t a\ndelete flowtable ip t f\n").unwrap();
        assert!(nft.table(V4, "t").unwrap().flowtables.is_empty());

        let mut without = FakeNftables::without_flowtables();
        applied(&mut without, "add table ip t\n").unwrap();
        assert!(applied(&mut without, &format!("add flowtable ip t f {spec}\n")).is_err());
    }

    #[test]
    fn a_set_a_rule_names_must_exist_and_stays_while_named() {
        let mut nft = FakeNftables::default();
        applied(&mut nft, "add table ip t\nadd chain ip t a\n").unwrap();
        let err = applied(&mut nft, "add rule ip t a ip daddr @s drop\n").unwrap_err();
        assert!(err.to_string().contains("(set s)"), "{err}");
        applied(
            &mut nft,
            "add set ip t s { type ipv4_addr ; }\nadd rule ip t a ip daddr @s drop\n",
        )
        .unwrap();
        let err = applied(&mut nft, "delete set ip t s\n").unwrap_err();
        assert!(err.to_string().contains("busy"), "{err}");
        applied(&mut nft, "flush chain ip t a\ndelete set ip t s\n").unwrap();
        assert!(nft.table(V4, "t").unwrap().sets.is_empty());
    }

    #[test]
    fn transactions_apply_whole_or_not_at_all() {
        let mut nft = FakeNftables::default();
        applied(
            &mut nft,
            "add table ip t\nadd chain ip t a\nadd chain ip t b\nadd rule ip t b jump a\n\
             add map ip t m { type ipv4_addr : verdict ; }\nadd element ip t m { 1.2.3.4 : goto a }\n",
        )
        .unwrap();
        let err =
            applied(&mut nft, "add chain ip t c\nadd rule ip t c goto missing\n").unwrap_err();
        assert!(
            matches!(err, NftError::Transaction { line: Some(2), .. }),
            "{err}"
        );
        assert!(!nft.table(V4, "t").unwrap().chains.contains_key("c"));
        // In use by a rule, then by an element.
        assert!(applied(&mut nft, "delete chain ip t a\n").is_err());
        assert!(applied(&mut nft, "flush chain ip t b\ndelete chain ip t a\n").is_err());
        applied(
            &mut nft,
            "flush chain ip t b\ndelete element ip t m { 1.2.3.4 }\ndelete chain ip t a\n",
        )
        .unwrap();
        assert_eq!(nft.names(V4, "t").unwrap().chains.len(), 1);
    }

    #[test]
    fn map_keys_are_not_added_twice_with_other_data() {
        let mut nft = FakeNftables::default();
        applied(
            &mut nft,
            "add table ip t\nadd map ip t m { type ipv4_addr : verdict ; }\n\
             add element ip t m { 1.2.3.4 comment \"a, b\" : drop }\n",
        )
        .unwrap();
        applied(
            &mut nft,
            "add element ip t m { 1.2.3.4 comment \"a, b\" : drop }\n",
        )
        .unwrap();
        assert!(applied(&mut nft, "add element ip t m { 1.2.3.4 : accept }\n").is_err());
        assert!(applied(&mut nft, "delete element ip t m { 1.2.3.5 }\n").is_err());
        let set = &nft.table(V4, "t").unwrap().sets["m"];
        assert_eq!(set.elements["1.2.3.4"], " comment \"a, b\" : drop");
    }
}
