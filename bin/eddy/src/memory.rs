//! `--memory-limit`: a size as PostgreSQL writes memory settings, and the default from the
//! machine (or its cgroup).

/// Bytes in a size such as `2GB`, `512MB`, `64kB`, `1.5GB` or `1073741824` (units are powers
/// of 1024, as PostgreSQL's `kB`/`MB`/`GB`/`TB`; `KiB`, `MiB`, ... are accepted too).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (a number with kB, MB, GB or TB)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" | "kib" | "k" => 1 << 10,
        "mb" | "mib" | "m" => 1 << 20,
        "gb" | "gib" | "g" => 1 << 30,
        "tb" | "tib" | "t" => 1 << 40,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?} (use kB, MB, GB or TB)"
            ));
        }
    };
    let bytes = number * scale as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("{text:?} is too large"));
    }
    Ok(bytes as u64)
}

/// The memory the server may use by default: half of what the machine has, or of the
/// cgroup's limit when it has a lower one (a container).
pub fn default_limit() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    let machine = match (total, cgroup) {
        (Some(t), Some(c)) => t.min(c),
        (t, c) => t.or(c)?,
    };
    Some(machine / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_postgresql_writes_them() {
        assert_eq!(parse_size("2GB"), Ok(2 << 30));
        assert_eq!(parse_size("512MB"), Ok(512 << 20));
        assert_eq!(parse_size("64kB"), Ok(64 << 10));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size(" 1 TB "), Ok(1 << 40));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("3 parsecs").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn the_default_is_half_the_machine() {
        let limit = default_limit().unwrap();
        assert!(limit > 0);
    }
}
