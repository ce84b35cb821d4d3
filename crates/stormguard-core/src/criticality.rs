//! Request criticality: which work a saturated server drops first.
//!
//! See [`Criticality`](crate::Criticality) for what it does and why.

use crate::error::ConfigError;

/// How much a call matters, lowest first (so `min` is "the lower class").
///
/// Retries are not the only work a server can afford to lose. A prefetch, a batch
/// backfill or a speculative call has a caller that can wait or do without; a checkout
/// does not. A call may say so in the `stormguard-criticality` header
/// ([`wire::STORMGUARD_CRITICALITY`](crate::wire::STORMGUARD_CRITICALITY)), one of three
/// lowercase tokens:
///
/// | value | class | shed |
/// |---|---|---|
/// | `sheddable` | [`Criticality::Sheddable`] | first: once its own threshold is passed (by default as soon as it would have to wait) |
/// | `default` | [`Criticality::Default`] | retries past the retry threshold, first attempts when the queue is full (a full queue gives it a queued sheddable call's place first) |
/// | `critical` | [`Criticality::Critical`] | as `default`, but a full queue gives it the place of a waiter of lower criticality (the lowest-ranked, oldest first) |
///
/// Under overload a server sheds **sheddable work first, then retries, then the rest**
/// (`CallClass::rank`). A retry of a critical call
/// is still a retry: the attempt class weighs more than the criticality, because a retry
/// is load already being amplified.
///
/// # What a peer can claim
///
/// Parsing is strict ([`wire::parse_criticality`](crate::wire::parse_criticality)): a missing value, or anything other
/// than exactly one of the three tokens (`"CRITICAL"`, `" critical"`, `"critical,x"`), is
/// [`Criticality::Default`]. A peer gains nothing by sending garbage.
///
/// A peer can never get a higher class than the server allows: the server keeps a
/// [`CriticalityTable`] of the highest class it grants per method (by default
/// `default` for every method, so `critical` is ignored until the service grants it),
/// and a call's class is the lower of what it claims and what the table allows
/// ([`CriticalityTable::resolve`]). A service grants `critical` to the methods whose
/// callers it trusts with it, and can cap a method at `sheddable` (a report endpoint)
/// whatever its callers claim.
///
/// The same table type, on the client, is the class each method's calls are stamped with
/// ([`CriticalityTable::class_for`]).
///
/// ```
/// use stormguard_core::{Criticality, CriticalityTable};
/// use stormguard_core::wire::parse_criticality;
///
/// // The server grants critical to checkout only.
/// let table = CriticalityTable::from_json(r#"{ "criticality": {
///     "default": "default",
///     "methods": { "/shop.Cart/Checkout": "critical", "/shop.Reports/": "sheddable" } } }"#)
///     .expect("valid");
/// let claim = |path, value: &[u8]| table.resolve(path, parse_criticality(Some(value)));
/// assert_eq!(claim("/shop.Cart/Checkout", b"critical"), Criticality::Critical);
/// assert_eq!(claim("/shop.Cart/Add", b"critical"), Criticality::Default);
/// assert_eq!(claim("/shop.Reports/Daily", b"critical"), Criticality::Sheddable);
/// assert_eq!(claim("/shop.Cart/Add", b"sheddable"), Criticality::Sheddable);
/// assert_eq!(table.resolve("/shop.Cart/Add", parse_criticality(None)), Criticality::Default);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Criticality {
    /// Work whose caller can wait or do without: shed before anything else.
    Sheddable,
    /// Ordinary work: what a call without the header, or with a value that cannot be
    /// read, is.
    #[default]
    Default,
    /// Work that must be served if anything is: a full queue gives it the place of a
    /// waiter of lower criticality.
    Critical,
}

impl Criticality {
    /// Every class, lowest first.
    pub const ALL: [Criticality; 3] = [
        Criticality::Sheddable,
        Criticality::Default,
        Criticality::Critical,
    ];

    /// The class a header value names: exactly `critical`, `default` or `sheddable`
    /// (lowercase ASCII, nothing around it); `None` for anything else.
    pub(crate) fn from_value(value: &[u8]) -> Option<Criticality> {
        Criticality::ALL
            .into_iter()
            .find(|c| c.as_str().as_bytes() == value)
    }

    /// The header value: `"critical"`, `"default"` or `"sheddable"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Criticality::Sheddable => "sheddable",
            Criticality::Default => "default",
            Criticality::Critical => "critical",
        }
    }
}

/// A class per method: on a server, the highest class a peer may claim; on a client,
/// the class its calls are stamped with.
///
/// A rule names a full method path (`/pkg.Service/Method`) or a service prefix ending
/// in `/` (`/pkg.Service/`); the exact path wins over a prefix, a longer prefix over a
/// shorter one, and a path no rule names gets `CriticalityTable::default_class`.
/// Memory is what the rules take.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CriticalityTable {
    default_class: Criticality,
    /// (path or prefix, class), sorted by path.
    rules: Vec<(String, Criticality)>,
}

impl CriticalityTable {
    /// A table with `default_class` for every method.
    pub fn new(default_class: Criticality) -> Self {
        CriticalityTable {
            default_class,
            rules: Vec::new(),
        }
    }

    /// Sets the class of `path`: a full method path, or a service prefix ending in `/`.
    /// A path that does not start with `/` is an error naming it.
    pub fn with_method(
        mut self,
        path: impl Into<String>,
        class: Criticality,
    ) -> Result<Self, ConfigError> {
        let path = path.into();
        if !path.starts_with('/') || path.len() < 2 {
            return Err(ConfigError::invalid(
                format!("criticality.methods.{path}"),
                "a method is \"/package.Service/Method\" or a prefix \"/package.Service/\"",
            ));
        }
        match self.rules.binary_search_by(|(p, _)| p.as_str().cmp(&path)) {
            Ok(i) => self.rules[i].1 = class,
            Err(i) => self.rules.insert(i, (path, class)),
        }
        Ok(self)
    }

    /// The class of calls to `path`.
    pub fn class_for(&self, path: &str) -> Criticality {
        let mut best: Option<(usize, Criticality)> = None;
        for (rule, class) in &self.rules {
            let matches = if rule.ends_with('/') {
                path.starts_with(rule.as_str())
            } else {
                path == rule
            };
            // An exact path is at least as long as any prefix of it that also ends in
            // '/', and a full path never ends in '/': the longest match is the best.
            if matches && best.is_none_or(|(len, _)| rule.len() > len) {
                best = Some((rule.len(), *class));
            }
        }
        best.map_or(self.default_class, |(_, class)| class)
    }

    /// A peer's call to `path` claiming `claim` (its `stormguard-criticality` value, read
    /// by [`wire::parse_criticality`](crate::wire::parse_criticality)): the lower of the
    /// claim and what the table allows.
    pub fn resolve(&self, path: &str, claim: Criticality) -> Criticality {
        claim.min(self.class_for(path))
    }
}

#[cfg(test)]
mod tests;
