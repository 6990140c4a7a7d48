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
}
