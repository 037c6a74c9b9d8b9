//! Label and field selectors, as the API server reads them from `labelSelector` / `fieldSelector`.

use serde_json::Value;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq)]
enum Requirement {
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed selector: every requirement must hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

impl Selector {
    /// True when it selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Parses `a=b,!c,d in (x,y),e!=f,g`. Returns an error message for text it cannot read.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for term in split_terms(text) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let requirement = if let Some(key) = term.strip_prefix('!') {
                Requirement::NotExists(key.trim().to_string())
            } else if let Some((key, value)) = term.split_once("!=") {
                Requirement::NotIn(key.trim().into(), vec![value.trim().into()])
            } else if let Some((key, value)) =
                term.split_once("==").or_else(|| term.split_once('='))
            {
                Requirement::In(key.trim().into(), vec![value.trim().into()])
            } else if let Some((key, rest)) = term.split_once(" notin ") {
                Requirement::NotIn(key.trim().into(), set_values(rest)?)
            } else if let Some((key, rest)) = term.split_once(" in ") {
                Requirement::In(key.trim().into(), set_values(rest)?)
            } else if term
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                Requirement::Exists(term.to_string())
            } else {
                return Err(format!("unable to parse requirement: {term:?}"));
            };
            requirements.push(requirement);
        }
        Ok(Selector { requirements })
    }

    /// Checks the selector against a lookup of keys (labels or fields).
    pub fn matches(&self, lookup: impl Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|req| match req {
            Requirement::Exists(key) => lookup(key).is_some(),
            Requirement::NotExists(key) => lookup(key).is_none(),
            Requirement::In(key, values) => lookup(key).is_some_and(|v| values.contains(&v)),
            Requirement::NotIn(key, values) => lookup(key).is_none_or(|v| !values.contains(&v)),
        })
    }
}

fn split_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
}

fn set_values(text: &str) -> Result<Vec<String>, String> {
    let inner = text
        .trim()
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set, got {text:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

/// The labels of an object, for a label selector.
pub fn label_of(object: &Value, key: &str) -> Option<String> {
    object["metadata"]["labels"][key]
        .as_str()
        .map(str::to_string)
}

/// The fields an API server lets every kind be selected on.
pub fn field_of(object: &Value, key: &str) -> Option<String> {
    match key {
        "metadata.name" => object["metadata"]["name"].as_str().map(str::to_string),
        "metadata.namespace" => Some(
            object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kube_proxy_selector() {
        let s = Selector::parse(
            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless",
        )
        .unwrap();
        let plain = json!({"metadata": {"labels": {"app": "x"}}});
        let headless = json!({"metadata": {"labels": {"service.kubernetes.io/headless": ""}}});
        assert!(s.matches(|k| label_of(&plain, k)));
        assert!(!s.matches(|k| label_of(&headless, k)));
    }

    #[test]
    fn set_and_equality_forms() {
        let s = Selector::parse("env in (prod, staging),tier!=db,app=web,team").unwrap();
        let obj = json!({"metadata": {"labels": {"env": "prod", "tier": "web", "app": "web", "team": "a"}}});
        assert!(s.matches(|k| label_of(&obj, k)));
        let obj = json!({"metadata": {"labels": {"env": "dev", "app": "web", "team": "a"}}});
        assert!(!s.matches(|k| label_of(&obj, k)));
        let f = Selector::parse("metadata.name=node-a").unwrap();
        assert!(f.matches(|k| field_of(&json!({"metadata": {"name": "node-a"}}), k)));
        assert!(!f.matches(|k| field_of(&json!({"metadata": {"name": "node-b"}}), k)));
        assert!(Selector::parse("a b").is_err());
    }
}
