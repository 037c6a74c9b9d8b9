//! Flag values read as upstream's command line reads them (Go's strconv and time, pflag's
//! value types): `010` is octal, `t` is true, a duration needs its unit.

use std::net::IpAddr;

use super::super::duration::GoDuration;

/// Why a flag's value could not be read; the caller adds the flag's name.
pub type ValueError = String;

/// Go's `strconv.ParseBool`.
pub fn parse_bool(text: &str) -> Result<bool, ValueError> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "strconv.ParseBool: parsing {text:?}: invalid syntax"
        )),
    }
}

/// Go's `strconv.ParseInt(text, 0, 32)`: a sign, then `0x`/`0o`/`0b` or a leading `0`
/// (octal) selects the base; underscores may separate digits after a prefix.
/// A non-negative int32, refused as pflag refuses a negative uint32.
pub fn parse_uint32(text: &str) -> Result<i32, ValueError> {
    match parse_int32(text)? {
        negative if negative < 0 => Err(format!(
            "strconv.ParseUint: parsing {text:?}: invalid syntax"
        )),
        count => Ok(count),
    }
}

pub fn parse_int32(text: &str) -> Result<i32, ValueError> {
    let invalid = || format!("strconv.ParseInt: parsing {text:?}: invalid syntax");
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let lower = digits.to_ascii_lowercase();
    let (radix, body, prefixed) = if let Some(rest) = lower.strip_prefix("0x") {
        (16, rest.to_string(), true)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (8, rest.to_string(), true)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (2, rest.to_string(), true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_string(), true)
    } else {
        (10, lower.clone(), false)
    };
    if body.is_empty() || (!prefixed && body.contains('_')) {
        return Err(invalid());
    }
    let cleaned: String = body.chars().filter(|c| *c != '_').collect();
    let magnitude = i64::from_str_radix(&cleaned, radix).map_err(|_| invalid())?;
    let value = if negative { -magnitude } else { magnitude };
    i32::try_from(value)
        .map_err(|_| format!("strconv.ParseInt: parsing {text:?}: value out of range"))
}

/// Go's `strconv.ParseFloat(text, 32)`.
pub fn parse_float32(text: &str) -> Result<f32, ValueError> {
    text.parse::<f32>()
        .map_err(|_| format!("strconv.ParseFloat: parsing {text:?}: invalid syntax"))
}

/// Go's `time.ParseDuration`.
pub fn parse_duration(text: &str) -> Result<GoDuration, ValueError> {
    GoDuration::parse(text).map_err(|err| err.to_string())
}

/// A klog level: `strconv.ParseUint(text, 10, 31)`.
pub fn parse_level(text: &str) -> Result<u32, ValueError> {
    text.parse::<u32>()
        .ok()
        .filter(|level| *level <= i32::MAX as u32)
        .ok_or_else(|| format!("strconv.ParseUint: parsing {text:?}: invalid syntax"))
}

/// pflag's string slice: comma-separated values, double quotes allowed around one.
pub fn parse_list(text: &str) -> Result<Vec<String>, ValueError> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let mut values = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                current.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => values.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    if quoted {
        return Err(format!("{text:?}: unterminated quote"));
    }
    values.push(current);
    Ok(values)
}

/// component-base's `mapStringBool`: `key=bool[,key=bool...]`, blanks trimmed, empty items
/// skipped.
pub fn parse_bool_map(text: &str) -> Result<Vec<(String, bool)>, ValueError> {
    let mut pairs = Vec::new();
    for item in text.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let Some((key, value)) = item.split_once('=') else {
            return Err(format!("malformed pair, expect string=bool: {item:?}"));
        };
        let value = value.trim();
        let parsed = parse_bool(value)
            .map_err(|err| format!("invalid value of {}: {value}, err: {err}", key.trim()))?;
        pairs.push((key.trim().to_string(), parsed));
    }
    Ok(pairs)
}

/// pflag's `ip` value, read leniently as upstream (leading zeros allowed).
pub fn parse_ip(text: &str) -> Result<IpAddr, ValueError> {
    crate::model::address::parse_ip(text)
        .ok_or_else(|| format!("{text:?} is not a valid IP address"))
}

/// Upstream's `ipport` value: an IP, or `IP:port` (`[IPv6]:port`).
pub fn parse_ip_port(text: &str) -> Result<String, ValueError> {
    if parse_ip(text).is_ok() {
        return Ok(text.to_string());
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("{text:?} is not in a valid format (ip or ip:port)"));
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    parse_ip(host)?;
    port.parse::<u16>()
        .map_err(|_| format!("{port:?} is not a valid number"))?;
    Ok(text.to_string())
}

/// A resource quantity (`512`, `1K`, `2Ki`, `3M`): checked for shape, kept as written.
pub fn parse_quantity(text: &str) -> Result<String, ValueError> {
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &text[digits.len()..];
    let known = [
        "", "k", "K", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    if digits.parse::<f64>().is_ok() && known.contains(&suffix) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text:?}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_read_as_go_reads_them() {
        assert_eq!(parse_int32("-998"), Ok(-998));
        assert_eq!(parse_int32("010"), Ok(8));
        assert_eq!(parse_int32("0x10"), Ok(16));
        assert_eq!(parse_int32("0b101"), Ok(5));
        assert_eq!(parse_int32("0"), Ok(0));
        assert_eq!(parse_int32("0x_10"), Ok(16));
        assert!(parse_int32("1_000").is_err());
        assert!(parse_int32("3000000000").is_err());
        assert!(parse_int32("").is_err());
        assert!(parse_int32("09").is_err());
        assert_eq!(parse_float32("5"), Ok(5.0));
        assert_eq!(parse_level("4"), Ok(4));
        assert!(parse_level("-1").is_err());
    }

    #[test]
    fn booleans_and_lists_and_maps() {
        for yes in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(yes), Ok(true));
        }
        assert!(parse_bool("yes").is_err());
        assert_eq!(parse_list("a,b"), Ok(vec!["a".into(), "b".into()]));
        assert_eq!(parse_list("\"a,b\",c"), Ok(vec!["a,b".into(), "c".into()]));
        assert_eq!(parse_list(""), Ok(vec![]));
        assert_eq!(
            parse_bool_map(" A=true, B=false,,"),
            Ok(vec![("A".into(), true), ("B".into(), false)])
        );
        assert!(parse_bool_map("A").is_err());
        assert!(parse_bool_map("A=maybe").is_err());
    }

    #[test]
    fn addresses_and_quantities() {
        assert!(parse_ip("0.0.0.0").is_ok());
        assert!(parse_ip("010.0.0.1").is_ok());
        assert!(parse_ip("nope").is_err());
        assert_eq!(parse_ip_port("127.0.0.1"), Ok("127.0.0.1".into()));
        assert_eq!(parse_ip_port("[::1]:10256"), Ok("[::1]:10256".into()));
        assert!(parse_ip_port("127.0.0.1:x").is_err());
        assert!(parse_quantity("2Ki").is_ok());
        assert!(parse_quantity("lots").is_err());
        assert!(parse_duration("1m").is_ok());
        assert!(parse_duration("300").is_err());
    }
}
