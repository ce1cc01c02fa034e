//! Byte sizes as people write them (`40GiB`, `512MiB`, `80GB`, `1073741824`) and back.

/// Parses a positive byte size. Binary units (KiB … PiB) are powers of 1024, decimal units
/// (KB … PB) powers of 1000; a bare number is bytes, written whole (exact up to 2^63) or with a
/// fraction or exponent (`1.5e15`). Below-byte fractions are floored: a size is never rounded up.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let (number, unit) = split_unit(text);
    if unit.is_empty()
        && let Ok(bytes) = number.parse::<u64>()
    {
        return if (1..1 << 63).contains(&bytes) {
            Ok(bytes)
        } else {
            Err(format!(
                "`{text}`: expected a size of at least one byte and below 2^63"
            ))
        };
    }
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "pb" => 1e15,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        "pib" => 1024f64.powi(5),
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (expected B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB or PiB)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}`: expected a positive size such as 40GiB, 512MiB or 80GB"))?;
    let bytes = (value * scale).floor();
    if !(bytes >= 1.0 && bytes < 2f64.powi(63)) {
        return Err(format!(
            "`{text}`: expected a size of at least one byte and below 2^63"
        ));
    }
    Ok(bytes as u64)
}

/// A byte count of the model (f64, DESIGN §3.3) as whole bytes, rounded up: a reported peak is
/// never below the bytes the model counts.
pub fn whole_bytes(bytes: f64) -> u64 {
    bytes.ceil() as u64
}

/// Splits `12.5GiB` into `("12.5", "GiB")` and `1.5e15` into `("1.5e15", "")` (surrounding and
/// inner white space dropped).
fn split_unit(text: &str) -> (&str, &str) {
    let t = text.trim();
    let mantissa = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let rest = &t[mantissa..];
    let exponent = match rest.strip_prefix(['e', 'E']) {
        Some(e) => {
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            let count = digits
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(digits.len());
            if count > 0 {
                1 + (e.len() - digits.len()) + count
            } else {
                0
            }
        }
        None => 0,
    };
    let split = mantissa + exponent;
    let (number, unit) = t.split_at(split);
    (number, unit.trim())
}

/// Renders bytes with a binary unit and two decimals (`12.50 GiB`).
pub fn format_bytes(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// Parses a positive duration (`8.5s`, `850ms`, `1200us`, `1200µs`) into microseconds.
pub fn parse_duration_us(text: &str) -> Result<f64, String> {
    let (number, unit) = split_unit(text);
    let scale = match unit {
        "s" => 1e6,
        "ms" => 1e3,
        "us" | "µs" => 1.0,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (expected s, ms or us)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}`: expected a positive duration such as 8.5s or 900ms"))?;
    if !(value > 0.0 && value.is_finite()) {
        return Err(format!("`{text}`: expected a positive duration"));
    }
    Ok(value * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_decimal_and_plain_sizes() {
        assert_eq!(parse_bytes("40GiB").unwrap(), 40 * (1 << 30));
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 * (1 << 20));
        assert_eq!(parse_bytes("80GB").unwrap(), 80_000_000_000);
        assert_eq!(parse_bytes("1.5 GiB").unwrap(), 3 * (1 << 29));
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("85899345920").unwrap(), 80 * (1 << 30));
        assert_eq!(parse_bytes("1.5e15").unwrap(), 1_500_000_000_000_000);
        assert_eq!(parse_bytes("1PiB").unwrap(), 1 << 50);
        assert_eq!(parse_bytes("2PB").unwrap(), 2_000_000_000_000_000);
        // Exact beyond f64's 2^53, and never rounded up.
        assert_eq!(
            parse_bytes("9007199254740993").unwrap(),
            9_007_199_254_740_993
        );
        assert_eq!(parse_bytes("1.9").unwrap(), 1);
        assert_eq!(parse_bytes("1.0000001KiB").unwrap(), 1024);
    }

    #[test]
    fn rejects_zero_negative_and_unknown_units() {
        assert!(
            parse_bytes("0GiB")
                .unwrap_err()
                .contains("at least one byte")
        );
        assert!(parse_bytes("-3GiB").is_err());
        assert!(
            parse_bytes("3 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(parse_bytes("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_us("8.5s").unwrap(), 8.5e6);
        assert_eq!(parse_duration_us("900ms").unwrap(), 9e5);
        assert_eq!(parse_duration_us("12us").unwrap(), 12.0);
        assert!(parse_duration_us("0s").is_err());
        assert!(parse_duration_us("3h").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_bytes(512.0), "512 B");
        assert_eq!(format_bytes(1.5 * 1024.0 * 1024.0 * 1024.0), "1.50 GiB");
    }
}
