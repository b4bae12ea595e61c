//! What the edge's rate limits cost on the reject path: the same sold-out voucher, the same
//! closed-loop wrk run, against an edge of the benchmark's own (limits off) and against a
//! second edge of the same binary and file whose limits count every request (per address and per
//! customer, set far above the load so that none is refused), and one whose address limit
//! is 1/s (every request answered 429 RATE_LIMITED). And what the access log costs there:
//! two more edges of the same binary, one writing a JSON access line per request to a
//! file, one with the access log off (the same file otherwise), measured interleaved.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::run::Run;
use crate::wrk::wrk_rate;

/// An edge of the benchmark's own next to the stack's, with `EDGE__*` settings on top of
/// `config/edge.yaml`; killed when dropped.
struct ExtraEdge {
    child: Child,
    addr: SocketAddr,
}

impl ExtraEdge {
    async fn start(port: u16, metrics_port: u16, env: &[(&str, &str)]) -> anyhow::Result<Self> {
        Self::start_logging(port, metrics_port, env, None).await
    }

    /// With its log (stdout, where tracing writes) in `log` instead of nowhere.
    async fn start_logging(
        port: u16,
        metrics_port: u16,
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let binary = std::env::current_exe()?.with_file_name("voucher-edge");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let stdout = match log {
            Some(path) => Stdio::from(std::fs::File::create(path)?),
            None => Stdio::null(),
        };
        let child = Command::new(binary)
            .env("EDGE_CONFIG", "config/edge.yaml")
            .env("EDGE__LISTEN", addr.to_string())
            .env("EDGE__METRICS_LISTEN", format!("127.0.0.1:{metrics_port}"))
            .envs(env.iter().copied())
            .stdout(stdout)
            .stderr(Stdio::null())
            .spawn()?;
        let edge = Self { child, addr };
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                // The first health check of the cores.
                tokio::time::sleep(Duration::from_millis(700)).await;
                return Ok(edge);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!("the extra edge did not listen on {addr}")
    }
}

impl Drop for ExtraEdge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Run {
    /// 2b. The reject path with rate limits counting, and the 429 path itself.
    pub(crate) async fn rate_limit_cost(&mut self) -> anyhow::Result<()> {
        eprintln!("rate limits on the reject path");
        let code = format!("L{}", self.run_id);
        self.stack.create_voucher(&code, 1, "flash").await?;
        let counting = ExtraEdge::start(
            18480,
            19480,
            &[
                ("EDGE__RATE_LIMIT__PER_IP", "1000000000"),
                ("EDGE__RATE_LIMIT__PER_CUSTOMER", "1000000000"),
            ],
        )
        .await?;
        // Limits off: an edge started the same way (not the stack's, whose log goes to a
        // file: only the limits differ between the two).
        let plain = ExtraEdge::start(18484, 19484, &[]).await?;
        let (on, off) = self.interleaved(&code, &counting, &plain).await?;
        drop((counting, plain));
        let refusing = ExtraEdge::start(18481, 19481, &[("EDGE__RATE_LIMIT__PER_IP", "1")]).await?;
        let limited = wrk_rate(refusing.addr, &code).await;
        drop(refusing);
        if let (Some(on), Some(off)) = (on, off) {
            self.table.push(format!(
                "| Edge reject path (409) with rate limits counting every request vs limits off (wrk, two runs each, interleaved) | {on:.0}/s | {off:.0}/s | {:.2} | per address and per customer, limits far above the load; wrk -t1 -c64 -d5s |",
                on / off.max(1.0)
            ));
        }
        if let (Some(limited), Some(off)) = (limited, off) {
            self.table.push(format!(
                "| Edge 429 path (address over its 1/s) vs the 409 reject path (wrk) | {limited:.0}/s | {off:.0}/s | {:.2} | every answer 429 RATE_LIMITED with Retry-After |",
                limited / off.max(1.0)
            ));
        }
        Ok(())
    }

    /// 2c. The reject path with a JSON access line per request (to a file) vs none.
    pub(crate) async fn access_log_cost(&mut self) -> anyhow::Result<()> {
        eprintln!("the access log on the reject path");
        let code = format!("A{}", self.run_id);
        self.stack.create_voucher(&code, 1, "flash").await?;
        std::fs::create_dir_all("run")?;
        let (logged, quiet) = (
            Path::new("run/bench-edge-access.log"),
            Path::new("run/bench-edge-quiet.log"),
        );
        let env = |access: &'static str| {
            [
                ("RUST_LOG", "info"),
                ("EDGE__LOG_FORMAT", "json"),
                ("EDGE__ACCESS_LOG", access),
            ]
        };
        let logging = ExtraEdge::start_logging(18482, 19482, &env("all"), Some(logged)).await?;
        let silent = ExtraEdge::start_logging(18483, 19483, &env("off"), Some(quiet)).await?;
        let (on, off) = self.interleaved(&code, &logging, &silent).await?;
        drop((logging, silent));
        let lines = std::fs::read_to_string(logged)
            .map(|t| {
                t.lines()
                    .filter(|l| l.contains("\"target\":\"access\""))
                    .count()
            })
            .unwrap_or(0);
        let size = std::fs::metadata(logged).map(|m| m.len()).unwrap_or(0);
        if let (Some(on), Some(off)) = (on, off) {
            self.table.push(format!(
                "| Edge reject path (409) with a JSON access line per request vs access log off (wrk, two runs each, interleaved) | {on:.0}/s | {off:.0}/s | {:.2} | {lines} access lines written ({:.0} bytes each) to a file on the same disk; wrk -t1 -c64 -d5s |",
                on / off.max(1.0),
                size as f64 / (lines.max(1) as f64)
            ));
        }
        Ok(())
    }

    /// The sold-out reject path of `code` on edge `on` and on edge `off`, flagged on both:
    /// the mean rate of two wrk runs each, interleaved so that both see the same machine.
    async fn interleaved(
        &self,
        code: &str,
        on: &ExtraEdge,
        off: &ExtraEdge,
    ) -> anyhow::Result<(Option<f64>, Option<f64>)> {
        self.stack.flag_sold_out(code).await?;
        for edge in [on, off] {
            self.stack
                .flag_sold_out_at(&edge.addr.to_string(), code)
                .await?;
        }
        let off_1 = wrk_rate(off.addr, code).await;
        let on_1 = wrk_rate(on.addr, code).await;
        let off_2 = wrk_rate(off.addr, code).await;
        let on_2 = wrk_rate(on.addr, code).await;
        let mean = |a: Option<f64>, b: Option<f64>| Some((a? + b?) / 2.0);
        Ok((mean(on_1, on_2), mean(off_1, off_2)))
    }
}
