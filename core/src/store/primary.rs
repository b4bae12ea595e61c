//! Which PostgreSQL server is the primary, when `[database] url` names several.
//!
//! The URL takes libpq's multi-host form, `postgres://user@host1:5432,host2:5433/db?
//! target_session_attrs=read-write`: every host of a primary and its standbys. sqlx opens
//! connections to one host only, so the pool is pointed at one server at a time and this
//! module moves it: [`Servers::follow`] asks the current server every interval whether it is
//! still the primary (`pg_is_in_recovery()`), and when it is not, or does not answer, asks
//! every server in the URL's order and points the pool's *new* connections at the first
//! primary it finds. A connection opened to a standby is refused before it joins the pool
//! ([`Servers::is_writable`]), and a write that meets one anyway (`25006`) is a 503 the
//! client retries.
//!
//! On a switch the pool's idle connections are closed; those in use at that moment go back
//! to the pool and stay until they fail (a dead server's do at their next use) or age out:
//! the core does not fence anything. The connections the grouped writers and the order
//! lookups keep between statements (`super::kept`) are dropped at their next use. That a
//! lost primary never takes a write again is the operator's promotion's to ensure
//! (`scripts/pg-promote.sh`, `docs/RUNBOOK.md`: fence the old primary first). With one
//! synchronous standby, an old primary that came back would commit nothing anyway: its
//! commits wait for the standby that was promoted away.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, PgPool};
use tokio_util::sync::CancellationToken;

/// The servers of a multi-host URL, in its order, and the one the pool connects to.
pub struct Servers {
    options: Vec<PgConnectOptions>,
    /// Each server's `host:port`, for the logs.
    names: Vec<String>,
    current: AtomicUsize,
}

/// Only the hosts: sqlx's options print their password.
impl std::fmt::Debug for Servers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Servers")
            .field("hosts", &self.names)
            .field("current", &self.current.load(Ordering::Relaxed))
            .finish()
    }
}

/// What a probe of one server found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Primary,
    Standby,
    Unreachable,
}

impl Servers {
    /// Parses a database URL with one host or several (libpq's `host1:port1,host2:port2`).
    /// With several, `target_session_attrs` may only ask for the primary (`read-write` or
    /// `primary`, libpq's spellings; absent means the same here): the core writes. A URL
    /// without a host (a Unix socket: `postgres:///db?host=/run/postgresql`) is one server,
    /// given to sqlx as it is.
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| anyhow::anyhow!("a database URL starts with postgres://"))?;
        let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((user, hosts)) => (Some(user), hosts),
            None => (None, authority),
        };
        if !hosts.contains(',') {
            let one = format!(
                "{scheme}://{authority}{}",
                without_target_session_attrs(tail)?
            );
            let parsed: PgConnectOptions = one
                .parse()
                .map_err(|e| anyhow::anyhow!("database URL: {e}"))?;
            return Ok(Self {
                names: vec![format!("{}:{}", parsed.get_host(), parsed.get_port())],
                options: vec![parsed],
                current: AtomicUsize::new(0),
            });
        }
        let tail = without_target_session_attrs(tail)?;
        anyhow::ensure!(
            !tail.contains("host=") && !tail.contains("port="),
            "a database URL with several hosts takes no host= or port= in its query"
        );
        let hosts: Vec<&str> = hosts.split(',').collect();
        anyhow::ensure!(
            hosts.iter().all(|h| !h.is_empty()),
            "the database URL has an empty host in its list"
        );
        let mut options = Vec::with_capacity(hosts.len());
        let mut names = Vec::with_capacity(hosts.len());
        for (n, host) in hosts.iter().enumerate() {
            let one = match userinfo {
                Some(user) => format!("{scheme}://{user}@{host}{tail}"),
                None => format!("{scheme}://{host}{tail}"),
            };
            let parsed: PgConnectOptions = one
                .parse()
                // The host's position, not its text: a password with an unencoded `/`
                // would end the host list early and be printed as a host.
                .map_err(|e| anyhow::anyhow!("database URL, host number {}: {e}", n + 1))?;
            options.push(parsed);
            names.push((*host).to_owned());
        }
        Ok(Self {
            options,
            names,
            current: AtomicUsize::new(0),
        })
    }

    /// More than one server: there is a primary to follow.
    pub fn several(&self) -> bool {
        self.options.len() > 1
    }

    /// The options of the server the pool connects to now.
    pub fn current(&self) -> PgConnectOptions {
        self.options[self.current.load(Ordering::Relaxed)].clone()
    }

    /// Applies `change` to every server's options (session settings the core sets).
    pub fn map(mut self, change: impl Fn(PgConnectOptions) -> PgConnectOptions) -> Self {
        self.options = self.options.into_iter().map(change).collect();
        self
    }

    /// Whether a new connection may join the pool: with several servers, only one to a
    /// primary. One server is taken as it is (a standby's writes fail with 25006, a 503).
    pub async fn is_writable(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        if !self.several() {
            return Ok(());
        }
        let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut *conn)
            .await?;
        if standby {
            return Err(sqlx::Error::Protocol(
                "connected to a standby; the core writes to the primary".into(),
            ));
        }
        Ok(())
    }

    /// Points `pool` at the first primary in the URL's order, if the current server is not
    /// one. Returns whether a primary is known now.
    pub async fn locate(&self, pool: &PgPool, timeout: Duration) -> bool {
        let at = self.current.load(Ordering::Relaxed);
        if probe(&self.options[at], timeout).await == Role::Primary {
            return true;
        }
        for (i, options) in self.options.iter().enumerate() {
            if i == at {
                continue;
            }
            if probe(options, timeout).await == Role::Primary {
                self.current.store(i, Ordering::Relaxed);
                pool.set_connect_options(options.clone());
                // The idle connections are the old server's: closed, so the next requests
                // open theirs to the new one. Those in use come back to the pool and stay
                // until they fail (`docs/RUNBOOK.md`: the old primary is stopped first).
                for _ in 0..pool.num_idle() {
                    match pool.try_acquire() {
                        Some(conn) => {
                            // Bounded: a frozen server may never see the goodbye.
                            let _ = tokio::time::timeout(timeout, conn.close()).await;
                        }
                        None => break,
                    }
                }
                tracing::warn!(
                    from = %self.names[at],
                    to = %self.names[i],
                    "the primary moved: new connections go to it"
                );
                return true;
            }
        }
        tracing::warn!(servers = ?self.names, "no primary among the database servers");
        false
    }

    /// Every `interval` until `shutdown`: [`Self::locate`]. With one server, returns at once.
    pub async fn follow(&self, pool: PgPool, interval: Duration, shutdown: CancellationToken) {
        if !self.several() {
            return;
        }
        // A zero interval would panic tokio's ticker.
        let interval = interval.max(Duration::from_millis(50));
        crate::periodic::every(interval, &shutdown, || async {
            self.locate(&pool, interval.max(Duration::from_millis(200)))
                .await;
        })
        .await;
    }
}

