//! What Redis itself says about the calls made to it, for `big-voucher`: its slow log
//! (every command slower than a threshold, scripts named by the gate's table rather than
//! by SHA1) and its memory.

/// One slow-log entry: how long the call took and what it was.
pub struct Slow {
    micros: i64,
    command: String,
}

async fn redis(url: &str) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url)?;
    Ok(client.get_multiplexed_async_connection().await?)
}

/// Empties the slow log of the Redis at `url` and sets its threshold.
pub async fn slowlog_reset(url: &str, threshold_us: i64) -> anyhow::Result<()> {
    let mut conn = redis(url).await?;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(threshold_us)
        .query_async::<()>(&mut conn)
        .await?;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-max-len")
        .arg(10_000)
        .query_async::<()>(&mut conn)
        .await?;
    redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async::<()>(&mut conn)
        .await?;
    Ok(())
}

/// Every call the slow log kept since the reset, slowest first.
pub async fn slowlog(url: &str) -> anyhow::Result<Vec<Slow>> {
    let mut conn = redis(url).await?;
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(&mut conn)
        .await?;
    let mut slow = Vec::new();
    for entry in entries {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let micros: i64 = fields
            .get(2)
            .map(redis::from_redis_value)
            .transpose()?
            .unwrap_or(0);
        let words: Vec<String> = fields
            .get(3)
            .map(redis::from_redis_value)
            .transpose()?
            .unwrap_or_default();
        let command = match words.as_slice() {
            [verb, sha, ..] if verb.eq_ignore_ascii_case("EVALSHA") => {
                format!("script {}", script_name(sha))
            }
            [verb, key, ..] => format!("{} {}", verb.to_ascii_uppercase(), key_pattern(key)),
            [verb] => verb.to_ascii_uppercase(),
            [] => "?".to_owned(),
        };
        slow.push(Slow { micros, command });
    }
    slow.sort_by_key(|s| std::cmp::Reverse(s.micros));
    Ok(slow)
}

/// A key with its variable part starred, so that the report groups a million orderId
/// claims as one line: `vg:{CODE}:orders` becomes `vg:{*}:orders` (a voucher's keys),
/// `vg:order-owner:o-1` becomes `vg:order-owner:*`.
fn key_pattern(key: &str) -> String {
    if let (Some(open), Some(close)) = (key.find('{'), key.find('}')) {
        if open < close {
            return format!("{}{{*}}{}", &key[..open], &key[close + 1..]);
        }
    }
    match key.rfind(':') {
        Some(i) => format!("{}:*", &key[..i]),
        None => key.to_owned(),
    }
}

/// The gate script whose SHA1 is `sha`.
fn script_name(sha: &str) -> String {
    voucher_core::flash::gate::SCRIPT_SOURCES
        .iter()
        .find(|s| redis::Script::new(s.source).get_hash() == sha)
        .map_or_else(|| sha.to_owned(), |s| s.name.to_owned())
}

/// Calls slower than the threshold, per command, with the slowest of each.
fn slow_by_command(slow: &[Slow]) -> String {
    let mut by: Vec<(String, usize, i64)> = Vec::new();
    for s in slow {
        match by.iter_mut().find(|(c, _, _)| *c == s.command) {
            Some(entry) => {
                entry.1 += 1;
                entry.2 = entry.2.max(s.micros);
            }
            None => by.push((s.command.clone(), 1, s.micros)),
        }
    }
    by.iter()
        .map(|(c, n, max)| format!("{c}: {n} (max {:.1} ms)", *max as f64 / 1000.0))
        .collect::<Vec<_>>()
        .join("; ")
}

/// How many calls the slow log kept, the slowest, and how many of each command.
pub fn slow_summary(slow: &[Slow], threshold_us: i64) -> String {
    match slow.first() {
        None => format!("no call over {:.1} ms", threshold_us as f64 / 1000.0),
        Some(worst) => format!(
            "{} calls over {:.1} ms; slowest {:.2} ms ({}); by command: {}",
            slow.len(),
            threshold_us as f64 / 1000.0,
            worst.micros as f64 / 1000.0,
            worst.command,
            slow_by_command(slow)
        ),
    }
}

/// Redis's `used_memory`, in MiB.
pub async fn redis_memory_mib(url: &str) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut redis(url).await?)
        .await?;
    let bytes: f64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    Ok(bytes / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_grouped_by_pattern() {
        assert_eq!(key_pattern("vg:{BIG1}:orders"), "vg:{*}:orders");
        assert_eq!(key_pattern("vg:order-owner:o-17"), "vg:order-owner:*");
        assert_eq!(key_pattern("plain"), "plain");
        let slow = [
            Slow {
                micros: 1500,
                command: format!("SET {}", key_pattern("vg:order-owner:a")),
            },
            Slow {
                micros: 1200,
                command: format!("SET {}", key_pattern("vg:order-owner:b")),
            },
        ];
        assert_eq!(
            slow_by_command(&slow),
            "SET vg:order-owner:*: 2 (max 1.5 ms)"
        );
    }
}
