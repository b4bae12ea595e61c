//! The Kubernetes manifests (`deploy/kubernetes/`), rendered by the kustomize that
//! `kubectl kustomize` embeds and checked offline: every built-in object against its
//! schema by kubernetes-validate (strict, any warning fails), and the two custom kinds,
//! the Deployments' probes, resources, security contexts and grace periods, and the
//! PrometheusRule's rules (exactly `dashboards/alerts.yml`'s) by `deploy/kubernetes/check.py`.
//! scripts/test.sh installs both tools.

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(command: &mut Command) -> String {
    let output = command.current_dir(repo()).output().expect("the tool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{command:?}:\n{text}");
    text
}

#[test]
fn the_manifests_render_and_validate_offline() {
    let dir = std::env::temp_dir().join(format!("voucher-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (rendered, builtin) = (dir.join("rendered.yaml"), dir.join("builtin.yaml"));
    let text = run(Command::new("kubectl").args(["kustomize", "deploy/kubernetes/overlays/local"]));
    std::fs::write(&rendered, &text).expect("written");
    let checked = run(Command::new("python3")
        .arg("deploy/kubernetes/check.py")
        .arg(&rendered)
        .arg(&builtin));
    assert!(
        checked.contains("ServiceMonitor x1") && checked.contains("PrometheusRule x1"),
        "{checked}"
    );
    let validated = run(Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", "1.32.0"])
        .arg(&builtin));
    assert!(
        !validated.contains("WARN"),
        "a warning fails the manifests:\n{validated}"
    );
    assert_eq!(
        validated.matches(" passed for resource ").count(),
        10,
        "every built-in object validated:\n{validated}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
