//! A short seeded slice of the fault campaign, in the tests: one round of each of four
//! faults (a core killed, the broker frozen, Redis back in time, events duplicated), on
//! debug binaries, checked exactly as the full campaign checks.

use voucher_campaign::fault::Fault;
use voucher_campaign::rng::Rng;
use voucher_campaign::round::{RoundPlan, RoundSize};
use voucher_campaign::run_plans;
use voucher_campaign::stack::Binaries;

/// The debug binaries beside this test's own executable (`cargo test --workspace` builds them).
fn binaries() -> Binaries {
    let exe = std::env::current_exe().expect("test executable");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    Binaries::in_dir(profile).expect("cargo test --workspace builds voucher-core and voucher-edge")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_seeded_slice_of_the_campaign_passes() {
    let mut rng = Rng::new(42);
    let plans: Vec<RoundPlan> = [
        Fault::KillCore,
        Fault::PauseBroker,
        Fault::RedisOldSnapshot,
        Fault::DuplicateEvents,
    ]
    .into_iter()
    .enumerate()
    .map(|(i, fault)| RoundPlan::draw(i, fault, RoundSize::SHORT, &mut rng))
    .collect();
    let outcomes = run_plans(&binaries(), plans, |o| {
        eprintln!(
            "{} {:?} {:?}",
            o.plan.fault.name(),
            o.recovered_in,
            o.violations
        )
    })
    .await
    .expect("the campaign runs");
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(|o| format!("{}: {}", o.plan.fault.name(), o.violations.join("; ")))
        .collect();
    assert_eq!(outcomes.len(), 4);
    assert!(failed.is_empty(), "rounds failed: {failed:#?}");
}
