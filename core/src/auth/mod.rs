//! Who may call what: named bearer tokens with scopes.
//!
//! A token is a random secret shown once (`voucher-core tokens create`); the core keeps
//! only SHA-256 digests, from the `api_tokens` table, re-read every
//! `admin.token_refresh`, so tokens are made, rotated (several are valid at once) and
//! revoked without a restart. The configured `admin.token` and `admin.orders_token` are
//! two more, for bootstrapping and development: `admin` holds every scope, `edge` holds
//! `orders:read` only (what the edge's order-filter fetch needs). A request's token is
//! looked up by its digest: nothing compares the secret itself, and the lookup's time
//! says nothing about any stored secret.

pub mod cli;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::store::{Store, TokenRow};
use crate::Error;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Create, change, pause, resume, archive vouchers; reload gates.
    VouchersWrite,
    /// List vouchers; with `OrdersRead`, read their reservations.
    VouchersRead,
    /// Read a voucher's orders: its order list and filter; with `VouchersRead`, its
    /// reservations and exports.
    OrdersRead,
    /// Read the audit trail.
    AuditRead,
}

impl Scope {
    pub const ALL: [Scope; 4] = [
        Self::VouchersWrite,
        Self::VouchersRead,
        Self::OrdersRead,
        Self::AuditRead,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::VouchersWrite => "vouchers:write",
            Self::VouchersRead => "vouchers:read",
            Self::OrdersRead => "orders:read",
            Self::AuditRead => "audit:read",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }
}

/// The name the configured `admin.token` goes by, and the one of `admin.orders_token`.
pub const ADMIN_TOKEN_NAME: &str = "admin";
pub const EDGE_TOKEN_NAME: &str = "edge";

/// A token the core accepts: whose it is and what it may do.
#[derive(Debug, Clone)]
pub struct Credential {
    pub name: String,
    pub scopes: Vec<Scope>,
    pub expires_at: Option<DateTime<Utc>>,
}

type Digest32 = [u8; 32];

fn digest(secret: &str) -> Digest32 {
    Sha256::digest(secret.as_bytes()).into()
}

/// The tokens a core accepts, by digest.
#[derive(Clone)]
pub struct Credentials {
    /// The configured ones, always accepted.
    configured: Arc<HashMap<Digest32, Credential>>,
    /// The stored ones, as last read.
    stored: Arc<RwLock<HashMap<Digest32, Credential>>>,
}

impl Credentials {
    /// The configured tokens (an empty one is no token).
    pub fn new(admin: &SecretString, orders: &SecretString) -> Self {
        let mut configured = HashMap::new();
        for (secret, name, scopes) in [
            (admin, ADMIN_TOKEN_NAME, Scope::ALL.to_vec()),
            (orders, EDGE_TOKEN_NAME, vec![Scope::OrdersRead]),
        ] {
            if !secret.expose_secret().is_empty() {
                configured.insert(
                    digest(secret.expose_secret()),
                    Credential {
                        name: name.to_owned(),
                        scopes,
                        expires_at: None,
                    },
                );
            }
        }
        Self {
            configured: Arc::new(configured),
            stored: Arc::default(),
        }
    }

    /// The credential `presented` is, if it grants every one of `scopes`: 403 for an
    /// unknown, expired or revoked token, and for one without a scope (the first missing
    /// one is named).
    pub fn authorize(&self, presented: &str, scopes: &[Scope]) -> Result<Credential, Error> {
        let key = digest(presented);
        let found = self.configured.get(&key).cloned().or_else(|| {
            let stored = self.stored.read().unwrap_or_else(|e| e.into_inner());
            stored.get(&key).cloned()
        });
        let credential = found
            .filter(|c| c.expires_at.is_none_or(|at| at > Utc::now()))
            .ok_or(Error::Forbidden)?;
        match scopes.iter().find(|s| !credential.scopes.contains(s)) {
            Some(missing) => Err(Error::MissingScope(missing.as_str())),
            None => Ok(credential),
        }
    }

