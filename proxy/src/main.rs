use voucher_edge::config::EdgeSettings;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let settings = EdgeSettings::load()?;
    tracing::info!(listen = %settings.listen, upstreams = ?settings.upstreams, "voucher-edge starting");
    voucher_edge::server::build(settings)?.run_forever()
}
