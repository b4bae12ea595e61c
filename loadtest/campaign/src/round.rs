//! One round: a flash voucher, a paced sale through the edge by customers who retry their
//! own orderId, one fault struck and healed during it, then the checks.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use voucher_testkit::helpers::ApiClient;
use voucher_testkit::invariants::{self, Accepted, Report};
use voucher_testkit::stack::flash_voucher;

use crate::fault::Fault;
use crate::rng::Rng;
use crate::stack::{CampaignStack, RECONCILE_GRACE, RECONCILE_INTERVAL};
use crate::twin;

/// How long after the later of its 201 and the fault's end a row may take to appear.
pub const ROW_BOUND: Duration = Duration::from_secs(15);
/// How long after the fault's end the invariants, drift included, may take to hold: the
/// grace plus a few reconciliation rounds and a consumer catching up.
pub fn settle_bound() -> Duration {
    RECONCILE_GRACE + 5 * RECONCILE_INTERVAL + Duration::from_secs(10)
}
/// A customer retries a 503 or a lost connection this often, for as long as the round lasts.
const RETRY_PAUSE: Duration = Duration::from_millis(150);

/// The size of every round of a campaign.
#[derive(Debug, Clone, Copy)]
pub struct RoundSize {
    /// Uses of the round's voucher.
    pub limit: i64,
    /// Customers arriving: one and a half per use, so the sale sells out late in its
    /// arrivals (after the fault has struck) and only if every use given back is sold again.
    pub customers: usize,
    /// Arrivals are spread evenly over this.
    pub sale: Duration,
}

impl RoundSize {
    pub const FULL: RoundSize = RoundSize {
        limit: 100,
        customers: 150,
        sale: Duration::from_secs(3),
    };
    pub const SHORT: RoundSize = RoundSize {
        limit: 30,
        customers: 45,
        sale: Duration::from_millis(1500),
    };
}

/// A round as the seed draws it.
#[derive(Debug, Clone)]
pub struct RoundPlan {
    pub index: usize,
    pub fault: Fault,
    pub size: RoundSize,
    /// When the fault strikes, from the first arrival.
    pub fault_at: Duration,
    /// How long it lasts before it is healed.
    pub fault_for: Duration,
    pub seed: u64,
}

impl RoundPlan {
    pub fn draw(index: usize, fault: Fault, size: RoundSize, rng: &mut Rng) -> Self {
        let sale_ms = size.sale.as_millis() as u64;
        Self {
            index,
            fault,
            size,
            // While uses are still for sale: the fault must find something to break.
            fault_at: Duration::from_millis(rng.between(sale_ms / 10, sale_ms * 6 / 10)),
            fault_for: fault.lasts(Duration::from_millis(rng.between(1000, 3000))),
            seed: rng.next_u64(),
        }
    }
}

/// What a round found.
#[derive(Debug, Clone)]
pub struct RoundOutcome {
    pub plan: RoundPlan,
    pub violations: Vec<String>,
    /// 201s the customers hold at the end (accepted and not released).
    pub held: usize,
    pub released: usize,
    /// Answers of 503 the customers retried through.
    pub unavailable: usize,
    /// From the fault's end until the invariants held, drift 0 included.
    pub recovered_in: Option<Duration>,
    /// The longest any 201 waited for its row, from the later of the 201 and the fault's end.
    pub worst_row_wait: Duration,
    /// 201s whose row never came (each also a violation): what a failover to a standby
    /// that lacked them lost.
    pub lost: usize,
    /// Uses nobody holds once the sell-out check is over: 0 in a passed round (a use
    /// neither sold nor free past [`unsold_bound`] is a violation).
    pub unsold: i64,
    /// Uses sold after the sale, to the customers of the sell-out check.
    pub sold_late: usize,
    /// What the fault did, where that is not plain from its name (connections taken,
    /// where the twin orders went); empty otherwise.
    pub effect: String,
}

