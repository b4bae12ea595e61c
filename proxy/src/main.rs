use voucher_edge::config::EdgeSettings;

fn main() -> anyhow::Result<()> {
    let settings = EdgeSettings::load()?;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    if settings.log_format == "json" {
        logs.json().init();
    } else {
        logs.init();
    }
    tracing::info!(listen = %settings.listen, upstreams = ?settings.upstreams, "voucher-edge starting");
    voucher_edge::server::build(settings)?.run_forever()
}
