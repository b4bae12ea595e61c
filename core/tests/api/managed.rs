//! Managed dependencies: every connection of a core over TLS with client certificates —
//! PostgreSQL with `ssl = on` and certificate login, Redis on its `--tls-port` alone, and
//! the broker behind a TLS listener with SASL SCRAM-SHA-512 login — configured the way an
//! operator configures them (database URL parameters, `[redis.tls]`, librdkafka properties
//! in `[kafka.properties]`). A flash sale runs end to end and the invariants hold; plain
//! connections and a wrong password are refused, so the TLS and the login are not
//! decoration.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use reqwest::StatusCode;
use sqlx::Connection;
use voucher_core::config::KafkaSettings;
use voucher_testkit::postgres::PostgresServer;
use voucher_testkit::stack::{flash_settings, Broker, RedisServer};
use voucher_testkit::tls::Certificates;

use crate::helpers::{database_url, TestApp, TestDb};
use crate::sale::Sale;
use crate::stack::{flash_voucher, FlashStack};

const USER: &str = "voucher-core";
const PASSWORD: &str = "scram-secret";

/// What a core needs for a Kafka with TLS client certificates and SCRAM login.
fn secured_kafka(kafka: &mut KafkaSettings, certs: &Certificates, password: &str) {
    let path = |p: std::path::PathBuf| p.display().to_string();
    let properties = [
        ("security.protocol", "SASL_SSL".to_owned()),
        ("sasl.mechanism", "SCRAM-SHA-512".to_owned()),
        ("sasl.username", USER.to_owned()),
        ("sasl.password", password.to_owned()),
        ("ssl.ca.location", path(certs.ca())),
        ("ssl.certificate.location", path(certs.client_cert())),
        ("ssl.key.location", path(certs.client_key())),
    ];
    let table: serde_json::Map<_, _> = properties
        .into_iter()
        .map(|(k, v)| (k.to_owned(), serde_json::Value::String(v)))
        .collect();
    kafka.properties =
        serde_json::from_value(serde_json::Value::Object(table)).expect("properties");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flash_sale_runs_with_every_dependency_behind_tls() {
    let certs = Certificates::make().expect("certificates");
    let postgres = PostgresServer::start_tls(&certs)
        .await
        .expect("PostgreSQL with TLS");
    let redis = RedisServer::start_tls(&certs).await;
    let broker = Broker::start_secured(&certs, USER, PASSWORD).await;
    let db = TestDb::create_on(&postgres.url()).await;
    assert!(db.url.contains("sslmode=verify-full"), "{}", db.url);

    // Each listener refuses what is not TLS with the client certificate.
    let plain = database_url(
        &format!("postgres://postgres@127.0.0.1:{}", postgres.port),
        "postgres",
    );
    let refused = sqlx::PgConnection::connect(&format!("{plain}?sslmode=disable")).await;
    assert!(refused.is_err(), "PostgreSQL took a connection without TLS");
    let no_cert = sqlx::PgConnection::connect(&format!(
        "{plain}?sslmode=verify-full&sslrootcert={}",
        certs.ca().display()
    ))
    .await;
    assert!(
        no_cert.is_err(),
        "PostgreSQL took a connection without a client certificate"
    );
    let plain_redis =
        redis::Client::open(format!("redis://127.0.0.1:{}/", redis.port)).expect("client");
    let ping = tokio::time::timeout(
        Duration::from_secs(5),
        plain_redis.get_multiplexed_async_connection(),
    )
    .await;
    assert!(!matches!(ping, Ok(Ok(_))), "Redis took a plain connection");

    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut settings = flash_settings(&db.url, &broker, &tag);
    let redis_settings = settings.redis.as_mut().expect("redis");
    redis_settings.url = redis.url().into();
    redis_settings.tls = redis.client_tls();
    let kafka = settings.kafka.as_mut().expect("kafka");

    // A wrong password gets no metadata; the right one does.
    let mut wrong = kafka.clone();
    secured_kafka(&mut wrong, &certs, "not-the-password");
    assert!(
        metadata(&wrong).await.is_err(),
        "the broker took a wrong password"
    );
    secured_kafka(kafka, &certs, PASSWORD);
    metadata(kafka).await.expect("metadata over SASL_SSL");

    let core = TestApp::start(&settings).await;
    // The test's own pool, gate and progress views use the same TLS settings.
    let env = FlashStack::assemble(db, broker, settings, vec![core], None).await;
    env.app().given_voucher(flash_voucher("TLS20", 20, 1)).await;
    let sale = Sale {
        in_flight: 50,
        ..Sale::new("TLS20", "tls", 200)
    }
    .run(env.app())
    .await;
    assert_eq!(sale.created(), 20);
    assert_eq!(sale.count(StatusCode::CONFLICT, "OUT_OF_STOCK"), 180);
    env.caught_up().await;
    assert_eq!(env.rows("TLS20").await, 20);
    env.finish(&sale.accepted()).await;
    drop(redis);
    drop(postgres);
}

/// The cluster's metadata with `kafka`'s settings (librdkafka's own client, as the core's).
async fn metadata(kafka: &KafkaSettings) -> anyhow::Result<usize> {
    let consumer: BaseConsumer = kafka.client_config().create()?;
    tokio::task::spawn_blocking(move || {
        let metadata = consumer.fetch_metadata(None, Duration::from_secs(10))?;
        Ok(metadata.brokers().len())
    })
    .await?
}
