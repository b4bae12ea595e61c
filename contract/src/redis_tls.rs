//! How the edge and the cores open their Redis client: one function, so that a `rediss://`
//! URL, a private certificate authority and a client certificate mean the same on both; and
//! how both read a Redis Cluster's node list from one URL setting ([`node_urls`]), the
//! certificates then going to the cluster's client as they are ([`certificates`]).
//!
//! Without any file set, the URL alone decides: `redis://` is plain TCP, `rediss://` is TLS
//! verified against the system's roots. With `ca_file`, the server must present a
//! certificate of that authority; with `cert_file` and `key_file` (both or neither), the
//! client presents its own (Redis `tls-auth-clients yes`).

use std::path::PathBuf;

use serde::Deserialize;

/// Certificates for a Redis reached over TLS; all PEM files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisTls {
    /// The authority the server's certificate must come from, instead of the system roots.
    pub ca_file: Option<PathBuf>,
    /// The client's certificate, for servers that ask for one.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key.
    pub key_file: Option<PathBuf>,
}

impl RedisTls {
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.cert_file.is_none() && self.key_file.is_none()
    }
}

/// The nodes of a comma-separated list of URLs (a Redis Cluster's, in the cores' `redis.url`
/// and the edge's `redis_url`), blanks dropped; a single URL is a list of one.
pub fn node_urls(list: &str) -> Vec<&str> {
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// A Redis client for `url` with `tls`'s certificates; fails on a missing or unreadable file,
/// on a certificate without its key, and on certificates given for a plain `redis://` URL
/// (they would be silently ignored).
pub fn redis_client(url: &str, tls: &RedisTls) -> anyhow::Result<redis::Client> {
    if tls.is_empty() {
        return Ok(redis::Client::open(url)?);
    }
    anyhow::ensure!(
        url.starts_with("rediss://"),
        "Redis certificates are set but the URL is not rediss://: the connection would not \
         use them"
    );
    let certificates = certificates(tls)?.unwrap_or(redis::TlsCertificates {
        client_tls: None,
        root_cert: None,
    });
    Ok(redis::Client::build_with_tls(url, certificates)?)
}

/// The certificates of `tls` read from their files, or `None` when no file is set (the
/// system's roots, no client certificate); a certificate without its key is refused. A
/// Redis Cluster's client takes them as they are, for every node.
pub fn certificates(tls: &RedisTls) -> anyhow::Result<Option<redis::TlsCertificates>> {
    if tls.is_empty() {
        return Ok(None);
    }
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))
    };
    let client_tls = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert)?,
            client_key: read(key)?,
        }),
        (None, None) => None,
        _ => anyhow::bail!("a Redis client certificate needs both cert_file and key_file"),
    };
    let root_cert = tls.ca_file.as_ref().map(read).transpose()?;
    Ok(Some(redis::TlsCertificates {
        client_tls,
        root_cert,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_list_is_split_on_commas_and_blanks_dropped() {
        assert_eq!(
            node_urls("redis://a:7000, redis://b:7001 ,,"),
            vec!["redis://a:7000", "redis://b:7001"]
        );
        assert_eq!(node_urls("redis://a:6379/"), vec!["redis://a:6379/"]);
        assert!(node_urls(" ").is_empty());
    }

    #[test]
    fn certificates_need_a_tls_url_and_come_in_pairs() {
        let ca = RedisTls {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..RedisTls::default()
        };
        let err = redis_client("redis://127.0.0.1:6379/", &ca).expect_err("plain URL");
        assert!(err.to_string().contains("rediss://"), "{err}");
        let err = redis_client("rediss://127.0.0.1:6379/", &ca).expect_err("no file");
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
        let half = RedisTls {
            cert_file: Some("/nonexistent/c.pem".into()),
            ..RedisTls::default()
        };
        let err = redis_client("rediss://127.0.0.1:6379/", &half).expect_err("no key");
        assert!(err.to_string().contains("key_file"), "{err}");
        assert!(redis_client("redis://127.0.0.1:6379/", &RedisTls::default()).is_ok());
    }
}
