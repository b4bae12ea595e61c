//! A PostgreSQL server of the test's own: a cluster made with `initdb` in a temporary
//! directory and run on a free port, for the faults the machine's shared server must not
//! suffer (a crash and restart of the whole server); and a primary with a streaming
//! standby made from it by `pg_basebackup`, for the loss of the primary and the standby's
//! promotion.
//!
//! PostgreSQL refuses to run as root, so when the tests run as root the cluster belongs to
//! the `postgres` user and its programs are started through `setpriv`, which execs them
//! (no fork in between): the process the test owns is the postmaster itself.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sqlx::{Connection, PgConnection};

use crate::helpers::database_url;
use crate::process::{listening, Process};
use crate::tls::{install_private, Certificates};
use crate::{free_port, TempDir};

pub struct PostgresServer {
    // First, so it is stopped before its directory is removed.
    process: Process,
    pub port: u16,
    dir: TempDir,
    bin: PathBuf,
    /// With TLS: the query of every URL (`sslmode=verify-full&sslrootcert=...`).
    tls_query: Option<String>,
}

impl PostgresServer {
    /// Makes a cluster (trust authentication, superuser `postgres`) and starts it.
    pub async fn start() -> anyhow::Result<Self> {
        let mut server = Self::init().await?;
        server.restart().await?;
        Ok(server)
    }

