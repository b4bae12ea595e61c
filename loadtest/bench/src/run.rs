//! One benchmark run: the stack it measures and what it has found so far. Each benchmark
//! adds to it from its own module (`impl Run` there); `report.rs` writes it out.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use voucher_testkit::invariants::Accepted;

use crate::bounds::PathFound;
use crate::invariants::remember_accepted;
use crate::ladder::{reserve_plan, SALE_CONNECTIONS, WARM_UP};
use crate::load;
use crate::probe::Stack;
use crate::StackArgs;

pub struct Run {
    pub stack: Stack,
    pub out: PathBuf,
    pub edge: SocketAddr,
    pub core: SocketAddr,
    /// Makes this run's voucher codes its own.
    pub run_id: String,
    /// Every 201 of every step, for the invariant check at the end.
    pub accepted: Mutex<Vec<Accepted>>,
    /// Rows of the summary table.
    pub table: Vec<String>,
    /// The ladders, below the table.
    pub report: String,
    /// Every path's standing, for the report's last section (`bounds`).
    pub found: Vec<PathFound>,
    /// The sale's failed step's burst, for the same section.
    pub sale_burst: Option<crate::bounds::SaleBurst>,
}

impl Run {
    /// Connects to the stack `args` names; the reports go to `out`.
    pub async fn connect(out: PathBuf, args: &StackArgs) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&out)?;
        let stack = Stack::connect(args).await?;
        Ok(Self {
            edge: stack.edge.parse()?,
            core: stack.core.parse()?,
            stack,
            out,
            run_id: chrono::Utc::now().format("%H%M%S").to_string(),
            accepted: Mutex::new(Vec::new()),
            table: Vec::new(),
            report: String::new(),
            found: Vec::new(),
            sale_burst: None,
        })
    }

    /// Records `found`, in place of an earlier finding of the same path.
    pub fn found(&mut self, found: PathFound) {
        self.found.retain(|f| f.path != found.path);
        self.found.push(found);
    }

    /// The finding of `path`, to be completed by a later benchmark (what is asked of the
    /// sale is known once the reject path is measured).
    pub fn found_mut(&mut self, path: &str) -> Option<&mut PathFound> {
        self.found.iter_mut().find(|f| f.path == path)
    }

    /// A ladder's warm-up, neither timed nor reported: new reservations of a new voucher
    /// `code` (`limit` uses, `mode`) sent to `target` at `rate` for [`WARM_UP`] (at most
    /// `step`); its 201s join the invariant check.
    #[allow(clippy::too_many_arguments)]
    pub async fn warm_up(
        &self,
        target: SocketAddr,
        code: &str,
        limit: i64,
        mode: &str,
        rate: u64,
        step: Duration,
        tag: &'static str,
    ) -> anyhow::Result<()> {
        self.stack.create_voucher(code, limit, mode).await?;
        let plan = reserve_plan(target, rate, WARM_UP.min(step), code, tag, SALE_CONNECTIONS);
        let outcome = load::run(plan).await?;
        remember_accepted(&self.accepted, code, tag, &outcome);
        Ok(())
    }
}
