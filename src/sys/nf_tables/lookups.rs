//! The reads `explain` makes of one table, each targeted: one element by its key, one chain's
//! rules, one set's elements. The kernel answers over netlink; the fake answers from its state
//! compiled as the kernel would hold it, so that `explain` runs on either.

use std::collections::BTreeMap;

use netlink_sys::protocols::NETLINK_NETFILTER;

use super::elements::{
    ElementsError, KeyLayout, address_intervals, address_number, bounded_intervals, element,
    set_elements,
};
use super::expr::{Data, Expr};
use super::fake::FakeNftables;
use super::read::{chain_rules, nfproto, table_exists};
use super::trace::{Element, Ruleset, Set, Table};
use super::write::verdict_text;
use crate::model::IpFamily;
use crate::sys::netlink::{Connection, NetlinkError};

/// Targeted reads of one table.
pub trait Lookups {
    fn table_exists(&mut self, family: IpFamily, table: &str) -> Result<bool, ElementsError>;
    /// The element of `set` whose key is `key` (as the kernel holds it), as text: its key and
    /// what follows (` comment "..." : verdict`).
    fn element(
        &mut self,
        family: IpFamily,
        table: &str,
        set: &str,
        layout: &KeyLayout,
        key: &[u8],
    ) -> Result<Option<(String, String)>, ElementsError>;
    /// Every element of `set`, as text (draws as `FIRST-LAST`).
    fn set_elements(
        &mut self,
        family: IpFamily,
        table: &str,
        set: &str,
        layout: &KeyLayout,
    ) -> Result<BTreeMap<String, String>, ElementsError>;
    /// An interval set of addresses: each interval's first address and the one after its last.
    fn address_intervals(
        &mut self,
        family: IpFamily,
        table: &str,
        set: &str,
    ) -> Result<Vec<(u128, u128)>, ElementsError>;
    /// The rules of `chain`, as expressions (none when it does not exist).
    fn chain_rules(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<Vec<Vec<Expr>>, ElementsError>;
}

/// The kernel's answers, over one netlink socket.
pub struct KernelLookups {
    connection: Connection,
}

impl KernelLookups {
    pub fn open() -> Result<Self, NetlinkError> {
        Ok(KernelLookups {
            connection: Connection::open(NETLINK_NETFILTER)?,
        })
    }
}

impl Lookups for KernelLookups {
    fn table_exists(&mut self, family: IpFamily, table: &str) -> Result<bool, ElementsError> {
        Ok(table_exists(family, table)?)
    }

    fn element(
        &mut self,
        family: IpFamily,
        table: &str,
        set: &str,
        layout: &KeyLayout,
        key: &[u8],
    ) -> Result<Option<(String, String)>, ElementsError> {
        element(&mut self.connection, family, table, set, layout, key)
    }

    fn set_elements(
        &mut self,
        family: IpFamily,
        table: &str,
        set: &str,
        layout: &KeyLayout,
    ) -> Result<BTreeMap<String, String>, ElementsError> {
        set_elements(&mut self.connection, family, table, set, layout)
    }

    fn address_intervals(
        &mut self,
        family: IpFamily,
        table: &str,
        set: &str,
    ) -> Result<Vec<(u128, u128)>, ElementsError> {
        address_intervals(&mut self.connection, family, table, set)
    }

    fn chain_rules(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<Vec<Vec<Expr>>, ElementsError> {
        Ok(chain_rules(family, table, &[chain])?
            .into_iter()
            .next()
            .unwrap_or_default())
    }
}

/// The fake's state as the kernel would hold it: rules and anonymous sets compiled.
fn compiled(
    fake: &FakeNftables,
    family: IpFamily,
    table: &str,
) -> Result<Option<Table>, ElementsError> {
    let mut ruleset =
        Ruleset::from_fake(fake, family).map_err(|err| ElementsError::Undecodable {
            set: "(the fake's ruleset)".into(),
            what: err.to_string(),
        })?;
    Ok(ruleset.tables.remove(&(nfproto(family), table.to_string())))
}

fn compiled_set(
    fake: &FakeNftables,
    family: IpFamily,
    table: &str,
    set: &str,
) -> Result<Option<Set>, ElementsError> {
    Ok(compiled(fake, family, table)?.and_then(|mut t| t.sets.remove(set)))
}

/// An element's data as this program writes it after the key (` : goto chain`).
fn data_text(element: &Element) -> String {
    match &element.data {
        Some(Data::Verdict(v)) => verdict_text(v.code, v.chain.as_deref())
            .map(|v| format!(" : {v}"))
            .unwrap_or_default(),
        _ => String::new(),
    }
}

impl Lookups for FakeNftables {
    fn table_exists(&mut self, family: IpFamily, table: &str) -> Result<bool, ElementsError> {
        Ok(self.table(family, table).is_some())
    }

    fn element(
        &mut self,
        family: IpFamily,
        table: &str,
        set: &str,
        layout: &KeyLayout,
        key: &[u8],
    ) -> Result<Option<(String, String)>, ElementsError> {
        let Some(text) = layout.key_text(key) else {
            return Ok(None);
        };
        Ok(self
            .table(family, table)
            .and_then(|t| t.sets.get(set))
            .and_then(|s| s.elements.get(&text))
            .map(|rest| (text, rest.clone())))
    }

    fn set_elements(
        &mut self,
        family: IpFamily,
        table: &str,
        set: &str,
        layout: &KeyLayout,
    ) -> Result<BTreeMap<String, String>, ElementsError> {
        if let Some(named) = self.table(family, table).and_then(|t| t.sets.get(set)) {
            return Ok(named.elements.clone());
        }
        // An anonymous map: only the rule that holds it names it.
        let Some(anonymous) = compiled_set(self, family, table, set)? else {
            return Ok(BTreeMap::new());
        };
        Ok(anonymous
            .elements
            .iter()
            .filter_map(|e| Some((layout.key_text(&e.key)?, data_text(e))))
            .collect())
    }

    fn address_intervals(
        &mut self,
        family: IpFamily,
        table: &str,
        set: &str,
    ) -> Result<Vec<(u128, u128)>, ElementsError> {
        let Some(anonymous) = compiled_set(self, family, table, set)? else {
            return Ok(Vec::new());
        };
        let bounds = anonymous
            .elements
            .iter()
            .filter_map(|e| Some((address_number(&e.key)?, !e.interval_end)))
            .collect();
        Ok(bounded_intervals(bounds))
    }

    fn chain_rules(
        &mut self,
        family: IpFamily,
        table: &str,
        chain: &str,
    ) -> Result<Vec<Vec<Expr>>, ElementsError> {
        Ok(compiled(self, family, table)?
            .and_then(|mut t| t.chains.remove(chain))
            .map(|c| c.rules)
            .unwrap_or_default())
    }
}
