//! `VOL@SNAP` and `VOL` arguments. Checked here so that a typo gets a usage
//! message (exit 2) before any pool is opened; the engine still validates
//! the names themselves (characters, length).

use std::fmt;

/// A snapshot named on the command line: `VOL@SNAP`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapSpec {
    pub volume: String,
    pub name: String,
}

impl fmt::Display for SnapSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.volume, self.name)
    }
}

/// A volume's head (`VOL`) or one of its snapshots (`VOL@SNAP`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewSpec {
    Head(String),
    Snapshot(SnapSpec),
}

impl fmt::Display for ViewSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ViewSpec::Head(v) => write!(f, "{v}"),
            ViewSpec::Snapshot(s) => write!(f, "{s}"),
        }
    }
}

impl ViewSpec {
    pub fn volume(&self) -> &str {
        match self {
            ViewSpec::Head(v) => v,
            ViewSpec::Snapshot(s) => &s.volume,
        }
    }
}

/// clap value parser for `VOL@SNAP`.
pub fn parse_snap(s: &str) -> Result<SnapSpec, String> {
    let Some((volume, name)) = s.split_once('@') else {
        return Err(format!("{s:?} names no snapshot: expected VOL@SNAPSHOT"));
    };
    if volume.is_empty() || name.is_empty() {
        return Err(format!("{s:?} has an empty part: expected VOL@SNAPSHOT, both non-empty"));
    }
    if name.contains('@') {
        return Err(format!("{s:?} has more than one '@': snapshot names may not contain '@'"));
    }
    Ok(SnapSpec { volume: volume.to_string(), name: name.to_string() })
}

/// clap value parser for `VOL` or `VOL@SNAP`.
pub fn parse_view(s: &str) -> Result<ViewSpec, String> {
    if s.contains('@') {
        return parse_snap(s).map(ViewSpec::Snapshot);
    }
    if s.is_empty() {
        return Err("empty volume name: expected VOL or VOL@SNAPSHOT".to_string());
    }
    Ok(ViewSpec::Head(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_specs() {
        assert_eq!(parse_snap("vm1@daily").map(|s| s.to_string()), Ok("vm1@daily".to_string()));
        assert!(parse_snap("vm1").is_err());
        assert!(parse_snap("vm1@").is_err());
        assert!(parse_snap("@daily").is_err());
        assert!(parse_snap("@").is_err());
        assert!(parse_snap("a@b@c").is_err());
    }

    #[test]
    fn view_specs() {
        assert_eq!(parse_view("vm1"), Ok(ViewSpec::Head("vm1".into())));
        assert_eq!(parse_view("vm1@s").map(|v| v.volume().to_string()), Ok("vm1".into()));
        assert!(parse_view("").is_err());
        assert!(parse_view("vm1@").is_err());
    }
}
