//! A YAML tree that keeps what `serde_yaml_ng::Value` would hide from the loader: duplicate keys
//! (reported, never silently merged), key order, and custom tags such as `!reset`.
//!
//! Anchors and aliases are resolved by `serde_yaml_ng` itself (with its recursion and repetition
//! limits); merge keys (`<<`) are applied here, after duplicates have been checked.

use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};

/// One YAML value. Mapping keys are text; entries keep their order and any duplicates.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
    /// A value with a non-core tag, e.g. `!reset []`.
    Tagged(String, Box<Node>),
}

impl Node {
    /// The entry `key` of a mapping (the first one if duplicated).
    pub(crate) fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The text of a scalar; `None` for null, lists, mappings and tagged values.
    pub(crate) fn scalar_text(&self) -> Option<String> {
        match self {
            Node::Bool(b) => Some(b.to_string()),
            Node::Int(i) => Some(i.to_string()),
            Node::Float(f) => Some(float_text(*f)),
            Node::Str(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// What kind of value this is, for messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Node::Null => "nothing (null)",
            Node::Bool(_) => "a boolean",
            Node::Int(_) => "a number",
            Node::Float(_) => "a number",
            Node::Str(_) => "text",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a mapping",
            Node::Tagged(..) => "a tagged value",
        }
    }

    /// A short one-line rendering for error messages.
    pub(crate) fn short(&self) -> String {
        let mut out = String::new();
        self.render(&mut out);
        if out.chars().count() > 80 {
            let cut: String = out.chars().take(77).collect();
            format!("{cut}...")
        } else {
            out
        }
    }

    fn render(&self, out: &mut String) {
        if out.len() > 100 {
            return;
        }
        match self {
            Node::Null => out.push_str("null"),
            Node::Seq(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.render(out);
                }
                out.push(']');
            }
            Node::Map(entries) => {
                out.push('{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(k);
                    out.push_str(": ");
                    v.render(out);
                }
                out.push('}');
            }
            Node::Tagged(tag, inner) => {
                out.push('!');
                out.push_str(tag);
                out.push(' ');
                inner.render(out);
            }
            scalar => out.push_str(&scalar.scalar_text().unwrap_or_default()),
        }
    }
}

/// A float as Compose would print it: integral values without a fraction.
pub(crate) fn float_text(f: f64) -> String {
    if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        f.to_string()
    }
}

