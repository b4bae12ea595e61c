//! The `twin-orders` fault: customers send one orderId to the round's voucher and to a
//! second flash voucher (its twin) at the same moment, with the same customer and amount.
//! An orderId is one reservation: one of the two vouchers may have it, never both; the one
//! that answered 201 holds PostgreSQL's row, and a replay there tells that row.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use voucher_core::domain::VoucherCode;
use voucher_testkit::invariants::Accepted;
use voucher_testkit::stack::flash_voucher;

use crate::round::{check_answers, check_replays, checkout, settled, Checkout};
use crate::stack::CampaignStack;

/// How many orderIds race, and the twin voucher's uses (one for each, should they all
/// land there).
pub const TWINS: usize = 10;

/// One orderId sent to both vouchers, and what each answered in the end (after retrying
/// 503s and lost connections).
#[derive(Debug, Clone)]
pub struct TwinOrder {
    /// The round's voucher's answer.
    pub here: Checkout,
    /// The twin voucher's answer.
    pub there: Checkout,
}

/// The twin voucher of the round of `code`.
pub fn twin_code(code: &str) -> String {
    format!("{code}TW")
}

/// Creates the twin voucher, waits until its gate is loaded (creating a flash voucher
/// loads it; a gate still loading would answer 503 and lose every race by a retry), then
/// starts the race.
pub async fn race(
    stack: &CampaignStack,
    code: &str,
    give_up: Instant,
) -> anyhow::Result<tokio::task::JoinHandle<Vec<TwinOrder>>> {
    let twin = twin_code(code);
    let created = stack
        .admin()
        .create_voucher(&flash_voucher(&twin, TWINS as i64, 1))
        .await;
    anyhow::ensure!(
        created.status() == StatusCode::CREATED,
        "creating the twin voucher {twin}: {}",
        created.status()
    );
    let parsed = VoucherCode::parse(&twin).map_err(|e| anyhow::anyhow!("{twin}: {e:?}"))?;
    let loaded_by = Instant::now() + Duration::from_secs(10);
    while stack.gate.remaining(&parsed).await.ok().flatten().is_none() {
        anyhow::ensure!(
            Instant::now() < loaded_by,
            "the twin voucher's gate did not load in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let api = Arc::new(stack.public());
    let code = code.to_owned();
    Ok(tokio::spawn(async move {
        let mut pairs = tokio::task::JoinSet::new();
        for i in 0..TWINS {
            let (api, code, twin) = (api.clone(), code.clone(), twin.clone());
            pairs.spawn(async move {
                let customer = format!("{code}-t{i}");
                let order = format!("{code}-t{i}-o");
                let (here, there) = tokio::join!(
                    checkout(&api, &code, customer.clone(), order.clone(), give_up),
                    checkout(&api, &twin, customer, order, give_up),
                );
                TwinOrder { here, there }
            });
        }
        let mut all = Vec::with_capacity(TWINS);
        while let Some(pair) = pairs.join_next().await {
            // A pair lost would only shrink the check; a panic here is the campaign's bug.
            if let Ok(pair) = pair {
                all.push(pair);
            }
        }
        all
    }))
}

/// The twin voucher's side of the checks: no orderId with a 201 from both vouchers, the
/// row of each 201 on the voucher that gave it, the twin voucher's invariants and gate,
/// its replays, and no 5xx but 503 in its answers. The round's own side of each pair is
/// among the round's checkouts and checked with them. Returns where the orders went.
pub async fn check(
    stack: &CampaignStack,
    code: &str,
    twins: &[TwinOrder],
    healed: Instant,
    violations: &mut Vec<String>,
) -> anyhow::Result<String> {
    let twin = twin_code(code);
    for pair in twins {
        let order = &pair.here.order;
        if pair.here.status == 201 && pair.there.status == 201 {
            violations.push(format!("twin: order {order} got a 201 from both vouchers"));
        }
        let row: Option<String> =
            sqlx::query_scalar("SELECT voucher_code FROM redemptions WHERE order_id = $1")
                .bind(order)
                .fetch_optional(&stack.pool)
                .await?;
        let winner = match (pair.here.status, pair.there.status) {
            (201, _) => Some(code),
            (_, 201) => Some(twin.as_str()),
            _ => None,
        };
        // Unanswered in the end (503 or no answer at give-up): it may have a row anywhere.
        let unanswered = [&pair.here, &pair.there]
            .iter()
            .any(|c| c.status == 503 || c.status == 0);
        if (winner.is_some() || !unanswered) && row.as_deref() != winner {
            violations.push(format!(
                "twin: order {order} answered 201 by {winner:?}, PostgreSQL's row is on {row:?}"
            ));
        }
    }
    let there: Vec<Checkout> = twins.iter().map(|p| p.there.clone()).collect();
    let accepted: Vec<Accepted> = there
        .iter()
        .filter(|c| c.status == 201)
        .map(|c| Accepted::new(&twin, &c.customer, &c.order))
        .collect();
    let (report, _) = settled(stack, &twin, &accepted, healed).await?;
    violations.extend(report.violations.into_iter().map(|v| format!("twin: {v}")));
    check_answers(&there, TWINS as i64, violations);
    check_replays(stack, &twin, &there, violations).await?;
    let here = twins.iter().filter(|p| p.here.status == 201).count();
    Ok(format!(
        "{} orderIds: {here} went here, {} to the twin",
        twins.len(),
        accepted.len()
    ))
}