impl RoundOutcome {
    /// A round that could not run to its end.
    pub fn broken(plan: RoundPlan, why: String) -> Self {
        Self {
            violations: vec![why],
            held: 0,
            released: 0,
            unavailable: 0,
            recovered_in: None,
            worst_row_wait: Duration::ZERO,
            lost: 0,
            unsold: plan.size.limit,
            sold_late: 0,
            effect: String::new(),
            plan,
        }
    }

    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// One customer's checkout as the client saw it.
#[derive(Debug, Clone)]
pub struct Checkout {
    pub customer: String,
    pub order: String,
    /// The last status (0: no answer, the connection failed).
    pub status: u16,
    /// Every status answered on the way.
    pub answers: Vec<u16>,
    pub accepted_at: Option<Instant>,
    /// The last answer said `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// When the request of the last answer was sent.
    pub sent_at: Instant,
    pub released: bool,
}

pub async fn run(stack: &mut CampaignStack, plan: RoundPlan) -> anyhow::Result<RoundOutcome> {
    let mut rng = Rng::new(plan.seed);
    let code = format!("R{}X{:08X}", plan.index, plan.seed as u32);
    let body = flash_voucher(&code, plan.size.limit, 1);
    let created = stack.admin().create_voucher(&body).await;
    anyhow::ensure!(
        created.status() == StatusCode::CREATED,
        "creating voucher {code}: {}",
        created.status()
    );
    let round_start = stack.progress.high_watermarks().await?;

    // The customers, paced; the fault on its schedule meanwhile.
    let started = Instant::now();
    let give_up = started + plan.size.sale + plan.fault_at + plan.fault_for + ROW_BOUND;
    let customers = tokio::spawn(customers(
        stack.publics(),
        code.clone(),
        plan.size,
        rng.fork(),
        started,
        give_up,
    ));
    tokio::time::sleep_until((started + plan.fault_at).into()).await;
    let mut struck = plan
        .fault
        .strike(stack, &mut rng, round_start, &code, give_up)
        .await?;
    tokio::time::sleep(plan.fault_for).await;
    struck.heal(stack).await?;
    let healed = Instant::now();
    let mut checkouts = customers.await??;
    // The round's side of each twin order is one more of its checkouts.
    let twins = struck.twins().await?;
    checkouts.extend(twins.iter().map(|pair| pair.here.clone()));
    struck.after_sale(stack).await?;
    // A late customer: the gate is read (and rebuilt, if a fault took it) once more.
    checkouts.push(
        checkout(
            &stack.public(),
            &code,
            format!("{code}-late"),
            format!("{code}-late-o"),
            Instant::now() + ROW_BOUND,
        )
        .await,
    );

    let mut violations = Vec::new();
    let mut accepted: Vec<Accepted> = checkouts
        .iter()
        .filter(|c| c.status == 201)
        .map(|c| Accepted::new(&code, &c.customer, &c.order))
        .collect();
    let (worst_row_wait, lost) =
        rows_within_bound(stack, &checkouts, healed, &mut violations).await?;
    let (report, recovered_in) = settled(stack, &code, &accepted, healed).await?;
    violations.extend(report.violations);
    check_answers(&checkouts, plan.size.limit, &mut violations);
    check_replays(stack, &code, &checkouts, &mut violations).await?;
    struck
        .check_paused(&code, &checkouts, &mut violations)
        .await?;
    let mut effect = struck.effect().to_owned();
    if !twins.is_empty() {
        effect = twin::check(stack, &code, &twins, healed, &mut violations).await?;
    }

    // What is left of the stock must sell out: a use neither sold nor free once the bound
    // has passed is a violation, not a figure.
    let sold_late = sell_out(stack, &code, plan.size.limit, &mut violations).await?;
    if !sold_late.is_empty() {
        accepted.extend(
            sold_late
                .iter()
                .map(|c| Accepted::new(&code, &c.customer, &c.order)),
        );
        let mut report = invariants::check(&stack.pool, &accepted).await?;
        invariants::check_gates(&stack.pool, &stack.gate, Some(&code), &mut report).await?;
        violations.extend(report.violations);
    }

    let active: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM redemptions WHERE voucher_code = $1 AND status IN ('RESERVED', 'CONFIRMED')",
    )
    .bind(&code)
    .fetch_one(&stack.pool)
    .await?;
    let held = checkouts
        .iter()
        .filter(|c| c.status == 201 && !c.released)
        .count();
    Ok(RoundOutcome {
        violations,
        held,
        released: checkouts.iter().filter(|c| c.released).count(),
        unavailable: checkouts
            .iter()
            .flat_map(|c| &c.answers)
            .filter(|s| **s == 503)
            .count(),
        recovered_in,
        worst_row_wait,
        lost,
        unsold: plan.size.limit - active,
        sold_late: sold_late.len(),
        effect,
        plan,
    })
}

