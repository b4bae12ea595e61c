//! What the benchmark reads from the running stack: admin calls, metrics, PostgreSQL
//! statistics, process memory.

use std::time::Duration;

use serde_json::json;

use crate::StackArgs;

pub struct Stack {
    pub http: reqwest::Client,
    pub edge: String,
    pub core: String,
    pub core_metrics: Vec<String>,
    pub edge_metrics: String,
    pub token: String,
    pub db: sqlx::PgPool,
    /// The stack's Redis, and the prefix of the cores' gate keys in it.
    pub redis_url: String,
    /// Whether `redis_url` is one server or a cluster's nodes.
    pub redis_topology: voucher_core::flash::gate::Topology,
    pub gate_prefix: String,
    /// The writers' broker, topic and group (to wait for them; never consuming).
    pub kafka: voucher_core::config::KafkaSettings,
    /// Whether the cores run the writers (`flash::runs_writers` of their settings): with
    /// PostgreSQL deciding they do not, and nothing waits for them.
    pub writers_run: bool,
}

impl Stack {
    /// The stack of `loadtest/bench.sh`, as the arguments (or the environment) name it.
    pub async fn connect(args: &StackArgs) -> anyhow::Result<Self> {
        Ok(Stack {
            http: reqwest::Client::new(),
            edge: args.edge.clone(),
            core: args.core.clone(),
            core_metrics: args.core_metrics.clone(),
            edge_metrics: args.edge_metrics.clone(),
            token: args.admin_token.clone(),
            db: sqlx::PgPool::connect(&args.database_url).await?,
            redis_url: args.redis_url.clone(),
            redis_topology: match args.redis_topology.as_str() {
                "cluster" => voucher_core::flash::gate::Topology::Cluster,
                _ => voucher_core::flash::gate::Topology::Single,
            },
            gate_prefix: args.gate_prefix.clone(),
            kafka: voucher_core::config::KafkaSettings {
                brokers: args.kafka_brokers.clone(),
                topic: args.kafka_topic.clone(),
                group: args.kafka_group.clone(),
                consume: Some(false),
                ..Default::default()
            },
            writers_run: args.consume.unwrap_or(args.decision == "broker"),
        })
    }

    /// The stack's Redis, with gate keys under `prefix`.
    pub fn redis_settings(&self, prefix: &str) -> voucher_core::config::RedisSettings {
        voucher_core::config::RedisSettings {
            url: self.redis_url.clone().into(),
            topology: self.redis_topology,
            key_prefix: prefix.to_owned(),
            timeout: Duration::from_secs(2),
            ..Default::default()
        }
    }

    /// The Redis Cluster's masters (ports, ascending) and, for each of `codes`, the master
    /// of its hash tag's slot (`CLUSTER KEYSLOT`, `CLUSTER NODES`); on one server no
    /// masters, and 0 for every code.
    pub async fn gate_masters(&self, codes: &[String]) -> anyhow::Result<(Vec<u16>, Vec<u16>)> {
        if self.redis_topology != voucher_core::flash::gate::Topology::Cluster {
            return Ok((Vec::new(), vec![0; codes.len()]));
        }
        let first = self.redis_url.split(',').next().unwrap_or_default();
        let mut conn = redis::Client::open(first)?
            .get_multiplexed_async_connection()
            .await?;
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await?;
        let nodes: Vec<voucher_testkit::stack::ClusterNode> = text
            .lines()
            .filter_map(voucher_testkit::stack::ClusterNode::parse)
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
            .collect();
        let mut masters: Vec<u16> = nodes.iter().map(|n| n.port).collect();
        masters.sort_unstable();
        let mut of = Vec::with_capacity(codes.len());
        for code in codes {
            let slot: u16 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(format!("{{{code}}}"))
                .query_async(&mut conn)
                .await?;
            let master = nodes.iter().find(|n| n.serves(slot)).map_or(0, |n| n.port);
            of.push(master);
        }
        Ok((masters, of))
    }

    pub async fn create_voucher(
        &self,
        code: &str,
        total_limit: i64,
        mode: &str,
    ) -> anyhow::Result<()> {
        let now = chrono::Utc::now();
        let body = json!({
            "code": code, "discountAmount": 100000, "minOrderAmount": 0,
            "totalLimit": total_limit, "perUserLimit": 1,
            "startsAt": (now - chrono::Duration::minutes(1)).to_rfc3339(),
            "endsAt": (now + chrono::Duration::days(1)).to_rfc3339(),
            "mode": mode,
        });
        let resp = self
            .http
            .post(format!("http://{}/vouchers", self.core))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await?;
        anyhow::ensure!(
            resp.status().as_u16() == 201,
            "creating {code}: {}",
            resp.text().await?
        );
        Ok(())
    }

