#!/usr/bin/env bash
# Writes deploy/kubernetes/base/prometheus-rule.yaml: the Prometheus Operator's
# PrometheusRule holding dashboards/alerts.yml's groups as they are (the rules promtool
# tests). Run it after changing the alerts; the tests fail while the two differ
# (deploy/kubernetes/check.py).
. "$(dirname "$0")/lib.sh"
cd "$ROOT"
python3 - <<'PY'
import yaml
with open("dashboards/alerts.yml") as f:
    rules = yaml.safe_load(f)
rule = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PrometheusRule",
    "metadata": {"name": "voucher-gate"},
    "spec": {"groups": rules["groups"]},
}
with open("deploy/kubernetes/base/prometheus-rule.yaml", "w") as f:
    f.write("# Made from dashboards/alerts.yml by scripts/prometheus-rule.sh: edit those, not this.\n")
    yaml.safe_dump(rule, f, sort_keys=False, width=100)
PY
log "wrote deploy/kubernetes/base/prometheus-rule.yaml"