/// The round's customers: customer `i` arrives at its moment of the sale, reserves, and then
/// may release (15%) or confirm (25%); one in ten tries a second order as well, which the
/// per-customer limit of 1 must refuse while the first holds.
async fn customers(
    apis: Vec<ApiClient>,
    code: String,
    size: RoundSize,
    mut rng: Rng,
    started: Instant,
    give_up: Instant,
) -> anyhow::Result<Vec<Checkout>> {
    // Customer i goes through edge i mod n, as a load balancer in front of the edges spreads them.
    let apis: Vec<std::sync::Arc<ApiClient>> = apis.into_iter().map(std::sync::Arc::new).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..size.customers {
        let arrive = started + size.sale.mul_f64(i as f64 / size.customers as f64);
        let (api, code) = (apis[i % apis.len()].clone(), code.clone());
        let mut rng = rng.fork();
        tasks.spawn(async move {
            tokio::time::sleep_until(arrive.into()).await;
            let customer = format!("{code}-c{i}");
            let mut done = Vec::new();
            let orders = if rng.chance(10) { 2 } else { 1 };
            for n in 0..orders {
                let order = format!("{code}-o{i}-{n}");
                let settle = rng.chance(40);
                let mut c = checkout(&api, &code, customer.clone(), order, give_up).await;
                if settle && c.status == 201 {
                    settle_order(&api, &code, &mut c, rng.chance(40), give_up).await;
                }
                done.push(c);
            }
            done
        });
    }
    let mut all = Vec::with_capacity(size.customers);
    while let Some(done) = tasks.join_next().await {
        // A customer lost would take its 201s out of the checks: the round cannot count.
        all.extend(done.map_err(|e| anyhow::anyhow!("a customer's task failed: {e}"))?);
    }
    Ok(all)
}

/// The last answer of [`until_answered`]: its status, whether it said
/// `Idempotent-Replayed`, and when its request was sent.
pub(crate) struct Last {
    pub status: u16,
    pub replayed: bool,
    pub sent_at: Instant,
}

/// Sends a request until it gets an answer other than 503 or a lost connection (status
/// 0), or `give_up` passes; every status on the way goes to `answers`. Returns the last.
async fn until_answered<F, R>(give_up: Instant, answers: &mut Vec<u16>, mut send: F) -> Last
where
    F: FnMut() -> R,
    R: std::future::Future<Output = reqwest::Result<reqwest::Response>>,
{
    loop {
        let sent_at = Instant::now();
        let (status, replayed) = match send().await {
            Ok(r) => (
                r.status().as_u16(),
                r.headers()
                    .get("idempotent-replayed")
                    .is_some_and(|v| v == "true"),
            ),
            Err(_) => (0, false),
        };
        answers.push(status);
        if (status == 503 || status == 0) && Instant::now() < give_up {
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        }
        return Last {
            status,
            replayed,
            sent_at,
        };
    }
}

/// Reserves, retrying 503s and lost connections until `give_up`.
pub(crate) async fn checkout(
    api: &ApiClient,
    code: &str,
    customer: String,
    order: String,
    give_up: Instant,
) -> Checkout {
    let body = json!({ "customerId": customer, "orderId": order, "orderAmount": 100_000 });
    let url = format!("{}/vouchers/{code}/reservations", api.base);
    let mut answers = Vec::new();
    let last = until_answered(give_up, &mut answers, || {
        api.client.post(&url).json(&body).send()
    })
    .await;
    Checkout {
        customer,
        order,
        status: last.status,
        accepted_at: (last.status == 201).then(Instant::now),
        replayed: last.replayed,
        sent_at: last.sent_at,
        answers,
        released: false,
    }
}

