//! Loading a flash gate: fenced by generation, in pieces, and reconciled from what changed
//! rather than from every order. Real Redis, broker and PostgreSQL.

use std::sync::Arc;

use reqwest::StatusCode;
use voucher_core::domain::VoucherCode;
use voucher_core::flash::gate::{LoadStart, OrderRecord, RecordState};
use voucher_core::flash::{FlashPath, Rebuild};
use voucher_core::metrics::Metrics;
use voucher_core::store::Store;
use voucher_testkit::assert::assert_error;

use crate::flash::reconciler;
use crate::invariants::Accepted;
use crate::stack::{flash_voucher, redis_connection, FlashStack};

pub(crate) fn flash_path(env: &FlashStack) -> FlashPath {
    FlashPath::new(
        env.gate.clone(),
        env.kafka(),
        Store::new(env.pool.clone()),
        Arc::new(Metrics::new()),
        env.settings.flash.clone(),
    )
    .expect("flash path")
}

async fn zcard(key: String) -> i64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(&mut redis_connection().await)
        .await
        .expect("redis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_older_load_never_opens_over_a_newer_one() {
    let env = FlashStack::start().await;
    env.app().given_voucher(flash_voucher("FENCE", 10, 2)).await;
    let code = VoucherCode::parse("FENCE").expect("code");
    let voucher = Store::new(env.pool.clone())
        .voucher(&code)
        .await
        .expect("voucher");
    let gate = &env.gate;
    gate.unload(&code).await.expect("gate lost");

    // A load of generation 5 starts; one of generation 4 (an older read) is refused while
    // it runs; one of generation 6 (a newer read) takes over.
    let (start, older) = gate.begin_load(&voucher, 5).await.expect("redis");
    assert_eq!(start, LoadStart::Started);
    let (start, _) = gate.begin_load(&voucher, 4).await.expect("redis");
    assert_eq!(start, LoadStart::Superseded);
    let (start, newer) = gate.begin_load(&voucher, 6).await.expect("redis");
    assert_eq!(start, LoadStart::Started);

    // The older load, resumed, can neither write nor open.
    let record = OrderRecord {
        state: RecordState::Accepted,
        customer_id: "ghost".into(),
        order_amount: 100_000,
        discount_amount: 100_000,
        reserved_ms: 0,
        expires_ms: 0,
        publish_ms: 0,
    };
    let ghost = [("ghost-order".to_owned(), record)];
    assert!(!gate.fill_load(&older, &[], &ghost).await.expect("redis"));
    assert!(!gate.open_load(&older, &voucher, 9).await.expect("redis"));
    assert_eq!(
        gate.remaining(&code).await.expect("redis"),
        None,
        "closed while loading"
    );

    assert!(gate.open_load(&newer, &voucher, 10).await.expect("redis"));
    assert_eq!(gate.remaining(&code).await.expect("redis"), Some(10));
    let ids = gate.order_ids(&code).await.expect("redis").expect("loaded");
    assert!(ids.is_empty(), "nothing of the older load: {ids:?}");
    // Once open, any later load leaves its contents alone (and hands it its generation,
    // newer ones only: the loader took it in PostgreSQL already).
    let (start, _) = gate.begin_load(&voucher, 7).await.expect("redis");
    assert_eq!(start, LoadStart::AlreadyLoaded);
    assert_eq!(gate.remaining(&code).await.expect("redis"), Some(10));
    assert_eq!(gate.generation(&code).await.expect("redis"), Some(7));
    let (start, _) = gate.begin_load(&voucher, 3).await.expect("redis");
    assert_eq!(start, LoadStart::AlreadyLoaded);
    assert_eq!(gate.generation(&code).await.expect("redis"), Some(7));
    env.finish(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_read_is_outdated_by_any_newer_load_even_after_redis_forgets() {
    let env = FlashStack::start().await;
    env.app().given_voucher(flash_voucher("GEN", 10, 1)).await;
    let code = VoucherCode::parse("GEN").expect("code");
    let store = Store::new(env.pool.clone());
    let voucher = store.voucher(&code).await.expect("voucher");
    // The warm-up at creation took generation 1.
    assert_eq!(store.gate_generation(&code).await.expect("db"), 1);

    // A slow rebuild reads (generation 2) and stalls; meanwhile a newer one loads and
    // the sale goes on; then Redis loses the gate again.
    let stalled_generation = store.next_gate_generation(&code).await.expect("db");
    let stalled = store
        .read_gate(&code, stalled_generation)
        .await
        .expect("db");
    stalled.finish().await.expect("db");
    env.gate.unload(&code).await.expect("gate lost");
    let flash = flash_path(&env);
    assert_eq!(
        flash.load_from_database(&voucher).await.expect("loads"),
        Rebuild::Loaded
    );
    let sold = env.app().attempt("GEN", "c1", "gen-1", 100_000).await;
    assert_eq!(sold.status, StatusCode::CREATED, "{}", sold.body);
    env.caught_up().await;
    env.gate.unload(&code).await.expect("gate lost again");

    // The stalled rebuild resumes with its old read: Redis has no trace of the newer
    // load, but PostgreSQL's generation does, so the gate does not open.
    let (start, loading) = env
        .gate
        .begin_load(&voucher, stalled_generation)
        .await
        .expect("redis");
    assert_eq!(start, LoadStart::Started, "Redis forgot everything");
    assert!(
        store.gate_generation(&code).await.expect("db") > stalled_generation,
        "a newer load began after the stalled read"
    );
    drop(loading);
    // The next rebuild opens it from a fresh read: the use sold is counted.
    assert_eq!(
        flash.load_from_database(&voucher).await.expect("loads"),
        Rebuild::Loaded
    );
    assert_eq!(env.gate.remaining(&code).await.expect("redis"), Some(9));
    env.finish(&[sold.accepted()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_voucher_with_thousands_of_orders_reloads_in_pieces_and_reconciles_what_changed() {
    let env = FlashStack::start().await;
    let app = env.app();
    app.given_voucher(flash_voucher("BIG", 3_000, 2)).await;
    let code = VoucherCode::parse("BIG").expect("code");
    // 2,400 orders of 1,200 customers (two each), as the writers would have stored them:
    // every twelfth released, the next one confirmed. Far more than one load chunk.
    let mut tx = env.pool.begin().await.expect("db");
    for sql in [
        "INSERT INTO redemptions (voucher_code, customer_id, order_id, order_amount,
                                  discount_amount, status, reserved_at, expires_at,
                                  confirmed_at, released_at)
         SELECT 'BIG', 'c-' || (i / 2), 'big-' || i, 250000, 100000,
                CASE i % 12 WHEN 0 THEN 'RELEASED' WHEN 1 THEN 'CONFIRMED' ELSE 'RESERVED' END,
                now() - interval '1 minute', now() + interval '14 minutes',
                CASE i % 12 WHEN 1 THEN now() END, CASE i % 12 WHEN 0 THEN now() END
         FROM generate_series(0, 2399) AS i",
        "INSERT INTO customer_usage (voucher_code, customer_id, active_count, per_user_limit)
         SELECT 'BIG', customer_id, count(*), 2 FROM redemptions
         WHERE voucher_code = 'BIG' AND status <> 'RELEASED' GROUP BY customer_id",
        "UPDATE vouchers SET used_count = (SELECT count(*) FROM redemptions
                                           WHERE voucher_code = 'BIG' AND status <> 'RELEASED')
         WHERE code = 'BIG'",
    ] {
        sqlx::query(sql).execute(&mut *tx).await.expect("seeded");
    }
    tx.commit().await.expect("db");
    let store = Store::new(env.pool.clone());
    let voucher = store.voucher(&code).await.expect("voucher");
    assert_eq!(voucher.total_limit, 3_000);

    // Redis loses the gate; it is loaded again from PostgreSQL in pieces.
    env.gate.unload(&code).await.expect("gate lost");
    assert_eq!(
        flash_path(&env)
            .load_from_database(&voucher)
            .await
            .expect("loads"),
        Rebuild::Loaded
    );
    assert_eq!(app.voucher_json("BIG").await["gateRemaining"], 800);
    let ids = env
        .gate
        .order_ids(&code)
        .await
        .expect("redis")
        .expect("open");
    assert_eq!(ids.len(), 2_400, "every order's record, read back by HSCAN");
    let unsettled = format!("{}{{BIG}}:unsettled", env.key_prefix());
    assert_eq!(zcard(unsettled.clone()).await, 0, "loaded orders have rows");

    // Counts and records came back: c-0 released one of its two (big-0) and may take one
    // more; c-2 holds two; a retry of big-7 is answered from its record.
    let more = app.attempt("BIG", "c-0", "big-new-0", 250_000).await;
    assert_eq!(more.status, StatusCode::CREATED, "{}", more.body);
    let full = app.reserve("BIG", "c-2", "big-new-2", 250_000).await;
    assert_error(full, StatusCode::CONFLICT, "ALREADY_USED").await;
    let retry = app.reserve("BIG", "c-3", "big-7", 250_000).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(
        retry.headers()["idempotent-replayed"],
        "true",
        "a retry, not a new use"
    );

    // The new order is unsettled until its row is seen (by the writer that stores it, or
    // by reconciliation); a round finds the gate exact.
    env.caught_up().await;
    let reports = reconciler(&env).run_once().await.expect("round runs");
    let report = reports[0].1.clone().expect("caught up and loaded");
    assert_eq!(report.drift, 0, "{report:?}");
    assert_eq!((report.forgotten, report.repaired), (0, 0), "{report:?}");
    assert_eq!(zcard(unsettled).await, 0, "settled");
    env.finish(&[more.accepted(), Accepted::new("BIG", "c-3", "big-7")])
        .await;
}
