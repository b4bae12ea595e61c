use tokio_util::sync::CancellationToken;
use voucher_core::config::Settings;
use voucher_core::startup::{shutdown_signal, Application};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = Settings::load()?;
    voucher_core::telemetry::init(&settings.log);
    let app = Application::build(&settings).await?;
    tracing::info!(api = %app.api_addr(), metrics = %app.metrics_addr(), "voucher-core started");
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        trigger.cancel();
    });
    app.run_until_stopped(shutdown).await
}
