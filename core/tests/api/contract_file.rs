//! The repository's `openapi.json` is the document the core serves, and a client generated
//! from it (PyPI's openapi-python-client, installed by scripts/test.sh) makes a
//! reservation against the running service.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::helpers::{TestEnv, ADMIN_TOKEN};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[tokio::test]
async fn the_committed_openapi_json_is_the_served_document() {
    let env = TestEnv::start().await;
    let served: Value = env
        .app
        .client
        .get(format!("{}/openapi.json", env.app.base))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("json");
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("openapi.json")).expect("openapi.json at the root"),
    )
    .expect("openapi.json is JSON");
    assert!(
        served == committed,
        "openapi.json differs from the served document: run `cargo run -q -p voucher-core -- openapi > openapi.json`"
    );
    env.finish(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_generated_from_openapi_json_reserves() {
    let env = TestEnv::start().await;
    let out = std::env::temp_dir().join(format!("openapi-client-{}", env.db.name));
    let generated = Command::new("openapi-python-client")
        .args(["generate", "--meta", "none", "--overwrite", "--path"])
        .arg(repo().join("openapi.json"))
        .arg("--output-path")
        .arg(out.join("voucher_gate_client"))
        .output()
        .expect("openapi-python-client is installed by scripts/test.sh");
    assert!(
        generated.status.success(),
        "generating the client: {}{}",
        String::from_utf8_lossy(&generated.stdout),
        String::from_utf8_lossy(&generated.stderr)
    );
    // Off the runtime's threads: the core under test answers on them meanwhile.
    let (dir, base) = (out.clone(), env.app.base.clone());
    let run = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(repo().join("loadtest/client/reserve.py"))
            .arg(&dir)
            .args([base.as_str(), ADMIN_TOKEN, "GENCLIENT"])
            .output()
            .expect("python3 runs")
    })
    .await
    .expect("joined");
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let answers: Value = serde_json::from_slice(&run.stdout).expect("one JSON line");
    assert_eq!(answers["created"], 201);
    assert_eq!(answers["created_is_voucher"], true);
    assert_eq!(
        (
            answers["first"].as_i64(),
            answers["first_discount"].as_i64()
        ),
        (Some(201), Some(5000))
    );
    assert_eq!(
        (
            answers["again"].as_i64(),
            answers["again_replayed"].as_str()
        ),
        (Some(201), Some("true"))
    );
    assert_eq!(
        (answers["late"].as_i64(), answers["late_error"].as_str()),
        (Some(409), Some("OUT_OF_STOCK"))
    );
    assert_eq!(answers["used"], 1);
    env.finish(&[crate::invariants::Accepted::new("GENCLIENT", "42", "gen-1")])
        .await;
}
