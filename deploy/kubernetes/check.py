"""Checks the rendered manifests (`kubectl kustomize deploy/kubernetes/overlays/local`) the
way kubernetes-validate cannot: the two custom kinds carry the fields the Prometheus
Operator needs, the PrometheusRule holds exactly dashboards/alerts.yml's rules (the ones
promtool tests), every Deployment has probes, resources, a non-root security context and a
grace period that covers its drain, and no Secret is committed. Writes the built-in
objects alone to the file named second, for kubernetes-validate.

    python3 deploy/kubernetes/check.py RENDERED.yaml BUILTIN.yaml
"""

import sys

import yaml

rendered, builtin_out = sys.argv[1], sys.argv[2]
with open(rendered) as f:
    objects = [o for o in yaml.safe_load_all(f) if o]
with open("dashboards/alerts.yml") as f:
    alerts = yaml.safe_load(f)

problems = []
kinds = {}
for o in objects:
    kinds.setdefault(o["kind"], []).append(o)

CUSTOM = {"ServiceMonitor", "PrometheusRule"}
for kind in ["Deployment", "Service", "Job", "PodDisruptionBudget", "ConfigMap", *CUSTOM]:
    if kind not in kinds:
        problems.append(f"no {kind}")
if "Secret" in kinds:
    problems.append("a Secret is rendered: secrets are referenced, never committed")

for rule in kinds.get("PrometheusRule", []):
    if rule.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.append("PrometheusRule: apiVersion")
    if rule.get("spec", {}).get("groups") != alerts["groups"]:
        problems.append("PrometheusRule: its groups are not dashboards/alerts.yml's (run scripts/prometheus-rule.sh)")
for monitor in kinds.get("ServiceMonitor", []):
    spec = monitor.get("spec", {})
    if monitor.get("apiVersion") != "monitoring.coreos.com/v1":
        problems.append("ServiceMonitor: apiVersion")
    if not spec.get("selector") or not spec.get("endpoints"):
        problems.append("ServiceMonitor: needs spec.selector and spec.endpoints")
    for e in spec.get("endpoints", []):
        if not e.get("port"):
            problems.append("ServiceMonitor: an endpoint without its port name")
    ports = {p.get("name") for s in kinds.get("Service", []) for p in s["spec"]["ports"]}
    for e in spec.get("endpoints", []):
        if e.get("port") not in ports:
            problems.append(f"ServiceMonitor: no Service has a port named {e.get('port')}")

config = {}
for cm in kinds.get("ConfigMap", []):
    config.update(cm.get("data", {}))


def seconds(text):
    return float(text[:-2]) / 1000 if text.endswith("ms") else float(text.rstrip("s"))


drains = {
    "voucher-core": seconds(config["VOUCHER__HTTP__DRAIN_DELAY"]) + seconds(config["VOUCHER__HTTP__SHUTDOWN_DEADLINE"]),
    "voucher-edge": seconds(config["EDGE__DRAIN_DELAY"]) + seconds(config["EDGE__SHUTDOWN_DEADLINE"]),
}
for d in kinds.get("Deployment", []):
    name = d["metadata"]["name"]
    pod = d["spec"]["template"]["spec"]
    if not pod.get("securityContext", {}).get("runAsNonRoot"):
        problems.append(f"{name}: not runAsNonRoot")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace <= drains.get(name, 0):
        problems.append(f"{name}: grace {grace}s does not cover its drain ({drains.get(name)}s)")
    for c in pod["containers"]:
        for probe in ["livenessProbe", "readinessProbe"]:
            if probe not in c:
                problems.append(f"{name}/{c['name']}: no {probe}")
        if not c.get("resources", {}).get("requests") or not c.get("resources", {}).get("limits"):
            problems.append(f"{name}/{c['name']}: requests and limits")
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False or not sc.get("readOnlyRootFilesystem"):
            problems.append(f"{name}/{c['name']}: container security context")

with open(builtin_out, "w") as f:
    yaml.safe_dump_all([o for o in objects if o["kind"] not in CUSTOM], f, sort_keys=False)
if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"{len(objects)} objects: {', '.join(sorted(f'{k} x{len(v)}' for k, v in kinds.items()))}")
