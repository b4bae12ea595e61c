//! The flash gate on a Redis Cluster (`[redis] topology = "cluster"`): three masters with a
//! replica each, of the test's own. Vouchers whose hash tags fall on different masters sell
//! out exactly; a master killed mid-sale costs its customers nothing but 503s until its
//! replica is promoted; a voucher's slot moved to another master mid-sale (ASK while its
//! keys migrate, MOVED after) is never answered with a 5xx. Each test ends with the
//! invariants on PostgreSQL and the gate, and every 201's retry answering what PostgreSQL
//! holds.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use voucher_core::flash::gate::Topology;
use voucher_testkit::sale::Attempt;
use voucher_testkit::stack::{RedisCluster, NODE_TIMEOUT};

use crate::checkouts::{replays_hold, sale_through, sold_out_exactly};
use crate::sale::Sale;
use crate::stack::{flash_voucher, FlashStack};

/// A flash stack whose cores use `cluster`, reconciling every second as in production (a
/// replica promoted behind its master is a gate gone back in time, which reconciliation
/// repairs).
async fn stack_on(cluster: &RedisCluster) -> FlashStack {
    let url = cluster.url();
    FlashStack::builder()
        .start_with(|s| {
            let redis = s.redis.as_mut().expect("flash settings have redis");
            redis.topology = Topology::Cluster;
            redis.url = url.into();
            s.flash.reconcile_enabled = true;
            s.flash.reconcile_interval = Duration::from_secs(1);
        })
        .await
}

/// `n` voucher codes whose gates live on `n` different masters, named `{prefix}{i}`.
async fn codes_on_distinct_masters(cluster: &RedisCluster, prefix: &str, n: usize) -> Vec<String> {
    let mut codes = Vec::new();
    let mut masters = Vec::new();
    for i in 0.. {
        let code = format!("{prefix}{i}");
        let master = cluster
            .master_of(cluster.slot(&format!("{{{code}}}")).await)
            .await;
        if !masters.contains(&master.port) {
            masters.push(master.port);
            codes.push(code);
        }
        if codes.len() == n {
            break;
        }
    }
    codes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vouchers_on_every_master_of_a_redis_cluster_sell_out_exactly() {
    let cluster = RedisCluster::start().await;
    let env = stack_on(&cluster).await;
    let app = env.app();
    let codes = codes_on_distinct_masters(&cluster, "CLU", 3).await;
    for code in &codes {
        app.given_voucher(flash_voucher(code, 20, 1)).await;
    }
    let sales: Vec<Sale> = codes
        .iter()
        .map(|code| Sale {
            in_flight: 20,
            ..Sale::new(code, code, 60)
        })
        .collect();
    let results = futures::future::join_all(sales.iter().map(|sale| sale.run(app))).await;
    let mut accepted = Vec::new();
    for (code, sale) in codes.iter().zip(&results) {
        assert_eq!(sale.created(), 20, "{code}");
        assert_eq!(
            sale.count(StatusCode::CONFLICT, "OUT_OF_STOCK"),
            40,
            "{code}"
        );
        assert_eq!(env.rows(code).await, 20, "{code}");
        // The gate's keys are on the cluster, under the voucher's hash tag.
        let remaining = env
            .gate
            .remaining(&voucher_core::domain::VoucherCode::parse(code.clone()).expect("code"))
            .await
            .expect("gate");
        assert_eq!(remaining, Some(0), "{code}");
        accepted.extend(sale.accepted());
        let created: Vec<&Attempt> = sale
            .attempts
            .iter()
            .filter(|a| a.status == StatusCode::CREATED)
            .collect();
        replays_hold(app, &created).await;
    }
    env.finish(&accepted).await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_master_killed_mid_sale_costs_only_503s_until_its_replica_is_promoted() {
    let mut cluster = RedisCluster::start().await;
    let env = stack_on(&cluster).await;
    let code = "CLUKILL";
    env.app().given_voucher(flash_voucher(code, 150, 1)).await;
    let slot = cluster.slot("{CLUKILL}").await;
    let master = cluster.master_of(slot).await;

    let cluster_ref = &mut cluster;
    let (answers, killed, promoted) = sale_through(&env, code, 300, async move {
        cluster_ref.kill(master.port);
        cluster_ref.until_promoted(slot, master.port).await;
    })
    .await;
    cluster.until_settled().await;

    // Redis promotes the replica after its node timeout and an election, on its own
    // schedule (longer on a loaded machine); what the service owns is the time after that.
    let unavailable: Vec<Instant> = answers
        .iter()
        .filter(|(_, a)| a.status == StatusCode::SERVICE_UNAVAILABLE)
        .map(|(at, _)| *at)
        .collect();
    let last = unavailable.iter().max().copied().unwrap_or(killed);
    eprintln!(
        "replica promoted {:?} after the kill (node timeout {NODE_TIMEOUT:?}); last 503 {:?} after the kill, {} in all",
        promoted.duration_since(killed),
        last.saturating_duration_since(killed),
        unavailable.len()
    );
    assert!(
        last <= promoted + Duration::from_secs(2),
        "503s went on {:?} after the replica's promotion ({} of them); the bound is 2 s",
        last.saturating_duration_since(promoted),
        unavailable.len()
    );
    sold_out_exactly(env, code, 150, &answers).await;
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_moved_to_another_master_mid_sale_is_followed_without_a_5xx() {
    let cluster = RedisCluster::start().await;
    let env = stack_on(&cluster).await;
    let code = "CLUMOVE";
    env.app().given_voucher(flash_voucher(code, 150, 1)).await;
    let slot = cluster.slot("{CLUMOVE}").await;
    let from = cluster.master_of(slot).await;
    let to = cluster
        .nodes()
        .await
        .into_iter()
        .find(|n| n.master && !n.slots.is_empty() && n.port != from.port)
        .expect("another master");

    // A use taken before the move, whose retry is sent while the slot is split.
    let first = env.app().api.attempt(code, "pre-c", "pre-o", 100_000).await;
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);

    let moving = &cluster;
    let api = env.app().api.clone();
    let mut retry = None;
    let retried = &mut retry;
    let (mut answers, _, _) = sale_through(&env, code, 300, async move {
        // Two keys moved, then 100 ms: the sale runs while the voucher's keys are split
        // between the two masters (its scripts answered TRYAGAIN, retried by the client),
        // and the retry of the use taken before is sent; then the rest of the keys move.
        moving
            .move_slot(slot, to.port, || {
                if retried.is_none() {
                    let api = api.clone();
                    *retried = Some(tokio::spawn(async move {
                        api.attempt(code, "pre-c", "pre-o", 100_000).await
                    }));
                }
                tokio::time::sleep(Duration::from_millis(100))
            })
            .await;
    })
    .await;
    assert_eq!(
        cluster.master_of(slot).await.port,
        to.port,
        "the slot moved"
    );
    let again = retry
        .expect("the slot had keys to move")
        .await
        .expect("the retry's task");
    assert_eq!(again.status, StatusCode::CREATED, "{:?}", again.body);
    assert_eq!(
        again.body["id"], first.body["id"],
        "a retry sent mid-migration answers the reservation"
    );
    answers.push((std::time::Instant::now(), first));
    let unavailable: Vec<_> = answers
        .iter()
        .filter(|(_, a)| a.status == StatusCode::SERVICE_UNAVAILABLE)
        .map(|(_, a)| &a.body)
        .collect();
    assert!(
        unavailable.is_empty(),
        "a moving slot is followed, never refused: {unavailable:?}"
    );
    sold_out_exactly(env, code, 150, &answers).await;
    drop(cluster);
}
