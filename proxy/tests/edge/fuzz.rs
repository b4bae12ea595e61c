//! A seeded slice of the API fuzz run (`./loadtest/fuzz.sh`): schemathesis generates
//! positive and negative requests for every operation of the served OpenAPI document,
//! against a core and through the edge, and fails on any 5xx, any answer the document does
//! not declare, and any negative data taken. Then the invariants hold.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use voucher_testkit::helpers::ADMIN_TOKEN;

use super::stack;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One schemathesis run against `base` with the core's document; its output on failure.
fn schemathesis(
    document: &str,
    base: &str,
    header: Option<String>,
    filter: &[&str],
) -> Result<(), String> {
    let mut command = Command::new("st");
    command
        .arg("--config-file")
        .arg(repo().join("loadtest/fuzz/schemathesis.toml"))
        .args(["run", document, "--url", base])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,\
             response_headers_conformance,response_schema_conformance,negative_data_rejection",
        ])
        .args(["--max-examples", "6", "--seed", "1", "--workers", "1"])
        .args(["--no-color", "--generation-database", "none"]);
    if let Some(header) = header {
        command.args(["-H", &header]);
    }
    command.args(filter);
    let output = command
        .output()
        .map_err(|e| format!("schemathesis (`st`) is installed by scripts/test.sh: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn generated_requests_get_declared_answers_and_no_5xx_at_a_core_and_through_the_edge() {
    let stack = stack(Duration::from_secs(30)).await;
    let core = stack.app().api.base.clone();
    let edge = stack.edge().api.base.clone();
    let made = Command::new(repo().join("loadtest/fuzz/vouchers.sh"))
        .args([&core, ADMIN_TOKEN])
        .status()
        .expect("vouchers.sh runs");
    assert!(made.success(), "the fuzz run's vouchers were created");
    let document = format!("{core}/openapi.json");

    // A gate reload's documented effect is 503 for its voucher until rebuilt: fuzzed on its
    // own, as ./loadtest/fuzz.sh does.
    let (at_core, through_edge) = tokio::task::spawn_blocking(move || {
        let admin = || Some(format!("Authorization: Bearer {ADMIN_TOKEN}"));
        let core_result = schemathesis(
            &document,
            &core,
            admin(),
            &["--exclude-path-regex", "gate/reload"],
        )
        .and_then(|()| {
            schemathesis(
                &document,
                &core,
                admin(),
                &["--include-path-regex", "gate/reload"],
            )
        });
        (core_result, schemathesis(&document, &edge, None, &[]))
    })
    .await
    .expect("schemathesis ran");

    if let Err(output) = at_core {
        panic!("at a core:\n{output}");
    }
    if let Err(output) = through_edge {
        panic!("through the edge:\n{output}");
    }
    stack.finish(&[]).await;
}
