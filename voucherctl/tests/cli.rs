//! `voucherctl` against the real service: a core on its own database (the tests' harness),
//! every command run as an operator would run it, and its errors read as a person reads
//! them.

use std::process::Command;

use reqwest::StatusCode;
use serde_json::Value;
use voucher_testkit::helpers::{TestEnv, ADMIN_TOKEN};
use voucher_testkit::invariants::Accepted;

struct Ctl<'a> {
    env: &'a TestEnv,
}

/// What a run printed, and whether it succeeded.
struct Run {
    ok: bool,
    out: String,
    err: String,
}

impl Ctl<'_> {
    fn run_as(&self, token: Option<&str>, url: &str, args: &[&str]) -> Run {
        let mut command = Command::new(env!("CARGO_BIN_EXE_voucherctl"));
        command
            .args(args)
            .env("VOUCHERCTL_URL", url)
            .env_remove("VOUCHERCTL_TOKEN");
        if let Some(token) = token {
            command.env("VOUCHERCTL_TOKEN", token);
        }
        let output = command.output().expect("voucherctl runs");
        Run {
            ok: output.status.success(),
            out: String::from_utf8_lossy(&output.stdout).into_owned(),
            err: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    fn run(&self, args: &[&str]) -> Run {
        self.run_as(Some(ADMIN_TOKEN), &self.env.app.base, args)
    }

    fn ok(&self, args: &[&str]) -> String {
        let run = self.run(args);
        assert!(run.ok, "voucherctl {args:?} failed: {}", run.err);
        run.out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_runs_a_sale_with_voucherctl() {
    let env = TestEnv::start().await;
    let ctl = Ctl { env: &env };
    let made = ctl.ok(&[
        "create",
        "XMAS",
        "--discount",
        "5000",
        "--limit",
        "10",
        "--starts",
        "-1h",
        "--ends",
        "+2h",
    ]);
    assert!(
        made.contains("XMAS  standard  active  live  version 1"),
        "{made}"
    );

    let listed = ctl.ok(&["list"]);
    assert!(
        listed.contains("XMAS") && listed.contains("1 vouchers"),
        "{listed}"
    );
    let as_json: Value =
        serde_json::from_str(&ctl.ok(&["--json", "list", "--state", "active"])).expect("json");
    assert_eq!(as_json[0]["code"], "XMAS");

    let changed = ctl.ok(&["change", "XMAS", "--limit", "20", "--ends", "+3h"]);
    assert!(
        changed.contains("of 20") && changed.contains("version 2"),
        "{changed}"
    );

    let mut accepted = Vec::new();
    for i in 0..3 {
        let (c, o) = (format!("c{i}"), format!("o{i}"));
        assert_eq!(
            env.app.reserve("XMAS", &c, &o, 20_000).await.status(),
            StatusCode::CREATED
        );
        accepted.push(Accepted::new("XMAS", &c, &o));
    }
    assert_eq!(env.app.confirm("XMAS", "o0").await.status(), StatusCode::OK);

    let paused = ctl.ok(&["pause", "XMAS"]);
    assert!(paused.contains("paused"), "{paused}");
    assert_eq!(
        env.app.attempt("XMAS", "c9", "o9", 20_000).await.code(),
        "VOUCHER_PAUSED"
    );
    ctl.ok(&["resume", "XMAS"]);
    let shown = ctl.ok(&["show", "XMAS"]);
    assert!(
        shown.contains("active") && shown.contains("uses 3 of 20 (reserved 2, confirmed 1)"),
        "{shown}"
    );

    let file = std::env::temp_dir().join(format!("voucherctl-{}.csv", env.db.name));
    let exported = ctl.run(&["export", "XMAS", "-o", file.to_str().expect("utf8 path")]);
    assert!(
        exported.ok && exported.err.contains("3 reservations written"),
        "{}",
        exported.err
    );
    let csv = std::fs::read_to_string(&file).expect("export written");
    assert_eq!(csv.lines().count(), 4);
    assert!(
        csv.lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("o0,c0,CONFIRMED,20000,5000,")),
        "{csv}"
    );
    let confirmed = ctl.ok(&["export", "XMAS", "--status", "CONFIRMED"]);
    assert_eq!(confirmed.lines().count(), 2);
    let _ = std::fs::remove_file(&file);

    let audit = ctl.ok(&["audit", "XMAS"]);
    let lines: Vec<&str> = audit.lines().collect();
    assert_eq!(lines.len(), 4, "create, change, pause, resume: {audit}");
    assert!(
        lines[1].contains("change")
            && lines[1].contains("by admin")
            && lines[1].contains("totalLimit: 10 -> 20"),
        "{audit}"
    );
    assert!(
        lines[2].contains("pause") && lines[2].contains("state: \"active\" -> \"paused\""),
        "{audit}"
    );

    // The live view, one frame: the voucher's counts and the core's rates.
    let metrics = format!("{}/metrics", env.app.metrics_base);
    let frame = ctl.ok(&[
        "watch",
        "XMAS",
        "--core-metrics",
        &metrics,
        "--interval",
        "300ms",
        "--once",
    ]);
    assert!(
        frame.contains("issued  [") && frame.contains("3 / 20"),
        "{frame}"
    );
    assert!(
        frame.contains("accepts/s") && frame.contains("writer lag"),
        "{frame}"
    );

    // Archive waits for the active reservations.
    let refused = ctl.run(&["archive", "XMAS"]);
    assert!(
        !refused.ok && refused.err.contains("XMAS cannot be changed that way"),
        "{}",
        refused.err
    );
    env.finish(&accepted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voucherctl_says_what_went_wrong_in_words() {
    let env = TestEnv::start().await;
    let ctl = Ctl { env: &env };
    let base = env.app.base.clone();
    let cases: [(Option<&str>, &str, Vec<&str>, &str); 7] = [
        (
            None,
            &base,
            vec!["list"],
            "wants a token for this: pass --token or set VOUCHERCTL_TOKEN",
        ),
        (
            Some("not-a-token"),
            &base,
            vec!["list"],
            "the token was refused",
        ),
        (
            Some(ADMIN_TOKEN),
            &base,
            vec!["show", "NOPE"],
            "there is no voucher NOPE",
        ),
        (
            Some(ADMIN_TOKEN),
            "http://127.0.0.1:9",
            vec!["list"],
            "cannot reach the voucher service at http://127.0.0.1:9",
        ),
        (
            Some(ADMIN_TOKEN),
            &base,
            vec![
                "create",
                "BAD",
                "--discount",
                "1",
                "--limit",
                "1",
                "--ends",
                "tomorrow",
            ],
            "is not a time",
        ),
        (
            Some(ADMIN_TOKEN),
            &base,
            vec!["change", "NOPE"],
            "nothing to change",
        ),
        (
            Some(ADMIN_TOKEN),
            &base,
            vec![
                "create",
                "B A D",
                "--discount",
                "1",
                "--limit",
                "1",
                "--ends",
                "+1h",
            ],
            "the service refused the request: code",
        ),
    ];
    for (token, url, args, says) in cases {
        let run = ctl.run_as(token, url, &args);
        assert!(!run.ok, "{args:?} succeeded");
        assert!(run.err.contains(says), "{args:?}: {}", run.err);
        assert!(run.err.starts_with("voucherctl: "), "{}", run.err);
    }
    // A gate reload of a standard voucher: the service's own reason.
    ctl.ok(&[
        "create",
        "STD",
        "--discount",
        "1",
        "--limit",
        "1",
        "--ends",
        "+1h",
    ]);
    let reload = ctl.run(&["reload", "STD"]);
    assert!(
        !reload.ok && reload.err.contains("only flash vouchers have a gate"),
        "{}",
        reload.err
    );
    env.finish(&[]).await;
}
