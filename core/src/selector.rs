//! Unresolved selectors and their resolution.
//!
//! A selector is text a user typed. Resolving it against observed items returns **every** match,
//! so Name Ambiguity stays visible: the caller decides whether several matches are fine (a
//! fan-out) or need one ID ([`Matches::one`]). Nothing here ever picks a winner.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Something observed with a durable identity and a display name that may be shared.
pub trait Identified {
    /// The durable identity, as text.
    fn id(&self) -> &str;
    /// The display name; several items may share it.
    fn name(&self) -> &str;
}

/// Why a selector could not be narrowed to exactly one item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    #[error("no {kind} matches '{selector}'")]
    NotFound {
        kind: &'static str,
        selector: String,
    },
    #[error(
        "'{selector}' matches {} {kind}s: {}; use an ID to choose one",
        candidates.len(),
        candidates.join(", ")
    )]
    Ambiguous {
        kind: &'static str,
        selector: String,
        /// Each match as `name (id)`.
        candidates: Vec<String>,
    },
}

impl ResolveError {
    /// Whether nothing matched (as opposed to several things).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ResolveError::NotFound { .. })
    }
}

/// Every item a selector matched, in the order the items were given.
#[derive(Debug)]
pub struct Matches<'a, T> {
    kind: &'static str,
    selector: String,
    items: Vec<&'a T>,
}

impl<'a, T: Identified> Matches<'a, T> {
    fn collect(
        kind: &'static str,
        selector: &str,
        items: &'a [T],
        pred: impl Fn(&T) -> bool,
    ) -> Self {
        Matches {
            kind,
            selector: selector.to_owned(),
            items: items.iter().filter(|i| pred(i)).collect(),
        }
    }

    /// Every match.
    pub fn all(&self) -> &[&'a T] {
        &self.items
    }

    /// Every match, owned.
    pub fn into_vec(self) -> Vec<&'a T> {
        self.items
    }

    /// How many items matched.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing matched.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The single match, or an error that lists every candidate when there are several.
    pub fn one(self) -> Result<&'a T, ResolveError> {
        match self.items.as_slice() {
            [] => Err(ResolveError::NotFound {
                kind: self.kind,
                selector: self.selector,
            }),
            [one] => Ok(one),
            many => Err(ResolveError::Ambiguous {
                kind: self.kind,
                candidates: many
                    .iter()
                    .map(|i| format!("{} ({})", i.name(), i.id()))
                    .collect(),
                selector: self.selector,
            }),
        }
    }
}

/// Why a selector text is not usable at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} must not be empty; give a name or an ID")]
pub struct EmptySelector {
    kind: &'static str,
}

macro_rules! text_selector {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The selector as typed.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = EmptySelector;
            fn from_str(s: &str) -> Result<Self, EmptySelector> {
                Self::try_from(s.to_owned())
            }
        }

        impl TryFrom<String> for $name {
            type Error = EmptySelector;
            fn try_from(s: String) -> Result<Self, EmptySelector> {
                if s.trim().is_empty() {
                    return Err(EmptySelector { kind: $kind });
                }
                Ok(Self(s))
            }
        }

        impl From<$name> for String {
            fn from(s: $name) -> String {
                s.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }
    };
}

text_selector!(
    /// The unresolved name-or-ID text that targets one Machine. Not a wildcard (`*` is a Machine
    /// Name that cannot exist, so it matches nothing); see [`FanOutSelector`] for "every Machine".
    MachineTarget,
    "Machine Target"
);

text_selector!(
    /// The unresolved name-or-ID text that selects a Service.
    ServiceSelector,
    "Service Selector"
);

text_selector!(
    /// The unresolved Container ID, display name or ID prefix that selects one container.
    ContainerSelector,
    "Container Selector"
);

impl MachineTarget {
    /// Every Machine whose ID or Machine Name equals this target.
    pub fn resolve<'a, T: Identified>(&self, machines: &'a [T]) -> Matches<'a, T> {
        Matches::collect("Machine", &self.0, machines, |m| {
            m.id() == self.0 || m.name() == self.0
        })
    }
}

impl ServiceSelector {
    /// Every Service whose Service ID or Service Name equals this selector. Several Service IDs
    /// sharing one name all match.
    pub fn resolve<'a, T: Identified>(&self, services: &'a [T]) -> Matches<'a, T> {
        Matches::collect("Service", &self.0, services, |s| {
            s.id() == self.0 || s.name() == self.0
        })
    }
}

impl ContainerSelector {
    /// Every container whose ID equals or starts with this selector, or whose display name equals
    /// it. A prefix shared by two containers matches both; it is never guessed.
    pub fn resolve<'a, T: Identified>(&self, containers: &'a [T]) -> Matches<'a, T> {
        Matches::collect("container", &self.0, containers, |c| {
            c.id().starts_with(&self.0) || c.name() == self.0
        })
    }
}

