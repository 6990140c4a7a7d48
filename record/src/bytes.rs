//! Byte counts as memory_summary() prints them (binary units), for the terminal, the
//! estimate's table and the dashboard alike.
//!
//! May call: nothing. Called by: everything that prints bytes.

const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];

/// `bytes` with two decimals in the largest binary unit it reaches ("3.00 MiB").
pub fn format_bytes(bytes: u64) -> String {
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// [`format_bytes`] of a chart value, without a ".00" tail ("3 MiB"); negative and
/// fractional values are clamped and rounded.
pub fn short_bytes(value: f64) -> String {
    format_bytes(value.max(0.0).round() as u64).replace(".00", "")
}

/// Size units a size may end with, longest first.
const SUFFIXES: [(&str, u64); 10] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("PB", 1_000_000_000_000_000),
    ("TB", 1_000_000_000_000),
    ("GB", 1_000_000_000),
    ("MB", 1_000_000),
    ("KB", 1_000),
    ("B", 1),
];

/// A size as people write it: "3GiB", "5.4 GB", "512 MiB" or "1000000" (bytes); `None`
/// when it is not one or not in [1, `max`] bytes.
pub fn parse_bytes(text: &str, max: u64) -> Option<u64> {
    let t = text.trim();
    let bytes = match SUFFIXES.iter().find_map(|(suffix, scale)| Some((t.strip_suffix(suffix)?, *scale))) {
        Some((number, scale)) => {
            let value: f64 = number.trim().parse().ok()?;
            let bytes = value * scale as f64;
            if !(value.is_finite() && bytes >= 1.0 && bytes <= max as f64) {
                return None;
            }
            bytes as u64
        }
        None => t.parse::<u64>().ok()?,
    };
    (1..=max).contains(&bytes).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(3 << 20), "3.00 MiB");
        assert_eq!(short_bytes((3u64 << 30) as f64), "3 GiB");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("3GiB", u64::MAX), Some(3 << 30));
        assert_eq!(parse_bytes(" 5.4 GB ", u64::MAX), Some(5_400_000_000));
        assert_eq!(parse_bytes("1000", u64::MAX), Some(1000));
        for bad in ["", "0", "0 MiB", "-1GiB", "GiB", "3 parsecs", "0.8", "nan GB"] {
            assert_eq!(parse_bytes(bad, u64::MAX), None, "{bad}");
        }
        assert_eq!(parse_bytes("2 KiB", 1024), None);
    }
}