/// Parses one YAML document. Multiple documents, syntax errors and non-text keys are errors.
pub(crate) fn parse(text: &str) -> Result<Node, String> {
    NodeSeed
        .deserialize(serde_yaml_ng::Deserializer::from_str(text))
        .map_err(|e| one_line(&e.to_string()))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

struct NodeSeed;

impl<'de> DeserializeSeed<'de> for NodeSeed {
    type Value = Node;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Node, E> {
        Ok(Node::Bool(b))
    }
    fn visit_i64<E>(self, i: i64) -> Result<Node, E> {
        Ok(Node::Int(i.into()))
    }
    fn visit_u64<E>(self, i: u64) -> Result<Node, E> {
        Ok(Node::Int(i.into()))
    }
    fn visit_i128<E>(self, i: i128) -> Result<Node, E> {
        Ok(Node::Int(i))
    }
    fn visit_u128<E>(self, i: u128) -> Result<Node, E> {
        Ok(match i128::try_from(i) {
            Ok(i) => Node::Int(i),
            Err(_) => Node::Str(i.to_string()),
        })
    }
    fn visit_f64<E>(self, f: f64) -> Result<Node, E> {
        Ok(Node::Float(f))
    }
    fn visit_str<E>(self, s: &str) -> Result<Node, E> {
        Ok(Node::Str(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Node, E> {
        Ok(Node::Str(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(NodeSeed)? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key_seed(NodeSeed)? {
            let key = match key {
                Node::Str(s) => s,
                Node::Int(_) | Node::Float(_) | Node::Bool(_) => {
                    key.scalar_text().unwrap_or_default()
                }
                other => {
                    return Err(de::Error::custom(format!(
                        "mapping keys must be plain text, found {} ({})",
                        other.kind(),
                        other.short()
                    )))
                }
            };
            // The value must always be consumed, or the deserializer loses its place.
            let value = map.next_value_seed(NodeSeed)?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Node, A::Error> {
        let (tag, variant): (String, _) = data.variant()?;
        // Consume the tagged content; leaving it unread makes the deserializer spin.
        let inner = variant.newtype_variant_seed(NodeSeed)?;
        Ok(Node::Tagged(
            tag.trim_start_matches('!').to_owned(),
            Box::new(inner),
        ))
    }
}

/// A key that appears twice in one mapping: the mapping's path and the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Duplicate {
    pub path: Vec<String>,
    pub key: String,
}

/// Reports every duplicated key and keeps only the first occurrence of each.
pub(crate) fn remove_duplicates(node: &mut Node, path: &mut Vec<String>, out: &mut Vec<Duplicate>) {
    match node {
        Node::Map(entries) => {
            let mut seen: Vec<String> = Vec::new();
            let mut kept = Vec::with_capacity(entries.len());
            for (k, v) in std::mem::take(entries) {
                if seen.contains(&k) {
                    let dup = Duplicate {
                        path: path.clone(),
                        key: k,
                    };
                    if !out.contains(&dup) {
                        out.push(dup);
                    }
                    continue;
                }
                seen.push(k.clone());
                kept.push((k, v));
            }
            for (k, v) in kept.iter_mut() {
                path.push(k.clone());
                remove_duplicates(v, path, out);
                path.pop();
            }
            *entries = kept;
        }
        Node::Seq(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(format!("[{i}]"));
                remove_duplicates(item, path, out);
                path.pop();
            }
        }
        Node::Tagged(_, inner) => remove_duplicates(inner, path, out),
        _ => {}
    }
}

/// Applies YAML merge keys (`<<: *anchor` or `<<: [*a, *b]`): keys already present win, then
/// earlier sources win over later ones. A malformed merge is pushed to `out` with its path.
pub(crate) fn apply_merges(
    node: &mut Node,
    path: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, String)>,
) {
    match node {
        Node::Map(entries) => {
            for (k, v) in entries.iter_mut() {
                path.push(k.clone());
                apply_merges(v, path, out);
                path.pop();
            }
            let Some(pos) = entries.iter().position(|(k, _)| k == "<<") else {
                return;
            };
            let (_, source) = entries.remove(pos);
            let sources = match source {
                Node::Map(m) => vec![m],
                Node::Seq(items) => {
                    let mut maps = Vec::new();
                    for item in items {
                        match item {
                            Node::Map(m) => maps.push(m),
                            other => {
                                out.push((
                                    path.clone(),
                                    format!(
                                        "a merge key '<<' list must hold mappings, found {}",
                                        other.kind()
                                    ),
                                ));
                            }
                        }
                    }
                    maps
                }
                other => {
                    out.push((
                        path.clone(),
                        format!(
                            "a merge key '<<' needs a mapping or a list of mappings, found {}",
                            other.kind()
                        ),
                    ));
                    Vec::new()
                }
            };
            for source in sources {
                for (k, v) in source {
                    if !entries.iter().any(|(existing, _)| *existing == k) {
                        entries.push((k, v));
                    }
                }
            }
        }
        Node::Seq(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(format!("[{i}]"));
                apply_merges(item, path, out);
                path.pop();
            }
        }
        Node::Tagged(_, inner) => apply_merges(inner, path, out),
        _ => {}
    }
}

/// Joins a path into the key text errors show: `deploy.update_config.order`, `ports[0]`.
pub(crate) fn join_path(parts: &[String]) -> String {
    let mut out = String::new();
    for p in parts {
        if !out.is_empty() && !p.starts_with('[') {
            out.push('.');
        }
        out.push_str(p);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_keep_their_yaml_types() {
        let n = parse("a: 0440\nb: 0o440\nc: 440\nd: yes\ne: ~\nf: 1.5\ng: true\n").unwrap();
        assert_eq!(n.get("a"), Some(&Node::Str("0440".into())));
        assert_eq!(n.get("b"), Some(&Node::Int(0o440)));
        assert_eq!(n.get("c"), Some(&Node::Int(440)));
        assert_eq!(n.get("d"), Some(&Node::Str("yes".into())));
        assert_eq!(n.get("e"), Some(&Node::Null));
        assert_eq!(n.get("f"), Some(&Node::Float(1.5)));
        assert_eq!(n.get("g"), Some(&Node::Bool(true)));
    }

    #[test]
    fn duplicates_are_reported_not_merged() {
        let mut n = parse("services:\n  web: {image: a}\n  web: {image: b}\n").unwrap();
        let mut dups = Vec::new();
        remove_duplicates(&mut n, &mut Vec::new(), &mut dups);
        assert_eq!(
            dups,
            vec![Duplicate {
                path: vec!["services".into()],
                key: "web".into()
            }]
        );
        let web = n.get("services").unwrap().get("web").unwrap();
        assert_eq!(web.get("image"), Some(&Node::Str("a".into())));
    }

    #[test]
    fn merge_keys_fill_missing_entries_only() {
        let mut n = parse("x: &base {a: 1, b: 2}\ny:\n  <<: *base\n  b: 3\n").unwrap();
        let mut errs = Vec::new();
        apply_merges(&mut n, &mut Vec::new(), &mut errs);
        assert!(errs.is_empty());
        let y = n.get("y").unwrap();
        assert_eq!(y.get("a"), Some(&Node::Int(1)));
        assert_eq!(y.get("b"), Some(&Node::Int(3)));
        assert_eq!(y.get("<<"), None);
    }

    #[test]
    fn tags_and_bad_documents_do_not_hang_or_panic() {
        let n = parse("a: !reset []\nb: !override {x: 1}\n").unwrap();
        assert_eq!(
            n.get("a"),
            Some(&Node::Tagged("reset".into(), Box::new(Node::Seq(vec![]))))
        );
        assert!(parse("a: 1\n---\nb: 2\n").is_err());
        assert!(parse("a: [1, 2\n").is_err());
        assert!(parse("a: &x [*x]\n").is_err());
        assert!(parse("? [a, b]\n: c\n").is_err());
        assert_eq!(parse("").unwrap(), Node::Null);
    }
}
