//! PostgreSQL failover: a primary with a synchronous standby, the cores given both in one
//! multi-host URL (`target_session_attrs=read-write`). The primary is lost mid-sale (frozen
//! and killed at one instant, as a machine that dies), the standby is promoted and given a
//! standby of its own, and the core follows it: every 201 answered before the loss has its
//! row on the promoted server, the sale sells out exactly, and the customers saw only 201,
//! 409 and 503 while it happened.

use std::time::Duration;

use reqwest::StatusCode;
use sqlx::PgPool;
use voucher_testkit::helpers::database_url;
use voucher_testkit::postgres::{multi_host_url, PostgresServer, Replication};

use crate::checkouts::{sale_through, sold_out_exactly};
use crate::stack::{flash_voucher, FlashStack};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_primary_lost_mid_sale_keeps_every_201_and_the_core_follows_the_promoted_standby() {
    let mut primary = PostgresServer::start_primary(Replication::Synchronous)
        .await
        .expect("primary");
    let standby = PostgresServer::start_standby(&primary)
        .await
        .expect("standby");
    let ports = [primary.port, standby.port];
    let mut env = FlashStack::builder()
        .database_on(primary.url(), move |name| multi_host_url(&ports, name))
        .start_with(|s| {
            s.database.primary_check_interval = Duration::from_millis(200);
            s.flash.reconcile_enabled = true;
            s.flash.reconcile_interval = Duration::from_secs(1);
        })
        .await;
    let code = "PGLOST";
    env.app().given_voucher(flash_voucher(code, 150, 1)).await;

    let mut replacement = None;
    let (lost, promoted, replaced) = (&mut primary, &standby, &mut replacement);
    let (answers, lost_at, healed_at) = sale_through(&env, code, 300, async move {
        lost.lose();
        promoted.promote(ports[0]).await.expect("promotion");
        // The promoted server is synchronous too: it commits nothing until a standby of
        // its own streams, as the runbook's promotion does.
        *replaced = Some(
            PostgresServer::start_standby(promoted)
                .await
                .expect("a standby of the promoted server"),
        );
    })
    .await;

    let promoted = PgPool::connect(&database_url(&standby.url(), &env.db.name))
        .await
        .expect("the promoted server");
    let before: Vec<&str> = answers
        .iter()
        .filter(|(at, a)| *at < lost_at && a.status == StatusCode::CREATED)
        .map(|(_, a)| a.order.as_str())
        .collect();
    assert!(before.len() >= 40, "the loss struck mid-sale");
    let kept: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM redemptions WHERE voucher_code = $1 AND order_id = ANY($2)",
    )
    .bind(code)
    .bind(&before)
    .fetch_one(&promoted)
    .await
    .expect("count");
    assert_eq!(
        kept,
        before.len() as i64,
        "every 201 given before the loss has its row on the promoted standby"
    );
    let last_503 = answers
        .iter()
        .filter(|(_, a)| a.status == StatusCode::SERVICE_UNAVAILABLE)
        .map(|(at, _)| *at)
        .max()
        .unwrap_or(lost_at);
    assert!(
        last_503 <= healed_at + Duration::from_secs(5),
        "503s went on {:?} after the promoted server had its standby",
        last_503.saturating_duration_since(healed_at)
    );
    eprintln!(
        "lost the primary; promoted and re-protected in {:?}; 503s until {:?} after the loss; {} 201s before it",
        healed_at.duration_since(lost_at),
        last_503.saturating_duration_since(lost_at),
        before.len()
    );
    // The test's own view follows the promotion too.
    env.pool = promoted;
    sold_out_exactly(env, code, 150, &answers).await;
    drop(replacement);
}
