//! Databases, apps and requests: each test gets its own PostgreSQL database and its own
//! app on port 0.

use std::future::Future;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use voucher_core::config::Settings;
use voucher_core::startup::Application;

use crate::invariants::{self, Accepted};
use crate::metrics::Metrics;
use crate::sale::Attempt;

pub const ADMIN_TOKEN: &str = "test-admin-token";
/// The token that reads order lists only (the edge's).
pub const ORDERS_TOKEN: &str = "test-orders-token";

/// Where the tests' PostgreSQL server is (no database name). Without TLS, as the local
/// stack: over loopback it protects nothing, and left to sqlx's default (`prefer`) every
/// statement of every test was encrypted on both ends (README, "Managed PostgreSQL").
fn server_url() -> String {
    std::env::var("TEST_DATABASE_SERVER")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432?sslmode=disable".into())
}

/// A fresh, migrated-by-the-app database of our own.
pub struct TestDb {
    pub name: String,
    pub url: String,
    /// The server it lives on (no database name).
    server: String,
}

impl TestDb {
    /// A database on the tests' shared server.
    pub async fn create() -> Self {
        Self::create_on(&server_url()).await
    }

    /// A database on `server` (`postgres://user@host:port`, no database name).
    pub async fn create_on(server: &str) -> Self {
        let name = format!("vt_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(&database_url(server, "postgres"))
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL must run at {server} (see README): {e}"));
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create test database");
        let url = database_url(server, &name);
        Self {
            name,
            url,
            server: server.to_owned(),
        }
    }

    /// The database now lives on `server` (a standby promoted in the old one's place).
    pub fn moved_to(&mut self, server: &str) {
        self.url = database_url(server, &self.name);
        self.server = server.to_owned();
    }

    /// Drops the database; called at the end of passing tests (a failing one leaves its
    /// database behind to look at).
    pub async fn drop_db(&self) {
        if let Ok(mut admin) = PgConnection::connect(&database_url(&self.server, "postgres")).await
        {
            let _ = sqlx::query(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .execute(&mut admin)
            .await;
        }
    }
}

/// The URL of database `name` on `server` (`postgres://user@host:port`, perhaps followed
/// by a `?query` of TLS settings, which stays at the end).
pub fn database_url(server: &str, name: &str) -> String {
    match server.split_once('?') {
        Some((base, query)) => format!("{base}/{name}?{query}"),
        None => format!("{server}/{name}"),
    }
}

/// The core's settings for a test on `db_url`: ports 0, no background jobs (tests start
/// the ones they need), everything else as the defaults.
pub fn settings_for(db_url: &str) -> Settings {
    let mut s = Settings::default();
    s.http.listen = "127.0.0.1:0".parse().expect("valid address");
    s.http.metrics_listen = "127.0.0.1:0".parse().expect("valid address");
    s.database.url = db_url.into();
    s.database.max_connections = 10;
    // Tests check behaviour, not speed: a slow shared machine must not turn into 503s.
    s.database.acquire_timeout = StdDuration::from_secs(60);
    s.admin.token = ADMIN_TOKEN.into();
    s.admin.orders_token = ORDERS_TOKEN.into();
    s.reservations.expiry_interval = StdDuration::from_secs(60);
    s.reservations.expiry_enabled = false;
    // Admission sheds what comes back slower than its latency target, and a debug build on
    // a busy machine is slow: off, so that tests see answers, not 503 OVERLOADED. The tests
    // of admission turn it on.
    s.admission.enabled = false;
    s
}

/// Calls the API at `base` (a core, or an edge in front of cores).
#[derive(Clone)]
pub struct ApiClient {
    pub base: String,
    pub client: reqwest::Client,
}

/// One running instance of the core; derefs to its [`ApiClient`].
pub struct TestApp {
    pub api: ApiClient,
    pub metrics_base: String,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl std::ops::Deref for TestApp {
    type Target = ApiClient;

    fn deref(&self) -> &ApiClient {
        &self.api
    }
}

impl TestApp {
    pub async fn start(settings: &Settings) -> Self {
        // Logs only when asked for (RUST_LOG=...), so a failing test can be read.
        if std::env::var_os("RUST_LOG").is_some() {
            // The writer runs for the rest of the test process (its guard is never dropped);
            // the first app of the process installs it, the others find it there. No
            // traces: tests that read spans run the binaries (`proxy/tests/edge/traces.rs`).
            let service = voucher_telemetry::Service {
                name: "voucher-core",
                version: "test",
            };
            let logs = voucher_telemetry::Logs {
                filter: &settings.log.filter,
                json: settings.log.format == "json",
            };
            let untraced = voucher_telemetry::TraceSettings::default();
            std::mem::forget(voucher_telemetry::init(service, logs, &untraced).ok());
        }
        let app = Application::build(settings).await.expect("app builds");
        let base = format!("http://{}", app.api_addr());
        let metrics_base = format!("http://{}", app.metrics_addr());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(app.run_until_stopped(shutdown.clone()));
        Self {
            api: ApiClient::new(base),
            metrics_base,
            shutdown,
            task,
        }
    }

    /// The `host:port` of its API listener.
    pub fn address(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// Stops it gracefully, as SIGTERM does.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }

    /// Stops it at once, as `kill -9` does: nothing is finished or handed over; every
    /// connection it held (its database sessions, and with them its partitions) is dropped.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    pub async fn metrics_text(&self) -> String {
        metrics_text(&self.client, &self.metrics_base).await
    }

    pub async fn metrics(&self) -> Metrics {
        Metrics::parse(&self.metrics_text().await)
    }
}

/// `GET {base}/metrics`.
pub async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics reachable")
        .text()
        .await
        .expect("text")
}

impl ApiClient {
    pub fn new(base: String) -> Self {
        Self {
            base,
            client: reqwest::Client::new(),
        }
    }
    pub async fn post_json(&self, path: &str, body: &Value) -> Response {
        self.client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    pub async fn create_voucher(&self, body: &Value) -> Response {
        self.client
            .post(format!("{}/vouchers", self.base))
            .bearer_auth(ADMIN_TOKEN)
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    /// Creates a voucher and panics unless it got 201.
    pub async fn given_voucher(&self, body: Value) -> Value {
        let resp = self.create_voucher(&body).await;
        assert_eq!(resp.status(), StatusCode::CREATED, "creating {body}");
        resp.json().await.expect("json")
    }

    pub async fn reserve(&self, code: &str, customer: &str, order: &str, amount: i64) -> Response {
        self.post_json(
            &format!("/vouchers/{code}/reservations"),
            &json!({ "customerId": customer, "orderId": order, "orderAmount": amount }),
        )
        .await
    }

    /// A reservation, read whole.
    pub async fn attempt(&self, code: &str, customer: &str, order: &str, amount: i64) -> Attempt {
        let resp = self.reserve(code, customer, order, amount).await;
        let status = resp.status();
        let body: Value = resp.json().await.expect("every answer is JSON");
        Attempt {
            voucher: code.to_owned(),
            customer: customer.to_owned(),
            order: order.to_owned(),
            status,
            body,
        }
    }

    pub async fn confirm(&self, code: &str, order: &str) -> Response {
        self.client
            .post(format!(
                "{}/vouchers/{code}/reservations/{order}/confirm",
                self.base
            ))
            .send()
            .await
            .expect("request sent")
    }

    pub async fn release(&self, code: &str, order: &str) -> Response {
        self.client
            .delete(format!(
                "{}/vouchers/{code}/reservations/{order}",
                self.base
            ))
            .send()
            .await
            .expect("request sent")
    }

    pub async fn get_voucher(&self, code: &str) -> Response {
        self.client
            .get(format!("{}/vouchers/{code}", self.base))
            .send()
            .await
            .expect("request sent")
    }

    /// An admin call: `method` on `path`, with the admin token, `If-Match: "version"` when
    /// given, and `body` as JSON when given.
    pub async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        if_match: Option<i64>,
        body: Option<&Value>,
    ) -> Response {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(version) = if_match {
            request = request.header("if-match", format!("\"{version}\""));
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        request.send().await.expect("request sent")
    }

    /// `PATCH /vouchers/{code}` naming `version`.
    pub async fn change(&self, code: &str, version: i64, change: &Value) -> Response {
        self.admin(
            reqwest::Method::PATCH,
            &format!("/vouchers/{code}"),
            Some(version),
            Some(change),
        )
        .await
    }

    /// `POST /vouchers/{code}/{action}` (pause, resume, archive) without If-Match.
    pub async fn lifecycle(&self, code: &str, action: &str) -> Response {
        self.admin(
            reqwest::Method::POST,
            &format!("/vouchers/{code}/{action}"),
            None,
            None,
        )
        .await
    }

    /// Pauses (resumes, archives) `code` and panics unless it got 200; the voucher after.
    pub async fn given_lifecycle(&self, code: &str, action: &str) -> Value {
        let resp = self.lifecycle(code, action).await;
        assert_eq!(resp.status(), StatusCode::OK, "{action} {code}");
        resp.json().await.expect("json")
    }

    pub async fn voucher_json(&self, code: &str) -> Value {
        let resp = self.get_voucher(code).await;
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json().await.expect("json")
    }
}

/// A database and one app on it: what most tests need.
pub struct TestEnv {
    pub db: TestDb,
    pub app: TestApp,
    pub pool: PgPool,
}

impl TestEnv {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut Settings)) -> Self {
        let db = TestDb::create().await;
        let mut settings = settings_for(&db.url);
        tweak(&mut settings);
        Self::start_on(db, &settings).await
    }

    /// The app with `settings` on `db`, and a pool of the test's own on the same database.
    pub async fn start_on(db: TestDb, settings: &Settings) -> Self {
        let app = TestApp::start(settings).await;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&db.url)
            .await
            .expect("test pool");
        Self { db, app, pool }
    }

    /// Checks the invariants given every 201 the test saw, then cleans up.
    pub async fn finish(self, accepted: &[Accepted]) {
        let report = invariants::check(&self.pool, accepted)
            .await
            .expect("invariant queries run");
        self.assert_and_tear_down(report).await;
    }

    /// Fails the test on any violation in `report`; otherwise stops the app and drops the
    /// database (a failing test leaves its database behind to look at).
    pub async fn assert_and_tear_down(self, report: invariants::Report) {
        assert!(
            report.holds(),
            "invariants violated: {:#?}",
            report.violations
        );
        self.app.stop().await;
        self.pool.close().await;
        self.db.drop_db().await;
    }
}

/// A voucher body valid now, with the given limits.
pub fn voucher_body(code: &str, total_limit: i64, per_user_limit: i64) -> Value {
    let now = Utc::now();
    json!({
        "code": code,
        "discountAmount": 100_000,
        "minOrderAmount": 50_000,
        "totalLimit": total_limit,
        "perUserLimit": per_user_limit,
        "startsAt": rfc3339(now - Duration::hours(1)),
        "endsAt": rfc3339(now + Duration::hours(1)),
        "mode": "standard",
    })
}

pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub async fn run_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    futures::future::join_all(futures).await
}