/// Asks one server, on a connection of its own, whether it is a primary.
async fn probe(options: &PgConnectOptions, timeout: Duration) -> Role {
    let asked = async {
        let mut conn = PgConnection::connect_with(options).await?;
        let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await?;
        let _ = conn.close().await;
        Ok::<bool, sqlx::Error>(standby)
    };
    match tokio::time::timeout(timeout, asked).await {
        Ok(Ok(false)) => Role::Primary,
        Ok(Ok(true)) => Role::Standby,
        Ok(Err(_)) | Err(_) => Role::Unreachable,
    }
}

/// `tail` (`/db?query`) without `target_session_attrs`, which sqlx does not know; refuses a
/// value other than the primary.
fn without_target_session_attrs(tail: &str) -> anyhow::Result<String> {
    let Some((path, query)) = tail.split_once('?') else {
        return Ok(tail.to_owned());
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("target_session_attrs", value)) => anyhow::ensure!(
                matches!(value, "read-write" | "primary"),
                "target_session_attrs={value}: the core writes, so it connects to the \
                 primary only (read-write)"
            ),
            _ => kept.push(pair),
        }
    }
    Ok(if kept.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", kept.join("&"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_host_is_one_server() {
        let servers =
            Servers::parse("postgres://postgres@127.0.0.1:5432/vouchers").expect("one host");
        assert!(!servers.several());
        assert_eq!(servers.current().get_port(), 5432);
        assert_eq!(servers.current().get_database(), Some("vouchers"));
    }

    #[test]
    fn several_hosts_keep_their_user_database_and_query() {
        let servers = Servers::parse(
            "postgres://app:secret@db-a:5432,db-b:5433/vouchers?target_session_attrs=read-write&sslmode=require&application_name=core",
        )
        .expect("two hosts");
        assert!(servers.several());
        let ports: Vec<u16> = servers.options.iter().map(|o| o.get_port()).collect();
        assert_eq!(ports, [5432, 5433]);
        let hosts: Vec<&str> = servers.options.iter().map(|o| o.get_host()).collect();
        assert_eq!(hosts, ["db-a", "db-b"]);
        for options in &servers.options {
            assert_eq!(options.get_username(), "app");
            assert_eq!(options.get_database(), Some("vouchers"));
            assert_eq!(options.get_application_name(), Some("core"));
            assert!(matches!(
                options.get_ssl_mode(),
                sqlx::postgres::PgSslMode::Require
            ));
        }
        assert_eq!(servers.names, ["db-a:5432", "db-b:5433"]);
    }

    #[test]
    fn a_session_attribute_other_than_the_primary_is_refused() {
        for attrs in ["any", "read-only", "standby", "prefer-standby"] {
            let url = format!("postgres://u@a:1,b:2/db?target_session_attrs={attrs}");
            let err = Servers::parse(&url).expect_err("refused").to_string();
            assert!(err.contains("read-write"), "{attrs}: {err}");
        }
        assert!(Servers::parse("postgres://u@a:1,b:2/db?target_session_attrs=primary").is_ok());
    }

    #[test]
    fn a_socket_url_without_a_host_is_one_server() {
        let servers =
            Servers::parse("postgres:///vouchers?host=/run/postgresql").expect("a socket URL");
        assert!(!servers.several());
        assert_eq!(servers.current().get_database(), Some("vouchers"));
    }

    #[test]
    fn debug_shows_hosts_and_no_password() {
        let servers = Servers::parse("postgres://app:hunter2@a:1,b:2/db").expect("two hosts");
        let shown = format!("{servers:?}");
        assert!(
            shown.contains("a:1") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[test]
    fn several_hosts_take_no_host_or_port_in_the_query() {
        assert!(Servers::parse("postgres://u@a:1,b:2/db?host=c").is_err());
        assert!(Servers::parse("postgres://u@a:1,b:2/db?port=3").is_err());
    }

    #[test]
    fn an_empty_host_or_a_missing_scheme_is_refused() {
        assert!(Servers::parse("postgres://u@a:1,,b:2/db").is_err());
        assert!(Servers::parse("a:1,b:2/db").is_err());
    }
}