/// A selection of every visible Machine, or of one Machine Target. `*` is the only wildcard.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum FanOutSelector {
    /// Every Machine the observer sees.
    All,
    /// The Machines one Machine Target matches (by Name Ambiguity, possibly several).
    One(MachineTarget),
}

impl FanOutSelector {
    /// The Machines selected. For [`FanOutSelector::All`] that is every Machine given.
    pub fn resolve<'a, T: Identified>(&self, machines: &'a [T]) -> Matches<'a, T> {
        match self {
            FanOutSelector::All => Matches::collect("Machine", "*", machines, |_| true),
            FanOutSelector::One(target) => target.resolve(machines),
        }
    }
}

impl FromStr for FanOutSelector {
    type Err = EmptySelector;
    fn from_str(s: &str) -> Result<Self, EmptySelector> {
        if s.trim() == "*" {
            Ok(FanOutSelector::All)
        } else {
            Ok(FanOutSelector::One(s.parse()?))
        }
    }
}

impl TryFrom<String> for FanOutSelector {
    type Error = EmptySelector;
    fn try_from(s: String) -> Result<Self, EmptySelector> {
        s.parse()
    }
}

impl From<FanOutSelector> for String {
    fn from(s: FanOutSelector) -> String {
        s.to_string()
    }
}

impl fmt::Display for FanOutSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FanOutSelector::All => f.write_str("*"),
            FanOutSelector::One(t) => t.fmt(f),
        }
    }
}

impl fmt::Debug for FanOutSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FanOutSelector::All => f.write_str("FanOutSelector(*)"),
            FanOutSelector::One(t) => write!(f, "FanOutSelector({:?})", t.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Item {
        id: &'static str,
        name: &'static str,
    }

    impl Identified for Item {
        fn id(&self) -> &str {
            self.id
        }
        fn name(&self) -> &str {
            self.name
        }
    }

    const fn item(id: &'static str, name: &'static str) -> Item {
        Item { id, name }
    }

    fn ids<T: Identified>(m: &Matches<'_, T>) -> Vec<String> {
        m.all().iter().map(|i| i.id().to_owned()).collect()
    }

    #[test]
    fn a_shared_name_returns_every_match_and_one_refuses_to_choose() {
        let machines = [item("aaa1", "web"), item("bbb2", "db"), item("ccc3", "web")];
        let t: MachineTarget = "web".parse().unwrap();
        let m = t.resolve(&machines);
        assert_eq!(ids(&m), ["aaa1", "ccc3"]);
        let err = m.one().unwrap_err();
        assert_eq!(
            err.to_string(),
            "'web' matches 2 Machines: web (aaa1), web (ccc3); use an ID to choose one"
        );
        let by_id: MachineTarget = "ccc3".parse().unwrap();
        assert_eq!(by_id.resolve(&machines).one().unwrap().id, "ccc3");
    }

    #[test]
    fn an_id_and_a_name_that_collide_both_match() {
        let machines = [item("db", "web"), item("x1", "db")];
        let t: MachineTarget = "db".parse().unwrap();
        assert_eq!(ids(&t.resolve(&machines)), ["db", "x1"]);
    }

    #[test]
    fn star_selects_every_machine_and_is_the_only_wildcard() {
        let machines = [item("a", "one"), item("b", "two")];
        let all: FanOutSelector = "*".parse().unwrap();
        assert_eq!(all, FanOutSelector::All);
        assert_eq!(all.resolve(&machines).len(), 2);
        for not_wild in ["all", "*.*", "o*"] {
            let s: FanOutSelector = not_wild.parse().unwrap();
            assert!(s.resolve(&machines).is_empty(), "{not_wild}");
        }
        let target: MachineTarget = "*".parse().unwrap();
        assert!(target.resolve(&machines).is_empty());
        assert!("".parse::<FanOutSelector>().is_err());
    }

    #[test]
    fn services_sharing_a_name_all_resolve() {
        let services = [item("s1", "api"), item("s2", "api"), item("s3", "web")];
        let sel: ServiceSelector = "api".parse().unwrap();
        assert_eq!(ids(&sel.resolve(&services)), ["s1", "s2"]);
    }

    #[test]
    fn container_prefixes_resolve_uniquely_or_report_ambiguity() {
        let containers = [
            item("abc123", "web-x1y2"),
            item("abd456", "web-q9r8"),
            item("ff0000", "db-aaaa"),
        ];
        let by_prefix: ContainerSelector = "abc".parse().unwrap();
        assert_eq!(by_prefix.resolve(&containers).one().unwrap().id, "abc123");
        let by_name: ContainerSelector = "db-aaaa".parse().unwrap();
        assert_eq!(by_name.resolve(&containers).one().unwrap().id, "ff0000");
        let shared: ContainerSelector = "ab".parse().unwrap();
        let err = shared.resolve(&containers).one().unwrap_err();
        assert!(
            matches!(err, ResolveError::Ambiguous { ref candidates, .. } if candidates.len() == 2)
        );
        let none: ContainerSelector = "zz".parse().unwrap();
        assert!(none.resolve(&containers).one().unwrap_err().is_not_found());
    }
}
