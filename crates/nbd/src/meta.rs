//! Metadata contexts (pure): which contexts an export offers, which of
//! them a `NBD_OPT_LIST_META_CONTEXT` or `NBD_OPT_SET_META_CONTEXT` query
//! list matches, and their context IDs.
//!
//! Every export offers `base:allocation`; [`crate::Export::meta_contexts`]
//! adds more, e.g. qemu's `qemu:dirty-bitmap:NAME`. Query syntax:
//!
//! * an exact context name matches that context (LIST and SET);
//! * on LIST only, a query ending in `:` is a prefix wildcard: `base:`,
//!   `qemu:` and `qemu:dirty-bitmap:` list every offered context starting
//!   with it (qemu's convention, and proto.md's empty leaf-name wildcard);
//!   SET ignores such queries, as proto.md says it should;
//! * on LIST, no query at all lists every context; on SET it selects none;
//! * anything else (unknown names and namespaces) matches nothing.

use std::collections::HashSet;

use crate::protocol::{BASE_ALLOCATION, MAX_STRING_LEN};

/// Queries accepted in one LIST/SET request; more get `NBD_REP_ERR_TOO_BIG`
/// (the reply cost is queries x contexts, so both are bounded).
pub(crate) const MAX_META_QUERIES: usize = 64;
/// Contexts considered per export, `base:allocation` included.
pub(crate) const MAX_META_CONTEXTS: usize = 1024;

/// A context selected with `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetaContext {
    pub id: u32,
    pub name: String,
}

impl MetaContext {
    /// Served by [`crate::Export::block_status`] rather than `context_status`.
    pub(crate) fn is_base_allocation(&self) -> bool {
        self.name == BASE_ALLOCATION
    }
}

/// Whether an export may offer `name` as an extra context: a valid NBD
/// string of the form `namespace:leaf` with a namespace of printable,
/// non-whitespace characters other than `:` (proto.md), not `base` (that
/// namespace is the server's), and a non-empty leaf not ending in `:` (so
/// that a wildcard query never names a context exactly).
pub(crate) fn valid_extra_name(name: &str) -> bool {
    let Some((ns, leaf)) = name.split_once(':') else { return false };
    name.len() <= MAX_STRING_LEN
        && !name.contains('\0')
        && !ns.is_empty()
        && ns != "base"
        && ns.chars().all(|c| !c.is_whitespace() && !c.is_control())
        && !leaf.is_empty()
        && !leaf.ends_with(':')
}

/// Every context of an export, `base:allocation` first, then the export's
/// valid extra names in its order, without duplicates, at most
/// [`MAX_META_CONTEXTS`] in all. A context's ID is its index here plus one,
/// so `base:allocation` is always ID 1 and IDs are unique.
pub(crate) fn offered(extras: Vec<String>) -> Vec<String> {
    let mut out = vec![BASE_ALLOCATION.to_owned()];
    let mut seen: HashSet<String> = HashSet::new();
    let total = extras.len();
    for name in extras {
        if out.len() >= MAX_META_CONTEXTS {
            log::warn!("nbd: export offers {total} metadata contexts; only the first ones are used");
            break;
        }
        if !valid_extra_name(&name) {
            log::warn!("nbd: export offers an invalid metadata context name {:?}; ignored", clip(&name));
            continue;
        }
        if seen.insert(name.clone()) {
            out.push(name);
        }
    }
    out
}

/// At most 80 bytes of a name, for logs.
fn clip(s: &str) -> &str {
    let mut end = s.len().min(80);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// LIST: the offered contexts matching a query (all of them without
/// queries), in the export's order.
pub(crate) fn list<'a>(offered: &'a [String], queries: &[String]) -> Vec<&'a str> {
    let matches = |c: &str| queries.iter().any(|q| q == c || (q.ends_with(':') && c.starts_with(q.as_str())));
    offered.iter().map(String::as_str).filter(|c| queries.is_empty() || matches(c)).collect()
}

/// SET: the offered contexts named exactly by a query, in query order,
/// each once.
pub(crate) fn select(offered: &[String], queries: &[String]) -> Vec<MetaContext> {
    let mut out: Vec<MetaContext> = Vec::new();
    for q in queries {
        let Some(i) = offered.iter().position(|c| c == q) else { continue };
        if out.iter().any(|c| c.name == *q) {
            continue;
        }
        // i < MAX_META_CONTEXTS, so the ID fits.
        out.push(MetaContext { id: i as u32 + 1, name: q.clone() });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names() {
        for ok in ["qemu:dirty-bitmap:a", "x-tarn:changed", "qemu:allocation-depth", "a:b:c"] {
            assert!(valid_extra_name(ok), "{ok}");
        }
        let long = format!("qemu:dirty-bitmap:{}", "a".repeat(MAX_STRING_LEN));
        for bad in
            ["", "nocolon", ":leaf", "ns:", "qemu:dirty-bitmap:", "base:allocation", "base:x", "a b:c", "a:\0", &long]
        {
            assert!(!valid_extra_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn offered_contexts() {
        let o = offered(strings(&["qemu:dirty-bitmap:a", "bad", "base:allocation", "qemu:dirty-bitmap:a", "x:y"]));
        assert_eq!(o, ["base:allocation", "qemu:dirty-bitmap:a", "x:y"]);
        let many: Vec<String> = (0..5000).map(|i| format!("x:{i}")).collect();
        let o = offered(many);
        assert_eq!(o.len(), MAX_META_CONTEXTS);
        assert_eq!(o[MAX_META_CONTEXTS - 1], format!("x:{}", MAX_META_CONTEXTS - 2));
    }

    #[test]
    fn list_queries() {
        let o = offered(strings(&["qemu:dirty-bitmap:a", "qemu:dirty-bitmap:b", "x-t:c"]));
        let l = |q: &[&str]| list(&o, &strings(q));
        assert_eq!(l(&[]), ["base:allocation", "qemu:dirty-bitmap:a", "qemu:dirty-bitmap:b", "x-t:c"]);
        assert_eq!(l(&["base:"]), ["base:allocation"]);
        assert_eq!(l(&["qemu:"]), ["qemu:dirty-bitmap:a", "qemu:dirty-bitmap:b"]);
        assert_eq!(l(&["qemu:dirty-bitmap:"]), ["qemu:dirty-bitmap:a", "qemu:dirty-bitmap:b"]);
        assert_eq!(l(&["qemu:dirty-bitmap:b", "base:allocation", "base:"]), ["base:allocation", "qemu:dirty-bitmap:b"]);
        assert!(l(&["qemu:dirty-bitmap:z", "qemu", "qemu:dirty", "nope:", ":", ""]).is_empty());
    }

    #[test]
    fn set_queries() {
        let o = offered(strings(&["qemu:dirty-bitmap:a", "qemu:dirty-bitmap:b"]));
        let s = |q: &[&str]| select(&o, &strings(q));
        assert!(s(&[]).is_empty());
        assert!(s(&["base:", "qemu:", "qemu:dirty-bitmap:", "qemu:dirty-bitmap:zz"]).is_empty());
        let got = s(&["qemu:dirty-bitmap:b", "x:y", "base:allocation", "qemu:dirty-bitmap:b"]);
        assert_eq!(
            got,
            [
                MetaContext { id: 3, name: "qemu:dirty-bitmap:b".into() },
                MetaContext { id: 1, name: BASE_ALLOCATION.into() }
            ]
        );
        assert!(got[1].is_base_allocation() && !got[0].is_base_allocation());
    }
}
