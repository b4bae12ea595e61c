//! `voucher-core tokens ...`: making, listing and revoking the stored API tokens, on the
//! configured database (an operator with access to it; the API has no call that makes a
//! token, so no token can make another).

use chrono::{Duration, Utc};
use secrecy::ExposeSecret;

use super::{create_token, Scope};
use crate::config::Settings;
use crate::store::Store;

#[derive(Debug, clap::Subcommand)]
pub enum TokensCommand {
    /// Make a token; its secret is printed once, on standard output, and kept nowhere.
    Create {
        /// Who it is for (lower case, digits, `.`, `_`, `-`): what the audit trail names.
        name: String,
        /// Comma-separated: vouchers:write, vouchers:read, orders:read, audit:read.
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<String>,
        /// Refused after this many days (default: until revoked).
        #[arg(long)]
        expires_in_days: Option<u32>,
    },
    /// Every token: name, scopes, when made, when it expires, whether revoked.
    List,
    /// Refuse a token from now on (every core within `admin.token_refresh`).
    Revoke { name: String },
}

pub async fn run(settings: &Settings, command: TokensCommand) -> anyhow::Result<()> {
    let store = Store::connect_to_primary(&settings.database).await?;
    if settings.database.migrate {
        store.migrate().await?;
    }
    match command {
        TokensCommand::Create {
            name,
            scopes,
            expires_in_days,
        } => {
            let scopes = scopes
                .iter()
                .map(|s| {
                    Scope::parse(s.trim()).ok_or_else(|| {
                        anyhow::anyhow!(
                            "unknown scope {s:?}: use vouchers:write, vouchers:read, orders:read or audit:read"
                        )
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let expires_at = expires_in_days.map(|d| Utc::now() + Duration::days(i64::from(d)));
            let secret = create_token(&store, &name, &scopes, expires_at)
                .await
                .map_err(|e| anyhow::anyhow!("token not made: {}", e.chain()))?;
            eprintln!("token {name} made; its secret follows, shown this once:");
            println!("{}", secret.expose_secret());
        }
        TokensCommand::List => {
            println!(
                "{:<24} {:<48} {:<17} {:<17} revoked",
                "name", "scopes", "created", "expires"
            );
            let at = |t: Option<chrono::DateTime<Utc>>| {
                t.map_or_else(
                    || "-".to_owned(),
                    |t| t.format("%Y-%m-%d %H:%M").to_string(),
                )
            };
            for t in store.tokens().await? {
                println!(
                    "{:<24} {:<48} {:<17} {:<17} {}",
                    t.name,
                    t.scopes.join(","),
                    at(Some(t.created_at)),
                    at(t.expires_at),
                    at(t.revoked_at)
                );
            }
        }
        TokensCommand::Revoke { name } => {
            if !store.revoke_token(&name).await? {
                anyhow::bail!("no token named {name:?} is valid now");
            }
            eprintln!("token {name} revoked; every core refuses it within admin.token_refresh");
        }
    }
    Ok(())
}
