//! Kubernetes byte quantities (`64Mi`, `1G`, `512000`), the subset memory limits need.

/// Parses a byte quantity such as `64Mi` into bytes.
pub fn parse_bytes(q: &str) -> Result<usize, String> {
    let q = q.trim();
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (digits, suffix) = q.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{q}` is not a quantity; write e.g. `64Mi` or `128M`"))?;
    let unit: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        other => {
            return Err(format!(
                "`{q}`: unknown unit `{other}`; use Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E"
            ));
        }
    };
    n.checked_mul(unit)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| format!("`{q}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(parse_bytes("64Mi"), Ok(64 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_bytes("512"), Ok(512));
        assert_eq!(parse_bytes("1Ti"), Ok(1 << 40));
        assert!(parse_bytes("99999Ei").unwrap_err().contains("too large"));
        assert!(
            parse_bytes("64MB")
                .unwrap_err()
                .contains("unknown unit `MB`")
        );
        assert!(parse_bytes("lots").unwrap_err().contains("not a quantity"));
    }
}
