//! Parsers for the flags' units: durations (`60s`, `500ms`, `2m`) and rates (`50/s`).

use std::time::Duration;

/// A duration: a number followed by `ms`, `s`, `m` or `h`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (like 60s, 500ms, 2m)"))?;
    let scale = match unit.trim() {
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("unknown duration unit {other:?} (ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(value * scale).map_err(|e| format!("{text:?}: {e}"))
}

/// A rate in events per second: `50/s`, `3000/m`, `2/ms` or a bare `50`. Zero turns the
/// class off.
pub fn parse_rate(text: &str) -> Result<f64, String> {
    let text = text.trim();
    let (number, per) = text.split_once('/').unwrap_or((text, "s"));
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a rate (like 50/s)"))?;
    let per_s = match per.trim() {
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => return Err(format!("unknown rate unit /{other} (/s, /m, /h)")),
    };
    let rate = value / per_s;
    if !rate.is_finite() || rate < 0.0 {
        return Err(format!("{text:?}: a rate must be a finite number ≥ 0"));
    }
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("50/s"), Ok(50.0));
        assert_eq!(parse_rate("50"), Ok(50.0));
        assert_eq!(parse_rate("120/m"), Ok(2.0));
        assert_eq!(parse_rate("0"), Ok(0.0));
        assert!(parse_rate("-3/s").is_err());
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("5/day").is_err());
    }
}