    /// Asks a core to rebuild a flash voucher's gate from PostgreSQL (the admin reload),
    /// and waits until the gate holds PostgreSQL's count: for uses written behind the
    /// gate's back by the benchmark itself.
    pub async fn reload_gate(&self, code: &str) -> anyhow::Result<()> {
        self.request_reload(code).await?;
        let gate =
            voucher_core::flash::gate::Gate::connect(&self.redis_settings(&self.gate_prefix))
                .await?;
        let parsed =
            voucher_core::domain::VoucherCode::parse(code).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let (_, used) = self.recorded(code).await?;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let limit: i64 =
                sqlx::query_scalar("SELECT total_limit::int8 FROM vouchers WHERE code = $1")
                    .bind(code)
                    .fetch_one(&self.db)
                    .await?;
            if gate.remaining(&parsed).await? == Some(limit - i64::from(used)) {
                return Ok(());
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the gate of {code} did not reload within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The admin reload of a flash voucher's gate, accepted (202); the rebuild runs on.
    pub async fn request_reload(&self, code: &str) -> anyhow::Result<()> {
        let resp = self
            .http
            .post(format!("http://{}/vouchers/{code}/gate/reload", self.core))
            .bearer_auth(&self.token)
            .send()
            .await?;
        anyhow::ensure!(
            resp.status().as_u16() == 202,
            "reloading {code}: {}",
            resp.status()
        );
        Ok(())
    }

    /// The metrics a process serves at `address` (host:port), parsed.
    async fn scrape(&self, address: &str) -> anyhow::Result<voucher_testkit::metrics::Metrics> {
        let text = self
            .http
            .get(format!("http://{address}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        Ok(voucher_testkit::metrics::Metrics::parse(&text))
    }

    /// A counter at each core (in the order of `core_metrics`), for the samples carrying
    /// every label of `labels`.
    pub async fn counter_per_core(
        &self,
        name: &str,
        labels: &[(&str, &str)],
    ) -> anyhow::Result<Vec<f64>> {
        let mut per_core = Vec::with_capacity(self.core_metrics.len());
        for m in &self.core_metrics {
            per_core.push(self.scrape(m).await?.sum(name, labels));
        }
        Ok(per_core)
    }

    /// Sum of a counter over the cores, for the samples carrying every label of `labels`.
    pub async fn core_counter(&self, name: &str, labels: &[(&str, &str)]) -> anyhow::Result<f64> {
        Ok(self.counter_per_core(name, labels).await?.iter().sum())
    }

    /// The edge's counters of what it did with a sale's requests around the sell-out.
    pub async fn edge_counters(&self) -> anyhow::Result<EdgeCounters> {
        let m = self.scrape(&self.edge_metrics).await?;
        let flag = |outcome| m.sum("edge_flag_waits_total", &[("outcome", outcome)]);
        let place = |outcome| m.sum("edge_voucher_place_waits_total", &[("outcome", outcome)]);
        Ok(EdgeCounters {
            sold_out_signals: m.sum("edge_sold_out_signals_total", &[]),
            fetches: m.sum("edge_order_fetch_seconds_count", &[]),
            fetch_seconds: m.sum("edge_order_fetch_seconds_sum", &[]),
            flag_answered: flag("answered"),
            flag_forwarded: flag("forwarded") + flag("full") + flag("timed_out"),
            place_answered: place("answered"),
            place_placed: place("placed"),
            place_timed_out: place("timed_out"),
        })
    }

    /// What a sale is charged with, read before and after it: OUT_OF_STOCK answers of the
    /// cores (requests that got past the edge), database commits, transactions that wrote,
    /// consumer transactions.
    pub async fn sale_counters(&self) -> anyhow::Result<(f64, i64, i64, f64)> {
        Ok((
            self.core_counter(
                "http_requests_total",
                &[
                    ("code", "OUT_OF_STOCK"),
                    ("route", "/vouchers/{code}/reservations"),
                ],
            )
            .await?,
            self.xact_commit().await?,
            self.next_xid().await?,
            self.core_counter("voucher_consumer_transactions_total", &[])
                .await?,
        ))
    }

    /// Committed transactions of the vouchers database so far.
    pub async fn xact_commit(&self) -> anyhow::Result<i64> {
        let _ = sqlx::query("SELECT pg_stat_clear_snapshot()")
            .execute(&self.db)
            .await;
        Ok(sqlx::query_scalar(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&self.db)
        .await?)
    }

    /// The next transaction id PostgreSQL will assign: only transactions that write take one
    /// (read-only ones, like the services' progress reads, do not), so the difference over
    /// a sale counts the writing transactions, of the whole server (the benchmark runs
    /// alone on it). Reading it takes no id.
    pub async fn next_xid(&self) -> anyhow::Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
                .fetch_one(&self.db)
                .await?,
        )
    }

    /// Rows and used_count of a voucher in PostgreSQL.
    pub async fn recorded(&self, code: &str) -> anyhow::Result<(i64, i32)> {
        let rows: i64 =
            sqlx::query_scalar("SELECT count(*) FROM redemptions WHERE voucher_code = $1")
                .bind(code)
                .fetch_one(&self.db)
                .await?;
        let used: i32 = sqlx::query_scalar("SELECT used_count FROM vouchers WHERE code = $1")
            .bind(code)
            .fetch_one(&self.db)
            .await?;
        Ok((rows, used))
    }

    /// Waits until PostgreSQL holds `expected` rows for the voucher (consumer caught up).
    pub async fn wait_recorded(&self, code: &str, expected: i64) -> anyhow::Result<(i64, i32)> {
        for _ in 0..300 {
            let (rows, used) = self.recorded(code).await?;
            if rows >= expected {
                return Ok((rows, used));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.recorded(code).await
    }

    /// Sends reservations for `code` until the edge answers one itself (flag and order list in).
    pub async fn flag_sold_out(&self, code: &str) -> anyhow::Result<()> {
        self.flag_sold_out_at(&self.edge, code).await
    }

    /// [`Stack::flag_sold_out`] at the edge on `edge` (`host:port`).
    pub async fn flag_sold_out_at(&self, edge: &str, code: &str) -> anyhow::Result<()> {
        for i in 0..500 {
            let resp = self
                .http
                .post(format!("http://{edge}/vouchers/{code}/reservations"))
                .json(&json!({"customerId": format!("flag-c{i}"), "orderId": format!("{code}-flag{i}"), "orderAmount": 250000}))
                .send()
                .await?;
            if resp.headers().contains_key("x-served-by") {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        anyhow::bail!("the edge never answered for {code}")
    }
}

pub fn reserve_body(code: &str, i: u64, tag: &str) -> bytes::Bytes {
    bytes::Bytes::from(
        json!({"customerId": format!("{tag}-c{i}"), "orderId": format!("{code}-{tag}{i}"), "orderAmount": 250000})
            .to_string(),
    )
}

/// Peak resident memory (VmHWM) of the process whose pid is in `run/NAME.pid`, in MiB.
pub fn peak_rss_mib(pid_file: &str) -> Option<f64> {
    status_mib(pid_file, "VmHWM:")
}

/// Resident memory now (VmRSS) of the process whose pid is in `pid_file`, in MiB.
pub fn rss_mib(pid_file: &str) -> Option<f64> {
    status_mib(pid_file, "VmRSS:")
}

/// What `/proc/PID/status` says of a process's memory (MiB) and threads.
#[derive(Clone, Copy, Debug)]
pub struct ProcStatus {
    pub rss: f64,
    /// Heap, stacks, buffers.
    pub anon: f64,
    /// Mapped from files: the binary and its libraries.
    pub file: f64,
    pub threads: u64,
}

/// [`ProcStatus`] of the process whose pid is in `pid_file`.
pub fn proc_status(pid_file: &str) -> anyhow::Result<ProcStatus> {
    let read =
        |field| status_mib(pid_file, field).ok_or_else(|| anyhow::anyhow!("{field} of {pid_file}"));
    let pid = std::fs::read_to_string(pid_file)?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim()))?;
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Ok(ProcStatus {
        rss: read("VmRSS:")?,
        anon: read("RssAnon:")?,
        file: read("RssFile:")?,
        threads,
    })
}

/// A field of `/proc/PID/status` given in kB, in MiB.
fn status_mib(pid_file: &str, field: &str) -> Option<f64> {
    let pid = std::fs::read_to_string(pid_file).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).ok()?;
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// A line describing this machine for the report.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map(|kib| kib / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    format!("{cores} cores ({cpu}), {mem:.0} GiB; the load generator and the whole stack all on this one machine")
}

/// The edge's counters that say how a sale's requests met its sell-out (`edge_counters`);
/// a step's are the difference of two readings.
#[derive(Debug, Clone, Copy, Default)]
pub struct EdgeCounters {
    /// Sell-outs heard on the sold-out channel.
    pub sold_out_signals: f64,
    /// Order filters fetched from a core, and their time all told.
    pub fetches: f64,
    pub fetch_seconds: f64,
    /// Reservations that waited for a new flag's filter and were answered by it, and those
    /// that went on to a core after all (the filter was the holder's, the wait timed out,
    /// or too many waited).
    pub flag_answered: f64,
    pub flag_forwarded: f64,
    /// Reservations that waited for a place at the cores: answered by the flag once placed,
    /// sent on, or answered 503.
    pub place_answered: f64,
    pub place_placed: f64,
    pub place_timed_out: f64,
}

impl std::ops::Sub for EdgeCounters {
    type Output = EdgeCounters;
    fn sub(self, before: EdgeCounters) -> EdgeCounters {
        EdgeCounters {
            sold_out_signals: self.sold_out_signals - before.sold_out_signals,
            fetches: self.fetches - before.fetches,
            fetch_seconds: self.fetch_seconds - before.fetch_seconds,
            flag_answered: self.flag_answered - before.flag_answered,
            flag_forwarded: self.flag_forwarded - before.flag_forwarded,
            place_answered: self.place_answered - before.place_answered,
            place_placed: self.place_placed - before.place_placed,
            place_timed_out: self.place_timed_out - before.place_timed_out,
        }
    }
}
