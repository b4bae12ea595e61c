//! The edge on a Redis Cluster: it listens on one node of the list it is given, and hears
//! the sold-out announcement a voucher's gate publishes on another master (a cluster
//! delivers Pub/Sub to every node); when the node it listens on dies, it listens on the
//! next one and still hears the next announcement.

use std::time::Duration;

use reqwest::StatusCode;
use voucher_contract::headers;
use voucher_core::flash::gate::Topology;
use voucher_testkit::invariants::Accepted;
use voucher_testkit::stack::{flash_voucher, until_subscribed, FlashStack, RedisCluster};
use voucher_testkit::wait::eventually;

fn node_url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

/// A code whose gate lives on a master other than the node on `port`.
async fn code_away_from(cluster: &RedisCluster, prefix: &str, port: u16) -> String {
    for i in 0.. {
        let code = format!("{prefix}{i}");
        if cluster
            .master_of(cluster.slot(&format!("{{{code}}}")).await)
            .await
            .port
            != port
        {
            return code;
        }
    }
    unreachable!("some code hashes away from one master")
}

/// Sells out a 2-use voucher `code` at a core and waits until the edge answers for it
/// alone, having heard the announcement (`signals` in all so far).
async fn sold_out_at_a_core(stack: &FlashStack, code: &str, signals: f64) -> Vec<Accepted> {
    stack.app().given_voucher(flash_voucher(code, 2, 1)).await;
    let mut accepted = Vec::new();
    for i in 0..2 {
        let (customer, order) = (format!("{code}-c{i}"), format!("{code}-o{i}"));
        let resp = stack.app().reserve(code, &customer, &order, 100_000).await;
        assert_eq!(resp.status(), StatusCode::CREATED);
        accepted.push(Accepted::new(code, &customer, &order));
    }
    let edge = stack.edge();
    eventually(
        Duration::from_secs(10),
        "the edge to hear the sell-out",
        || async {
            let m = edge.metrics().await;
            (m.sum("edge_sold_out_signals_total", &[]) >= signals).then_some(())
        },
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the edge to answer alone",
        || async {
            let resp = edge
                .api
                .reserve(code, "late", &format!("{code}-late"), 100_000)
                .await;
            (resp.status() == StatusCode::CONFLICT
                && resp.headers().get(headers::SERVED_BY).is_some())
            .then_some(())
        },
    )
    .await;
    // A holder's retry still goes to a core and gets its 201.
    let again = edge
        .api
        .reserve(code, &format!("{code}-c0"), &format!("{code}-o0"), 100_000)
        .await;
    assert_eq!(again.status(), StatusCode::CREATED);
    accepted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_edge_hears_a_sell_out_on_another_master_and_listens_on_when_its_node_dies() {
    let mut cluster = RedisCluster::start().await;
    let url = cluster.url();
    let stack = FlashStack::builder()
        .cores(2)
        .edge(env!("CARGO_BIN_EXE_voucher-edge"), Duration::from_secs(60))
        .start_with(|s| {
            let redis = s.redis.as_mut().expect("flash settings have redis");
            redis.topology = Topology::Cluster;
            redis.url = url.into();
        })
        .await;
    let prefix = stack.key_prefix().to_owned();
    let channel = voucher_contract::sold_out_channel(&prefix);
    let ports = cluster.ports();
    // The edge listens on the first node of its list.
    until_subscribed(&node_url(ports[0]), &channel).await;
    let first = code_away_from(&cluster, "EDGECL", ports[0]).await;
    let mut accepted = sold_out_at_a_core(&stack, &first, 1.0).await;

    // The node it listens on dies: the edge moves to the next node of its list.
    cluster.kill(ports[0]);
    cluster.until_settled().await;
    until_subscribed(&node_url(ports[1]), &channel).await;
    let second = code_away_from(&cluster, "EDGECM", ports[1]).await;
    accepted.extend(sold_out_at_a_core(&stack, &second, 2.0).await);
    stack.finish(&accepted).await;
    drop(cluster);
}
