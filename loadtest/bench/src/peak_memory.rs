//! Benchmark 5, peak memory of the edge and the core after all runs, from their pid files.

use crate::probe::peak_rss_mib;
use crate::run::Run;

impl Run {
    pub fn peak_memory(&mut self) {
        let (edge_rss, core_rss) = (peak_rss_mib("run/edge.pid"), peak_rss_mib("run/core.pid"));
        self.table.push(format!(
            "| Peak RSS (VmHWM) after all runs | edge {} MiB, core {} MiB | | | |",
            edge_rss.map_or("?".into(), |v| format!("{v:.1}")),
            core_rss.map_or("?".into(), |v| format!("{v:.1}"))
        ));
    }
}
