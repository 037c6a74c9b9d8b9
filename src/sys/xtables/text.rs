//! The tools' text: sections and chains of iptables-save output, restore lines split into
//! words, and where a failed restore says it failed.

use std::collections::BTreeSet;

/// One table's part of an iptables-save of several tables (empty if absent).
pub fn table_section<'a>(save: &'a str, table: &str) -> &'a str {
    let header = format!("*{table}\n");
    let Some(start) = save.find(&header) else {
        return "";
    };
    let rest = &save[start..];
    match rest.find("\nCOMMIT") {
        Some(end) => &rest[..end],
        None => rest,
    }
}

/// The chains `:NAME ...` lines declare in iptables-save output.
pub fn declared_chains(save: &str) -> BTreeSet<String> {
    save.lines()
        .filter_map(|line| line.strip_prefix(':'))
        .filter_map(|decl| decl.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Which of `chains` an iptables-save output declares (without collecting every other name:
/// a table of 10,000 services declares over 100,000 chains).
pub fn declared_among(save: &str, chains: &[&str]) -> BTreeSet<String> {
    save.lines()
        .filter_map(|line| line.strip_prefix(':'))
        .filter_map(|decl| decl.split_whitespace().next())
        .filter(|name| chains.contains(name))
        .map(str::to_string)
        .collect()
}

/// The rules of `chain` in iptables-save or `iptables -S` output, without `-A <chain> `.
pub fn rules_of(listing: &str, chain: &str) -> Vec<String> {
    let prefix = format!("-A {chain} ");
    listing
        .lines()
        .filter_map(|line| {
            line.strip_prefix(&prefix)
                .or_else(|| (line == prefix.trim_end()).then_some(""))
        })
        .map(|spec| spec.trim_end().to_string())
        .collect()
}

/// iptables-restore says `line N failed` (a line it could not parse) or `line N: CHAIN_DEL
/// failed (...)` (a command the kernel refused, nft back end).
pub(super) fn failed_line(stderr: &str) -> Option<usize> {
    let words: Vec<&str> = stderr.split_whitespace().collect();
    words
        .windows(2)
        .find(|w| w[0] == "line" && w[1].trim_end_matches(':').parse::<usize>().is_ok())
        .and_then(|w| w[1].trim_end_matches(':').parse().ok())
}

/// Input line `line` (1-based) with the lines around it, numbered, on one line.
pub fn input_context(input: &str, line: usize) -> String {
    let first = line.saturating_sub(1).max(1);
    input
        .lines()
        .enumerate()
        .skip(first - 1)
        .take(line + 1 - first + 1)
        .map(|(index, text)| {
            let mark = if index + 1 == line { ">" } else { "" };
            format!("{mark}{}: {text:?}", index + 1)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Splits a restore line into words, honouring double quotes (which are dropped: `"a b"` is
/// the word `a b`, `""` an empty word).
pub fn tokenize(line: &str) -> Result<Vec<String>, String> {
    let mut tokens = Vec::new();
    let mut chars = line.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let (mut end, mut quoted, mut has_quote) = (start, false, false);
        while let Some(&(at, c)) = chars.peek() {
            if c.is_whitespace() && !quoted {
                break;
            }
            if c == '"' {
                quoted = !quoted;
                has_quote = true;
            }
            end = at + c.len_utf8();
            chars.next();
        }
        if quoted {
            return Err("unterminated quote".into());
        }
        let word = &line[start..end];
        tokens.push(if has_quote {
            word.replace('"', "")
        } else {
            word.to_string()
        });
    }
    Ok(tokens)
}

/// The chain or target a rule jumps to.
pub fn jump_target(spec: &str) -> Option<&str> {
    let mut words = spec.split_whitespace();
    while let Some(word) = words.next() {
        if word == "-j" || word == "-g" {
            return words.next();
        }
    }
    None
}
