//! Redis: the shared local server that flash tests use under key prefixes of their own,
//! and a server of a test's own for the faults the shared one must not suffer.

use std::process::{Command, Stdio};
use std::time::Duration;

use voucher_contract::redis_tls::RedisTls;

use crate::process::Process;
use crate::tls::Certificates;
use crate::wait::eventually;
use crate::{free_port, TempDir};

pub const REDIS_URL: &str = "redis://127.0.0.1:6379/";

/// A Redis server of its own (on a free port, its snapshot in a temporary directory), for
/// faults the shared Redis must not suffer: restarts, snapshots restored, FLUSHALL.
pub struct RedisServer {
    // First, so it is dropped (killed) before its directory is removed.
    process: Process,
    pub port: u16,
    dir: TempDir,
    /// With TLS: the client's certificates, and the server's for its command line.
    tls: Option<(RedisTls, Vec<String>)>,
}

impl RedisServer {
    pub async fn start() -> Self {
        let mut server = Self {
            port: free_port(),
            dir: TempDir::new("redis"),
            process: Process::default(),
            tls: None,
        };
        server.restart().await;
        server
    }

    /// A server that speaks TLS only (`--port 0 --tls-port`) and wants a client certificate
    /// of `certs`' authority (`--tls-auth-clients yes`).
    pub async fn start_tls(certs: &Certificates) -> Self {
        let path = |p: std::path::PathBuf| p.display().to_string();
        let server_args = vec![
            "--tls-cert-file".into(),
            path(certs.server_cert()),
            "--tls-key-file".into(),
            path(certs.server_key()),
            "--tls-ca-cert-file".into(),
            path(certs.ca()),
            "--tls-auth-clients".into(),
            "yes".into(),
        ];
        let client = RedisTls {
            ca_file: Some(certs.ca()),
            cert_file: Some(certs.client_cert()),
            key_file: Some(certs.client_key()),
        };
        let mut server = Self {
            port: free_port(),
            dir: TempDir::new("redis"),
            process: Process::default(),
            tls: Some((client, server_args)),
        };
        server.restart().await;
        server
    }

    /// `rediss://` with TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// The client certificates this server wants (none without TLS).
    pub fn client_tls(&self) -> RedisTls {
        self.tls
            .as_ref()
            .map(|(c, _)| c.clone())
            .unwrap_or_default()
    }

    fn client(&self) -> anyhow::Result<redis::Client> {
        voucher_contract::redis_tls::redis_client(&self.url(), &self.client_tls())
    }

    /// Starts the server (again), loading `dump.rdb` if a snapshot was taken. Nothing is
    /// saved on its own: only [`RedisServer::snapshot`] writes one.
    pub async fn restart(&mut self) {
        self.kill();
        let port = self.port.to_string();
        let listen: Vec<&str> = match &self.tls {
            Some((_, server_args)) => ["--port", "0", "--tls-port", &port]
                .into_iter()
                .chain(server_args.iter().map(String::as_str))
                .collect(),
            None => vec!["--port", &port],
        };
        let child = redis_server(&self.dir.0)
            .args(listen)
            .args(["--dbfilename", "dump.rdb"])
            .spawn()
            .expect("redis-server is installed");
        self.process.set(child);
        let client = self.client().expect("a client of the test's Redis");
        eventually(Duration::from_secs(10), "redis-server to answer", || {
            let client = client.clone();
            async move {
                let mut conn = client.get_multiplexed_async_connection().await.ok()?;
                redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .ok()
            }
        })
        .await;
    }

    /// Writes a snapshot now (SAVE): what a restart loads until the next one.
    pub async fn snapshot(&self) -> anyhow::Result<()> {
        let mut conn = self.client()?.get_multiplexed_async_connection().await?;
        redis::cmd("SAVE").query_async::<()>(&mut conn).await?;
        Ok(())
    }

    /// Deletes the snapshot, so the next restart starts empty.
    pub fn forget_snapshot(&self) {
        let _ = std::fs::remove_file(self.dir.0.join("dump.rdb"));
    }

    /// Kills the server at once (SIGKILL): whatever it held in memory is gone.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing is answered and
    /// nothing is lost, as when its host stalls.
    pub fn pause(&self) {
        self.process.pause();
    }

    /// Lets a server frozen by [`Self::pause`] go on.
    pub fn unpause(&self) {
        self.process.unpause();
    }
}

/// `redis-server` on 127.0.0.1 keeping its files in `dir`, saving nothing on its own, its
/// output dropped: what every server a test starts has in common (each adds its ports).
pub(super) fn redis_server(dir: &std::path::Path) -> Command {
    let mut command = Command::new("redis-server");
    command
        .args(["--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// Waits until the Redis at `url` has a subscriber on `channel` (an edge that subscribed:
/// an announcement is not kept for a late subscriber). On a cluster, Pub/Sub subscribers
/// are counted per node.
pub async fn until_subscribed(url: &str, channel: &str) {
    let client = redis::Client::open(url).expect("redis url");
    eventually(
        Duration::from_secs(15),
        "a subscriber on the channel",
        || {
            let client = client.clone();
            async move {
                let mut conn = client.get_multiplexed_async_connection().await.ok()?;
                let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(channel)
                    .query_async(&mut conn)
                    .await
                    .ok()?;
                (subscribers >= 1).then_some(())
            }
        },
    )
    .await;
}

/// A connection to the tests' Redis, for tests that inspect or damage the gate by hand.
pub async fn redis_connection() -> redis::aio::MultiplexedConnection {
    redis::Client::open(REDIS_URL)
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis reachable")
}

/// Deletes every Redis key under `prefix` (each test's own).
pub async fn delete_keys(prefix: &str) {
    let Ok(client) = redis::Client::open(REDIS_URL) else {
        return;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return;
    };
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    if !keys.is_empty() {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query_async(&mut conn).await;
    }
}

/// One voucher's gate keys as they were at a moment (DUMP of each), to be put back later:
/// what a Redis restored from an older snapshot, or a replica promoted behind its master,
/// does to a gate.
pub struct SavedGate {
    pattern: String,
    keys: Vec<(String, Vec<u8>)>,
}

/// Every key of voucher `code`'s gate under `prefix` (all under its hash tag), as they
/// are now.
pub async fn save_gate(prefix: &str, code: &str) -> SavedGate {
    let pattern = format!("{prefix}{{{code}}}:*");
    let mut conn = redis_connection().await;
    let mut keys = Vec::new();
    for key in gate_keys(&mut conn, &pattern).await {
        let dumped: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("DUMP");
        if let Some(dumped) = dumped {
            keys.push((key, dumped));
        }
    }
    SavedGate { pattern, keys }
}

async fn gate_keys(conn: &mut redis::aio::MultiplexedConnection, pattern: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(pattern)
        .query_async(conn)
        .await
        .expect("KEYS")
}

impl SavedGate {
    /// Puts the gate back as it was: keys made since are deleted, the others restored.
    pub async fn restore(&self) {
        let mut conn = redis_connection().await;
        for key in gate_keys(&mut conn, &self.pattern).await {
            if !self.keys.iter().any(|(saved, _)| *saved == key) {
                redis::cmd("DEL")
                    .arg(&key)
                    .query_async::<()>(&mut conn)
                    .await
                    .expect("DEL");
            }
        }
        for (key, dumped) in &self.keys {
            redis::cmd("RESTORE")
                .arg(key)
                .arg(0)
                .arg(dumped.as_slice())
                .arg("REPLACE")
                .query_async::<()>(&mut conn)
                .await
                .expect("RESTORE");
        }
    }
}
