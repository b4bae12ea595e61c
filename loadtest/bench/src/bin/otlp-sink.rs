//! An OTLP/HTTP receiver that keeps the spans it is sent, for runs with tracing on
//! (`loadtest/traces-ab.sh`): the edge's exporter needs somewhere to send. Prints how many
//! spans it received every second, and with `--dump` every span received on SIGTERM.
//!   otlp-sink [--listen 127.0.0.1:4318] [--dump]

use std::time::Duration;

use voucher_testkit::otlp::OtlpReceiver;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let listen = args
        .iter()
        .position(|a| a == "--listen")
        .and_then(|i| args.get(i + 1))
        .map_or("127.0.0.1:4318", String::as_str);
    let dump = args.iter().any(|a| a == "--dump");
    let receiver = OtlpReceiver::start_on(listen).await;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => eprintln!("spans received: {}", receiver.count()),
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    if dump {
        for s in receiver.spans() {
            println!(
                "{} {} trace={} span={} parent={} links={:?} {:?}",
                s.service, s.name, s.trace_id, s.span_id, s.parent_span_id, s.links, s.attributes
            );
        }
    }
    println!("spans received: {}", receiver.count());
    Ok(())
}
