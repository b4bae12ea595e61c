//! A short seeded slice of the fault campaign, in the tests: one round of each of a few
//! faults on each kind of stack, on debug binaries, checked exactly as the full campaign
//! checks.

use std::path::PathBuf;
use std::time::Duration;

use voucher_campaign::fault::Fault;
use voucher_campaign::rng::Rng;
use voucher_campaign::round::{RoundPlan, RoundSize};
use voucher_campaign::stack::{Binaries, Layout};
use voucher_campaign::{run_plans, Setup};
use voucher_core::config::Decision;
use voucher_testkit::postgres::Replication;

/// The debug binaries beside this test's own executable (`cargo test --workspace` builds them).
fn binaries() -> Binaries {
    let exe = std::env::current_exe().expect("test executable");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    Binaries::in_dir(profile).expect("cargo test --workspace builds voucher-core and voucher-edge")
}

/// Runs one round of each of `faults` on one stack of `up.sh`'s layout and returns what
/// failed.
async fn slice(seed: u64, decision: Decision, faults: &[Fault]) -> Vec<String> {
    slice_of(seed, Layout::Single, decision, Duration::ZERO, faults).await
}

/// [`slice`] on a stack of `layout`, its standby streaming over a link of `link_delay`.
async fn slice_of(
    seed: u64,
    layout: Layout,
    decision: Decision,
    link_delay: Duration,
    faults: &[Fault],
) -> Vec<String> {
    let mut rng = Rng::new(seed);
    let plans: Vec<RoundPlan> = faults
        .iter()
        .enumerate()
        .map(|(i, fault)| RoundPlan::draw(i, *fault, RoundSize::SHORT, &mut rng))
        .collect();
    // Where the campaign's `CAMPAIGN_LOGS` puts the cores' logs of a failed round.
    let logs = std::env::var_os("CAMPAIGN_LOGS").map(PathBuf::from);
    let setup = Setup {
        layout,
        decision,
        replication: Replication::Synchronous,
        link_delay,
    };
    let outcomes = run_plans(&binaries(), setup, plans, logs.as_deref(), |o| {
        eprintln!(
            "{} {:?} {:?} {}",
            o.plan.fault.name(),
            o.recovered_in,
            o.violations,
            o.effect
        )
    })
    .await
    .expect("the campaign runs");
    assert_eq!(outcomes.len(), faults.len());
    outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(|o| format!("{}: {}", o.plan.fault.name(), o.violations.join("; ")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seeded_slice_of_the_campaign_passes() {
    let failed = slice(
        42,
        Decision::Broker,
        &[
            Fault::KillCore,
            Fault::PauseBroker,
            Fault::KillBroker,
            Fault::DuplicateEvents,
        ],
    )
    .await;
    assert!(failed.is_empty(), "rounds failed: {failed:#?}");
}

/// With PostgreSQL deciding before the 201, a gate restored from a snapshot taken seconds
/// earlier only lets more requests through to the database, which refuses what it cannot
/// hold: no 201 beyond the limit. The broker's faults no longer touch the answers at all,
/// and a core whose clock steps a minute back decides nothing by it. A PostgreSQL server
/// that crashes and restarts mid-sale keeps every row it acknowledged, and so does one lost
/// mid-sale whose synchronous standby is promoted. An operator's pause mid-sale takes no new
/// use until the resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_postgresql_deciding_a_gate_back_in_time_oversells_nothing() {
    let failed = slice(
        7,
        Decision::Database,
        &[
            Fault::RedisOldSnapshot,
            Fault::RedisOldSnapshot,
            Fault::KillCore,
            Fault::PauseBroker,
            Fault::ClockBehind,
            Fault::DatabaseRestart,
            Fault::OperatorPause,
            Fault::PrimaryLost,
        ],
    )
    .await;
    assert!(failed.is_empty(), "rounds failed: {failed:#?}");
}

/// The scaled layout (`scripts/up-scaled.sh`'s: a Redis Cluster, three cores, two edges, six
/// partitions, PostgreSQL with a synchronous standby): the Redis master of the round's
/// voucher killed, the PostgreSQL primary lost and its standby promoted, a core killed.
/// The standby streams over a link of 10 ms each way, cut with the primary: a synchronous
/// standby in another data centre still has every acknowledged commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_scaled_layout_loses_nothing_to_a_master_a_primary_or_a_core() {
    let failed = slice_of(
        11,
        Layout::Scaled,
        Decision::Database,
        Duration::from_millis(10),
        &[
            Fault::RedisMasterKilled,
            Fault::PrimaryLost,
            Fault::KillCore,
        ],
    )
    .await;
    assert!(failed.is_empty(), "rounds failed: {failed:#?}");
}
