//! Closed-loop measurements with wrk (a C generator): it offers more load on two shared
//! cores than our open-model generator can, so the reject-path comparisons use it too.

use std::net::SocketAddr;
use std::process::Command;

/// Requests per second wrk reaches against `target` with reservations for `code`
/// (closed loop: 64 connections, one request in flight each). `None` without wrk.
pub async fn wrk_rate(target: SocketAddr, code: &str) -> Option<f64> {
    // Keep the flag fresh: one request through the normal path first.
    let script = format!(
        "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\ncounter = 0\n\
         request = function()\n  counter = counter + 1\n  return wrk.format(nil, \"/vouchers/{code}/reservations\", nil, \
         '{{\"customerId\":\"w' .. counter .. '\",\"orderId\":\"{code}-w' .. counter .. '\",\"orderAmount\":250000}}')\nend\n"
    );
    let path = std::env::temp_dir().join(format!("voucher-bench-{}.lua", std::process::id()));
    std::fs::write(&path, script).ok()?;
    let output = Command::new("wrk")
        .args(["-t1", "-c64", "-d5s", "-s"])
        .arg(&path)
        .arg(format!("http://{target}"))
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&path);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| {
            l.strip_prefix("Requests/sec:")
                .and_then(|v| v.trim().parse().ok())
        })
}
