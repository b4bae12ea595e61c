//! The named API tokens (`api_tokens`): only their SHA-256 digests are stored.

use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::Store;
use crate::{Error, Result};

/// A token as stored: never its secret.
#[derive(Debug, Clone, FromRow)]
pub struct TokenRow {
    pub name: String,
    pub secret_sha256: Vec<u8>,
    pub scopes: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl Store {
    /// Stores a new token; `InvalidRequest` when the name is taken or not a valid one.
    pub async fn create_token(
        &self,
        name: &str,
        digest: &[u8; 32],
        scopes: &[&str],
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<TokenRow> {
        let row: Option<TokenRow> = sqlx::query_as(
            "INSERT INTO api_tokens (name, secret_sha256, scopes, expires_at)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (name) DO NOTHING
             RETURNING name, secret_sha256, scopes, created_at, expires_at, revoked_at",
        )
        .bind(name)
        .bind(digest.as_slice())
        .bind(scopes)
        .bind(expires_at)
        .fetch_optional(self.pool())
        .await?;
        row.ok_or_else(|| {
            Error::InvalidRequest(crate::domain::FieldError::new(
                "name",
                "a token of this name exists (revoked ones keep their name)",
            ))
        })
    }

    /// Revokes the token `name`; `false` when there is no such token still valid.
    pub async fn revoke_token(&self, name: &str) -> Result<bool> {
        let revoked = sqlx::query(
            "UPDATE api_tokens SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL",
        )
        .bind(name)
        .execute(self.pool())
        .await?;
        Ok(revoked.rows_affected() == 1)
    }

    /// Every token, revoked and expired ones included, by name.
    pub async fn tokens(&self) -> Result<Vec<TokenRow>> {
        let rows = sqlx::query_as(
            "SELECT name, secret_sha256, scopes, created_at, expires_at, revoked_at
             FROM api_tokens ORDER BY name",
        )
        .fetch_all(self.pool())
        .await?;
        Ok(rows)
    }

    /// The tokens not revoked: what a core accepts (an expiry is checked per request).
    pub async fn valid_tokens(&self) -> Result<Vec<TokenRow>> {
        let rows = sqlx::query_as(
            "SELECT name, secret_sha256, scopes, created_at, expires_at, revoked_at
             FROM api_tokens WHERE revoked_at IS NULL",
        )
        .fetch_all(self.pool())
        .await?;
        Ok(rows)
    }
}
