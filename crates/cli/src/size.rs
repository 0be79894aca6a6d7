//! Human sizes: `4096`, `512K`, `64M`, `10G`, `1T`, `2GiB` (binary units).

pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        Some('T' | 't') => (&t[..t.len() - 1], 40),
        Some('P' | 'p') => (&t[..t.len() - 1], 50),
        _ => (t, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("invalid size {s:?}: use a number with an optional K, M, G, T or P suffix"))?;
    n.checked_mul(1u64 << shift)
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("invalid size {s:?}: must be above zero and below 16 EiB"))
}

/// `parse_size`, or "0" (a feature's size that turns it off).
pub fn parse_size_or_zero(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    parse_size(s)
}

pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_rejects_junk() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1t"), Ok(1 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("0").is_err());
        assert_eq!(parse_size_or_zero("0"), Ok(0));
        assert_eq!(parse_size_or_zero("64M"), Ok(64 << 20));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999P").is_err());
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(3 << 30), "3.00 GiB");
    }
}
