//! Close-version policy rules (issue 15, docs/ARCHITECTURE.md *Versioning:
//! per-file snapshots and close versions*). Only the rule language is
//! built: parsing, validation and matching. Storing the list in the volume
//! and the FUSE release hook are not built yet.

use crate::error::{FsError, Result};

/// Longest rule text in bytes.
pub const MAX_RULE: usize = 255;
/// Rules per volume at most.
pub const MAX_RULES: usize = 256;

/// One rule: `dir/` a subtree, or a glob (`*`, `?`) on the base name;
/// a leading `!` makes a match exclude the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub exclude: bool,
    pub subtree: bool,
    pub pattern: String,
}

impl Rule {
    /// Parse one rule; a bad one is refused naming the cause.
    pub fn parse(text: &str) -> Result<Rule> {
        if text.len() > MAX_RULE {
            return Err(FsError::Invalid("version rule longer than 255 bytes"));
        }
        if text.contains('\0') {
            return Err(FsError::Invalid("version rule contains NUL"));
        }
        let (exclude, body) = match text.strip_prefix('!') {
            Some(b) => (true, b),
            None => (false, text),
        };
        let (subtree, pattern) = match body.strip_suffix('/') {
            Some(p) => (true, p),
            None => (false, body),
        };
        if pattern.is_empty() {
            return Err(FsError::Invalid("version rule is empty"));
        }
        if pattern.starts_with('/') || pattern.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
            return Err(FsError::Invalid("version rule path must be relative, without empty, . or .. parts"));
        }
        if !subtree && pattern.contains('/') {
            return Err(FsError::Invalid("version rule: a name pattern has no '/' (end a subtree with '/')"));
        }
        Ok(Rule { exclude, subtree, pattern: pattern.to_string() })
    }

    /// Does the rule match `path` (relative to the volume root, no leading '/')?
    pub fn matches(&self, path: &str) -> bool {
        if self.subtree {
            return path.strip_prefix(self.pattern.as_str()).is_some_and(|r| r.starts_with('/'));
        }
        let base = path.rsplit('/').next().unwrap_or(path);
        glob(self.pattern.as_bytes(), base.as_bytes())
    }
}

/// First matching rule decides; no match: not versioned.
pub fn versioned(rules: &[Rule], path: &str) -> bool {
    rules.iter().find(|r| r.matches(path)).is_some_and(|r| !r.exclude)
}

/// `*` any run, `?` one byte; iterative with one backtrack point, so the
/// work is bounded by pattern length times name length.
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(list: &[&str]) -> Vec<Rule> {
        list.iter().map(|r| Rule::parse(r).unwrap()).collect()
    }

    #[test]
    fn c_files_yes_o_files_no() {
        let r = rules(&["*.c", "!*.o"]);
        assert!(versioned(&r, "src/main.c"));
        assert!(versioned(&r, "x.c"));
        assert!(!versioned(&r, "src/main.o"));
        assert!(!versioned(&r, "main.cc"));
        assert!(!versioned(&r, "c"));
    }

    #[test]
    fn subtree_and_first_match_wins() {
        let r = rules(&["!docs/tmp/", "docs/", "a?.txt"]);
        assert!(versioned(&r, "docs/x"));
        assert!(versioned(&r, "docs/sub/y.o"));
        assert!(!versioned(&r, "docs/tmp/z"));
        assert!(!versioned(&r, "docsx/y"));
        assert!(!versioned(&r, "docs"));
        assert!(versioned(&r, "q/ab.txt"));
        assert!(!versioned(&r, "q/abc.txt"));
    }

    #[test]
    fn glob_edges() {
        assert!(glob(b"*", b""));
        assert!(glob(b"a*b*c", b"axxbyyc"));
        assert!(!glob(b"a*b*c", b"axxbyy"));
        assert!(glob(b"**x", b"yx"));
        assert!(!glob(b"", b"a"));
    }

    #[test]
    fn bad_rules_are_refused_with_their_cause() {
        for (text, cause) in [
            ("", "empty"),
            ("!", "empty"),
            ("/", "empty"),
            ("/abs/", "relative"),
            ("a//b/", "relative"),
            ("../x/", "relative"),
            ("a/*.c", "no '/'"),
            ("a\0b", "NUL"),
        ] {
            match Rule::parse(text) {
                Err(FsError::Invalid(m)) => assert!(m.contains(cause), "{text:?}: {m}"),
                other => panic!("{text:?} accepted: {other:?}"),
            }
        }
        assert!(Rule::parse(&"x".repeat(MAX_RULE + 1)).is_err());
        assert!(Rule::parse(&"x".repeat(MAX_RULE)).is_ok());
    }
}