    /// A cluster that speaks TLS only (`ssl = on`, `hostssl` lines alone in `pg_hba.conf`)
    /// and authenticates with client certificates (`cert`: the certificate's common name
    /// is the user). Its URLs verify the server against `certs`' authority and present
    /// `certs`' client certificate, as a managed PostgreSQL with certificate login wants.
    pub async fn start_tls(certs: &Certificates) -> anyhow::Result<Self> {
        let mut server = Self::init().await?;
        let data = server.dir.0.join("data");
        let owner = running_as_root().then_some("postgres");
        install_private(&certs.server_cert(), &data, "server.pem", owner)?;
        install_private(&certs.server_key(), &data, "server.key", owner)?;
        install_private(&certs.ca(), &data, "ca.pem", owner)?;
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 cert\n",
        )?;
        std::fs::write(
            data.join("postgresql.auto.conf"),
            "ssl = on\nssl_cert_file = 'server.pem'\nssl_key_file = 'server.key'\n\
             ssl_ca_file = 'ca.pem'\n",
        )?;
        server.tls_query = Some(format!(
            "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
            certs.ca().display(),
            certs.client_cert().display(),
            certs.client_key().display()
        ));
        server.restart().await?;
        Ok(server)
    }

    /// A primary whose standbys stream its write-ahead log. With
    /// [`Replication::Synchronous`] (`synchronous_standby_names = '*'`, `synchronous_commit
    /// = on`) a commit returns only once a standby has flushed it, so until one is attached
    /// ([`Self::start_standby`]) every commit waits.
    pub async fn start_primary(replication: Replication) -> anyhow::Result<Self> {
        let mut server = Self::init().await?;
        let standbys = match replication {
            Replication::Synchronous => "*",
            Replication::Asynchronous => "",
        };
        std::fs::write(
            server.dir.0.join("data").join("postgresql.auto.conf"),
            format!(
                "wal_level = replica\nmax_wal_senders = 10\nwal_keep_size = '256MB'\n\
                 synchronous_standby_names = '{standbys}'\nsynchronous_commit = on\n"
            ),
        )?;
        server.restart().await?;
        Ok(server)
    }

    /// A hot standby of `primary`: a base backup of it (`pg_basebackup -R`, which writes
    /// `standby.signal` and the `primary_conninfo`), started on a port of its own, and
    /// returned once `primary` reports it streaming. Its copy of the primary's settings
    /// takes effect when it is promoted: a promoted synchronous standby waits for a standby
    /// of its own in turn.
    pub async fn start_standby(primary: &PostgresServer) -> anyhow::Result<Self> {
        Self::start_standby_on(primary, free_port()).await
    }

    /// [`Self::start_standby`] on `port` (a lost server's, so that URLs naming it hold).
    pub async fn start_standby_on(primary: &PostgresServer, port: u16) -> anyhow::Result<Self> {
        Self::start_standby_through(primary, port, primary.port).await
    }

    /// [`Self::start_standby_on`], the standby streaming from `upstream` (a
    /// [`crate::link::Link`] in front of `primary`) instead of from `primary`'s own port;
    /// the base backup is still taken from `primary` directly.
    pub async fn start_standby_through(
        primary: &PostgresServer,
        port: u16,
        upstream: u16,
    ) -> anyhow::Result<Self> {
        let bin = bin_dir()?;
        let dir = Self::owned_dir()?;
        let output = as_postgres(bin.join("pg_basebackup"))
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
            .args(["-U", "postgres", "-X", "stream", "-R", "--no-sync"])
            .args(["--checkpoint=fast"])
            .arg("-D")
            .arg(dir.0.join("data"))
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "pg_basebackup failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        if upstream != primary.port {
            // The later of two settings in the file wins over the backup's own line.
            use std::io::Write;
            let mut conf = std::fs::OpenOptions::new()
                .append(true)
                .open(dir.0.join("data").join("postgresql.auto.conf"))?;
            writeln!(
                conf,
                "primary_conninfo = 'host=127.0.0.1 port={upstream} user=postgres'"
            )?;
        }
        let mut standby = Self {
            process: Process::default(),
            port,
            dir,
            bin,
            tls_query: None,
        };
        standby.restart().await?;
        let mut conn = PgConnection::connect(&database_url(&primary.url(), "postgres")).await?;
        for _ in 0..300 {
            let streaming: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'",
            )
            .fetch_one(&mut conn)
            .await?;
            if streaming > 0 {
                return Ok(standby);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!("the standby on {} did not stream within 30 s", standby.port)
    }

    /// Promotes a standby with the operator's script (`scripts/pg-promote.sh --fenced`:
    /// the caller has stopped the old primary; the script still refuses while
    /// `old_primary` answers as a primary): from then on it is a primary.
    pub async fn promote(&self, old_primary: u16) -> anyhow::Result<()> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg-promote.sh");
        let standby = format!("127.0.0.1:{}", self.port);
        let output = tokio::task::spawn_blocking(move || {
            Command::new(script)
                .args(["--standby", &standby])
                .args(["--old-primary", &format!("127.0.0.1:{old_primary}")])
                // The callers have lost (frozen and killed) the old primary first.
                .arg("--fenced")
                .output()
        })
        .await??;
        anyhow::ensure!(
            output.status.success(),
            "pg-promote.sh failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(())
    }

    /// The machine lost: the whole server frozen at one instant, then killed (SIGKILL to
    /// every process of it). Nothing it had not sent by the instant of the freeze, to a
    /// client or to a standby, ever leaves it.
    pub fn lose(&mut self) {
        self.process.pause_with_children();
        self.process.kill_with_children();
    }

    async fn init() -> anyhow::Result<Self> {
        let bin = bin_dir()?;
        let dir = Self::owned_dir()?;
        let data = dir.0.join("data");
        let output = as_postgres(bin.join("initdb"))
            .args([
                "--auth=trust",
                "--username=postgres",
                "--no-sync",
                "--encoding=UTF8",
            ])
            .arg("--pgdata")
            .arg(&data)
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(Self {
            process: Process::default(),
            port: free_port(),
            dir,
            bin,
            tls_query: None,
        })
    }

    /// A temporary directory the server's user owns.
    fn owned_dir() -> anyhow::Result<TempDir> {
        let dir = TempDir::new("postgres");
        if running_as_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir.0)
                .status()?;
            anyhow::ensure!(status.success(), "chown of {} failed", dir.0.display());
        }
        Ok(dir)
    }

    /// `postgres://postgres@127.0.0.1:PORT`, without a database name (with TLS, followed
    /// by `?sslmode=...`: [`crate::helpers::database_url`] puts a name in between).
    pub fn url(&self) -> String {
        let base = format!("postgres://postgres@127.0.0.1:{}", self.port);
        match &self.tls_query {
            Some(query) => format!("{base}?{query}"),
            None => base,
        }
    }

    /// Starts the server (again) on the same port and data: after a crash it replays its
    /// write-ahead log before it accepts connections, as a restarted production server does.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.process.kill();
        // Its log, kept with the cluster (appended across restarts).
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.0.join("postgres.log"))?;
        let child = as_postgres(self.bin.join("postgres"))
            .arg("-D")
            .arg(self.dir.0.join("data"))
            .args(["-p", &self.port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.0.display()))
            .args(["-c", "max_connections=200", "-c", "fsync=on"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        self.process.set(child);
        anyhow::ensure!(
            listening(self.port, Duration::from_secs(30)).await,
            "PostgreSQL did not listen on {} within 30 s",
            self.port
        );
        // Listening comes before recovery ends; a connection proves it is over.
        let url = database_url(&self.url(), "postgres");
        for _ in 0..300 {
            if PgConnection::connect(&url).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!(
            "PostgreSQL on {} accepted no connection within 30 s",
            self.port
        )
    }

    /// Stops the server in immediate mode (SIGQUIT to the postmaster, what `pg_ctl stop -m
    /// immediate` sends): every session is cut, nothing is checkpointed, and the next start
    /// recovers from the write-ahead log as after a crash. Returns once it has exited.
    pub fn crash(&mut self) {
        self.process.stop_with("QUIT");
    }

    /// Freezes the whole server, postmaster and backends (SIGSTOP): connections stay open
    /// and nothing is answered, nor is a new connection accepted, until [`Self::unpause`].
    pub fn pause(&self) {
        self.process.pause_with_children();
    }

    /// Lets a server frozen by [`Self::pause`] go on.
    pub fn unpause(&self) {
        self.process.unpause_with_children();
    }
}

/// Whether a primary's commits wait for a standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// A commit returns once a standby has flushed it: a promoted standby has every
    /// acknowledged commit.
    Synchronous,
    /// A commit returns at once; a standby may be behind by what was in flight.
    Asynchronous,
}

/// The URL of database `name` on whichever of the servers on `ports` is the primary, in
/// libpq's multi-host form (`postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/name?
/// target_session_attrs=read-write`), as the cores are given it.
pub fn multi_host_url(ports: &[u16], name: &str) -> String {
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    format!(
        "postgres://postgres@{}/{name}?target_session_attrs=read-write",
        hosts.join(",")
    )
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // SIGKILL would leave its backends behind for a moment; an immediate stop takes
        // them down with it.
        self.crash();
    }
}

/// Where the server's programs are: `pg_config --bindir`, or `PG_BIN_DIR`.
fn bin_dir() -> anyhow::Result<PathBuf> {
    if let Ok(dir) = std::env::var("PG_BIN_DIR") {
        return Ok(dir.into());
    }
    let output = Command::new("pg_config").arg("--bindir").output()?;
    anyhow::ensure!(output.status.success(), "pg_config --bindir failed");
    Ok(PathBuf::from(String::from_utf8(output.stdout)?.trim()))
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// `program` as the `postgres` user when we are root (exec'd, so the child is `program`).
fn as_postgres(program: PathBuf) -> Command {
    if running_as_root() {
        let mut command = Command::new("setpriv");
        command
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .arg(program);
        command
    } else {
        Command::new(program)
    }
}