    /// Replaces the stored tokens with `rows` (the valid ones of `api_tokens`).
    pub fn replace_stored(&self, rows: Vec<TokenRow>) {
        let mut next = HashMap::with_capacity(rows.len());
        for row in rows {
            let Ok(key) = <Digest32>::try_from(row.secret_sha256.as_slice()) else {
                tracing::error!(name = %row.name, "stored token digest is not 32 bytes; ignored");
                continue;
            };
            let scopes = row.scopes.iter().filter_map(|s| Scope::parse(s)).collect();
            next.insert(
                key,
                Credential {
                    name: row.name,
                    scopes,
                    expires_at: row.expires_at,
                },
            );
        }
        *self.stored.write().unwrap_or_else(|e| e.into_inner()) = next;
    }

    /// Re-reads the stored tokens every `interval` until `shutdown`. A failed read keeps
    /// the last set (PostgreSQL away must not lock operators out of a running sale).
    pub async fn keep_fresh(self, store: Store, interval: Duration, shutdown: CancellationToken) {
        crate::periodic::every(interval, &shutdown, || async {
            match store.valid_tokens().await {
                Ok(rows) => self.replace_stored(rows),
                Err(e) => {
                    tracing::warn!(error = %e.chain(), "API tokens not re-read; the last set stays")
                }
            }
        })
        .await;
    }
}

/// A new token's secret: `vgt_` and 256 random bits in hex (the prefix lets secret
/// scanners find one that leaked), with the digest to store.
pub fn new_secret() -> (SecretString, Digest32) {
    let (a, b) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let secret = format!("vgt_{}{}", a.simple(), b.simple());
    let key = digest(&secret);
    (SecretString::from(secret), key)
}

/// Makes a stored token `name` with `scopes`, valid until `expires_at`; the secret is
/// returned once and kept nowhere.
pub async fn create_token(
    store: &Store,
    name: &str,
    scopes: &[Scope],
    expires_at: Option<DateTime<Utc>>,
) -> crate::Result<SecretString> {
    let (secret, key) = new_secret();
    let scopes: Vec<&str> = scopes.iter().map(|s| s.as_str()).collect();
    store.create_token(name, &key, &scopes, expires_at).await?;
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_grants_its_scopes_only_and_only_until_it_expires() {
        let creds = Credentials::new(&SecretString::from("adm"), &SecretString::from("edg"));
        assert_eq!(
            creds
                .authorize("adm", &[Scope::AuditRead])
                .map(|c| c.name)
                .ok(),
            Some("admin".to_owned())
        );
        assert!(creds.authorize("edg", &[Scope::OrdersRead]).is_ok());
        assert!(matches!(
            creds.authorize("edg", &[Scope::VouchersWrite]),
            Err(Error::MissingScope("vouchers:write"))
        ));
        assert!(matches!(
            creds.authorize("nope", &[Scope::OrdersRead]),
            Err(Error::Forbidden)
        ));
        // Several scopes: all of them, the first missing one named.
        assert!(matches!(
            creds.authorize("edg", &[Scope::OrdersRead, Scope::VouchersRead]),
            Err(Error::MissingScope("vouchers:read"))
        ));

        let (secret, key) = new_secret();
        assert!(secret.expose_secret().starts_with("vgt_"));
        assert_eq!(secret.expose_secret().len(), 4 + 64);
        let row = |name: &str, key: [u8; 32], expires_at| TokenRow {
            name: name.to_owned(),
            secret_sha256: key.to_vec(),
            scopes: vec!["vouchers:read".into(), "unknown:scope".into()],
            created_at: Utc::now(),
            expires_at,
            revoked_at: None,
        };
        let (old, old_key) = new_secret();
        creds.replace_stored(vec![
            row("ops", key, None),
            row(
                "old",
                old_key,
                Some(Utc::now() - chrono::Duration::seconds(1)),
            ),
        ]);
        let ops = creds
            .authorize(secret.expose_secret(), &[Scope::VouchersRead])
            .expect("stored token");
        assert_eq!((ops.name.as_str(), ops.scopes.len()), ("ops", 1));
        assert!(matches!(
            creds.authorize(old.expose_secret(), &[Scope::VouchersRead]),
            Err(Error::Forbidden)
        ));
        // Revoked (no longer read): refused.
        creds.replace_stored(Vec::new());
        assert!(creds
            .authorize(secret.expose_secret(), &[Scope::VouchersRead])
            .is_err());
    }
}