/// Releases (`release`) or confirms the order, retrying 503s and lost connections; its
/// answers join the checkout's, and a release answered 200 gave the use back.
async fn settle_order(
    api: &ApiClient,
    code: &str,
    checkout: &mut Checkout,
    release: bool,
    give_up: Instant,
) {
    let url = format!(
        "{}/vouchers/{code}/reservations/{}",
        api.base, checkout.order
    );
    let status = until_answered(give_up, &mut checkout.answers, || {
        if release {
            api.client.delete(&url).send()
        } else {
            api.client.post(format!("{url}/confirm")).send()
        }
    })
    .await;
    checkout.released = release && status.status == 200;
}

/// Waits until every 201 has its row, at most [`ROW_BOUND`] after the later of the 201 and
/// the fault's end; returns the longest wait past that point, and how many never had one.
async fn rows_within_bound(
    stack: &CampaignStack,
    checkouts: &[Checkout],
    healed: Instant,
    violations: &mut Vec<String>,
) -> anyhow::Result<(Duration, usize)> {
    let mut waiting: BTreeMap<String, Instant> = checkouts
        .iter()
        .filter_map(|c| Some((c.order.clone(), c.accepted_at?.max(healed))))
        .collect();
    let mut worst = Duration::ZERO;
    loop {
        let orders: Vec<&String> = waiting.keys().collect();
        // Unreadable for a moment (the database's outage is the fault): nothing found yet.
        let found: Vec<String> =
            sqlx::query_scalar("SELECT order_id FROM redemptions WHERE order_id = ANY($1)")
                .bind(&orders)
                .fetch_all(&stack.pool)
                .await
                .unwrap_or_default();
        let now = Instant::now();
        for order in found {
            if let Some(from) = waiting.remove(&order) {
                worst = worst.max(now.saturating_duration_since(from));
            }
        }
        let late: Vec<&String> = waiting
            .iter()
            .filter(|(_, from)| now.saturating_duration_since(**from) > ROW_BOUND)
            .map(|(order, _)| order)
            .collect();
        if !late.is_empty() {
            let lost = late.len();
            for order in late {
                violations.push(format!(
                    "2: order {order} got a 201 and has no row {} s later",
                    ROW_BOUND.as_secs()
                ));
            }
            return Ok((worst.max(ROW_BOUND), lost));
        }
        if waiting.is_empty() {
            return Ok((worst, 0));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks invariants 1 to 4 and the round's gate (5) until they hold or the bound passes.
/// A check that cannot run yet (the campaign's own connection to a Redis that just
/// restarted) is tried again, and reported if it still cannot run at the bound.
pub(crate) async fn settled(
    stack: &CampaignStack,
    code: &str,
    accepted: &[Accepted],
    healed: Instant,
) -> anyhow::Result<(Report, Option<Duration>)> {
    loop {
        let checked = async {
            let mut report = invariants::check(&stack.pool, accepted).await?;
            invariants::check_gates(&stack.pool, &stack.gate, Some(code), &mut report).await?;
            anyhow::Ok(report)
        }
        .await;
        let report = match checked {
            Ok(report) if report.holds() => return Ok((report, Some(healed.elapsed()))),
            Ok(report) => report,
            Err(e) => Report {
                violations: vec![format!("the checks could not run: {e:#}")],
                ..Report::default()
            },
        };
        if healed.elapsed() > settle_bound() {
            return Ok((report, None));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How long after the sale a use may stay neither sold nor free: the grace, two rounds of
/// reconciliation (a repair needs two that agree), and a second for the last round to run.
pub fn unsold_bound() -> Duration {
    RECONCILE_GRACE + 2 * RECONCILE_INTERVAL + Duration::from_secs(1)
}

/// New customers reserve until the voucher is sold out in PostgreSQL: every use left must
/// be sellable. A 409 `OUT_OF_STOCK` while PostgreSQL holds fewer uses than the limit means
/// a use is neither sold nor free; that may last up to [`unsold_bound`]. Returns the
/// checkouts that got a use.
async fn sell_out(
    stack: &CampaignStack,
    code: &str,
    limit: i64,
    violations: &mut Vec<String>,
) -> anyhow::Result<Vec<Checkout>> {
    let api = stack.public();
    let deadline = Instant::now() + unsold_bound();
    let mut sold = Vec::new();
    for i in 0.. {
        let c = checkout(
            &api,
            code,
            format!("{code}-m{i}"),
            format!("{code}-m{i}-o"),
            deadline,
        )
        .await;
        match c.status {
            201 => sold.push(c),
            409 => {
                let active: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM redemptions
                     WHERE voucher_code = $1 AND status IN ('RESERVED', 'CONFIRMED')",
                )
                .bind(code)
                .fetch_one(&stack.pool)
                .await?;
                if active >= limit {
                    return Ok(sold);
                }
                if Instant::now() > deadline {
                    violations.push(format!(
                        "unsold: {} uses neither sold nor free {:.1} s after the sale",
                        limit - active,
                        unsold_bound().as_secs_f64()
                    ));
                    return Ok(sold);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => {
                violations.push(format!("sell-out: a new customer got {other}"));
                return Ok(sold);
            }
        }
        if i as i64 > 2 * limit {
            violations.push(format!("sell-out: {i} customers and not sold out"));
            return Ok(sold);
        }
    }
    Ok(sold)
}

/// Every customer that got a 201 replays its order with the same body: the answer must be
/// a 201 marked `Idempotent-Replayed` whose status is PostgreSQL's row's, whatever the
/// gate went through.
pub(crate) async fn check_replays(
    stack: &CampaignStack,
    code: &str,
    checkouts: &[Checkout],
    violations: &mut Vec<String>,
) -> anyhow::Result<()> {
    let api = stack.public();
    let give_up = Instant::now() + settle_bound();
    for c in checkouts.iter().filter(|c| c.status == 201) {
        let body = json!({ "customerId": c.customer, "orderId": c.order, "orderAmount": 100_000 });
        let url = format!("{}/vouchers/{code}/reservations", api.base);
        let answer = loop {
            match api.client.post(&url).json(&body).send().await {
                Ok(r) if r.status() != StatusCode::SERVICE_UNAVAILABLE => break Some(r),
                _ if Instant::now() > give_up => break None,
                _ => tokio::time::sleep(RETRY_PAUSE).await,
            }
        };
        let Some(answer) = answer else {
            violations.push(format!("replay: order {} got no answer", c.order));
            continue;
        };
        let status = answer.status();
        let replayed = answer.headers().get("idempotent-replayed").is_some();
        let by_edge = answer.headers().get("x-served-by").is_some();
        let said: serde_json::Value = answer.json().await.unwrap_or_default();
        let row: Option<String> =
            sqlx::query_scalar("SELECT status FROM redemptions WHERE order_id = $1")
                .bind(&c.order)
                .fetch_optional(&stack.pool)
                .await?;
        let told = said["status"].as_str().or(said["error"].as_str());
        if status != StatusCode::CREATED || !replayed || told != row.as_deref() {
            let who = if by_edge { "the edge" } else { "a core" };
            violations.push(format!(
                "replay: order {} answered {status} {told:?} by {who} (replayed: {replayed}), PostgreSQL holds {row:?}",
                c.order
            ));
        }
    }
    Ok(())
}

/// What the answers alone must show: no more 201s held than uses, no customer holding two,
/// no 5xx but 503.
pub(crate) fn check_answers(checkouts: &[Checkout], limit: i64, violations: &mut Vec<String>) {
    let held: Vec<&Checkout> = checkouts
        .iter()
        .filter(|c| c.status == 201 && !c.released)
        .collect();
    if held.len() as i64 > limit {
        violations.push(format!(
            "1: customers hold {} 201s for {limit} uses",
            held.len()
        ));
    }
    let mut holders = HashSet::new();
    for c in &held {
        if !holders.insert(&c.customer) {
            violations.push(format!("3: customer {} holds two 201s", c.customer));
        }
    }
    let mut bad: BTreeMap<u16, usize> = BTreeMap::new();
    for s in checkouts.iter().flat_map(|c| &c.answers) {
        if *s >= 500 && *s != 503 {
            *bad.entry(*s).or_default() += 1;
        }
    }
    for (status, n) in bad {
        violations.push(format!("answers: {n} answers of {status}"));
    }
}
