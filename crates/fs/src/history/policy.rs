//! Close-version policy rules (issue 15, docs/ARCHITECTURE.md *Versioning:
//! per-file snapshots and close versions*): parsing, validation, matching,
//! and the encoding of the rule list kept in the policy object
//! (docs/FORMAT.md *File volumes*, close versions).

use crate::error::{FsError, Result};
use tarn_format::checksum::crc32c;

const POLICY_MAGIC: &[u8; 4] = b"TFSP";
const POLICY_VERSION: u8 = 1;
/// The policy object's header length; the rules follow.
pub const POLICY_HEADER: usize = 24;
/// The longest policy object: every rule at its longest.
pub const MAX_POLICY_BYTES: usize = POLICY_HEADER + MAX_RULES * (1 + MAX_RULE);

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
            return Err(FsError::Invalid("rule longer than 255 bytes"));
        }
        if text.contains('\0') {
            return Err(FsError::Invalid("rule contains NUL"));
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
            return Err(FsError::Invalid("rule is empty"));
        }
        if pattern.starts_with('/') || pattern.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
            return Err(FsError::Invalid("rule path must be relative, without empty, . or .. parts"));
        }
        if !subtree && pattern.contains('/') {
            return Err(FsError::Invalid("rule: a name pattern has no '/' (end a subtree with '/')"));
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

impl Rule {
    /// The rule as written (what `parse` takes back).
    pub fn text(&self) -> String {
        let mut t = String::with_capacity(self.pattern.len() + 2);
        if self.exclude {
            t.push('!');
        }
        t.push_str(&self.pattern);
        if self.subtree {
            t.push('/');
        }
        t
    }
}

/// The policy object's bytes: header (magic, version, count, body
/// length, crc32c over header and body), then each rule as `len u8` and
/// its text.
pub fn encode(rules: &[Rule]) -> Vec<u8> {
    let mut body = Vec::new();
    rules.iter().for_each(|r| put_rule(&mut body, r));
    frame(POLICY_MAGIC, rules.len(), &body)
}

/// A rule as a rule list's body keeps it: `len u8` and its text.
pub(crate) fn put_rule(body: &mut Vec<u8>, r: &Rule) {
    let t = r.text();
    body.push(t.len() as u8);
    body.extend_from_slice(t.as_bytes());
}

/// A rule list object (this policy, or the layout policy of
/// `layoutrules.rs`): the 24-byte header before `body`, sealed.
pub(crate) fn frame(magic: &[u8; 4], count: usize, body: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; POLICY_HEADER];
    b[..4].copy_from_slice(magic);
    b[4] = POLICY_VERSION;
    b[8..12].copy_from_slice(&(count as u32).to_le_bytes());
    b[12..16].copy_from_slice(&(body.len() as u32).to_le_bytes());
    b.extend_from_slice(body);
    let crc = crc32c(&b);
    b[16..20].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The body length a rule list header says (bounded by `max` bytes in
/// all), to read the rest.
pub(crate) fn body_len_within(head: &[u8], max: usize, what: &'static str) -> Result<usize> {
    let len = head.get(12..16).map_or(0, |x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]) as usize);
    if len > max - POLICY_HEADER {
        return Err(FsError::corrupt(what, 0, format!("body of {len} bytes")));
    }
    Ok(len)
}

/// The body length a policy header says (bounded), to read the rest.
pub fn body_len(head: &[u8]) -> Result<usize> {
    body_len_within(head, MAX_POLICY_BYTES, "version policy")
}

/// Check a rule list object's header and checksum (never trusted):
/// its rule count, bounded by MAX_RULES.
pub(crate) fn unframe(b: &[u8], magic: &[u8; 4], max: usize, what: &'static str) -> Result<usize> {
    let bad = |d: String| FsError::corrupt(what, 0, d);
    if b.len() < POLICY_HEADER || &b[..4] != magic || b[4] != POLICY_VERSION {
        return Err(bad("magic or version".into()));
    }
    let count = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
    let len = body_len_within(b, max, what)?;
    if count > MAX_RULES || b.len() != POLICY_HEADER + len {
        return Err(bad(format!("{count} rules, {len} bytes")));
    }
    let mut zeroed = b.to_vec();
    zeroed[16..20].fill(0);
    if crc32c(&zeroed).to_le_bytes() != b[16..20] {
        return Err(bad("checksum mismatch".into()));
    }
    Ok(count)
}

/// The rule at `b[at..]` (`len u8`, text) and where the next item starts.
pub(crate) fn take_rule(b: &[u8], at: usize, what: &'static str) -> Result<(Rule, usize)> {
    let bad = |d: String| FsError::corrupt(what, 0, d);
    let n = *b.get(at).ok_or_else(|| bad("truncated".into()))? as usize;
    let t = b.get(at + 1..at + 1 + n).ok_or_else(|| bad("truncated".into()))?;
    let t = std::str::from_utf8(t).map_err(|_| bad("rule not UTF-8".into()))?;
    let rule = Rule::parse(t).map_err(|_| bad(format!("rule {t:?} does not parse")))?;
    Ok((rule, at + 1 + n))
}

/// Decode a policy object with every check (never trusted).
pub fn decode(b: &[u8]) -> Result<Vec<Rule>> {
    let what = "version policy";
    let count = unframe(b, POLICY_MAGIC, MAX_POLICY_BYTES, what)?;
    let (mut at, mut rules) = (POLICY_HEADER, Vec::with_capacity(count));
    for _ in 0..count {
        let (rule, next) = take_rule(b, at, what)?;
        rules.push(rule);
        at = next;
    }
    if at != b.len() {
        return Err(FsError::corrupt(what, 0, "bytes after the last rule"));
    }
    Ok(rules)
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

    /// Pins the policy object's layout (docs/FORMAT.md *File volumes*).
    #[test]
    fn golden_policy_object_and_damage() {
        let b = encode(&rules(&["*.c", "!a/"]));
        assert_eq!(&b[..16], &[b'T', b'F', b'S', b'P', 1, 0, 0, 0, 2, 0, 0, 0, 8, 0, 0, 0]);
        assert_eq!(&b[20..], &[0, 0, 0, 0, 3, b'*', b'.', b'c', 3, b'!', b'a', b'/']);
        assert_eq!(decode(&b).unwrap(), rules(&["*.c", "!a/"]));
        for at in 0..b.len() {
            let mut d = b.clone();
            d[at] ^= 0x40;
            assert!(decode(&d).is_err(), "byte {at}");
        }
        assert!(decode(&b[..b.len() - 1]).is_err());
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
