"""Check deploy/grafana/psd-dashboard.json against what psd and psworker
export.  TAP, numbered on from --start N (the calling shell test's checks
come first), with the plan at the end; exit 1 when a check failed.

usage: check_dashboard.py [--start N] [--scrape-config prometheus.yml] DASHBOARD.json SCRAPE.txt...

Each SCRAPE.txt is a /metrics answer of a running psd or psworker.  A
metric the dashboard queries exists when a scrape declares it (# TYPE), or
it is the _sum / _count of a declared summary.  Every psd_* / psworker_*
name in a query is checked, and every query must name at least one; a
{{label}} in a legend must be a label of a sample of a metric the query
reads (or one Prometheus adds: instance, job), unless that metric has no
samples in these scrapes (psd_errors_total before any error)."""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import taplib  # noqa: E402
from taplib import ok, plan  # noqa: E402


def option(args, flag):
    if flag not in args:
        return None
    i = args.index(flag)
    v = args[i + 1]
    del args[i:i + 2]
    return v


args = sys.argv[1:]
taplib._n = int(option(args, "--start") or 0)
config = option(args, "--scrape-config")
dash_path, scrapes = args[0], args[1:]

declared = {}   # family -> type
labels = {}     # family -> set of label names seen on its samples
for path in scrapes:
    for line in open(path):
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            declared[m.group(1)] = m.group(2)
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? ", line)
        if m and not line.startswith("#"):
            name = m.group(1)
            fam = re.sub(r"_(sum|count|bucket)$", "", name) if name not in declared else name
            labels.setdefault(fam, set()).update(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))


def family(name):
    if name in declared:
        return name
    base = re.sub(r"_(sum|count|bucket)$", "", name)
    if base != name and declared.get(base) in ("summary", "histogram"):
        return base
    return None


try:
    dash = json.load(open(dash_path))
except ValueError as e:
    ok(False, "%s parses as JSON (%s)" % (dash_path, e))
    sys.exit(plan())
ok(True, "%s parses as JSON" % dash_path)
ok(dash.get("title") and dash.get("uid") and isinstance(dash.get("panels"), list),
   "it has a title, a uid and panels")
inputs = [i for i in dash.get("__inputs", []) if i.get("pluginId") == "prometheus"]
ok(len(inputs) == 1 and inputs[0].get("name") == "DS_PROMETHEUS",
   "it asks for one Prometheus data source at import (__inputs DS_PROMETHEUS)")

panels = [p for p in dash["panels"] if p.get("type") != "row"]
ids = [p.get("id") for p in dash["panels"]]
ok(len(ids) == len(set(ids)) and None not in ids, "panel ids are unique (%d panels)" % len(ids))
bad = [p.get("title") for p in panels
       if p.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}" or not p.get("targets")
       or not p.get("gridPos") or not p.get("title")]
ok(not bad, "every panel has a title, a place, queries and the imported data source %s" % (bad or ""))

variables = {v["name"]: v.get("query") for v in dash.get("templating", {}).get("list", [])}
queried = set()
for p in panels:
    for t in p["targets"]:
        expr = t.get("expr", "")
        ok(t.get("datasource", {}).get("uid") == "${DS_PROMETHEUS}" and t.get("refId"),
           "%s / %s: a query with its refId on the data source" % (p["title"], t.get("refId")))
        names = set(re.findall(r"\b(?:psd|psworker)_[a-z0-9_]+\b", expr))
        missing = sorted(x for x in names if family(x) is None)
        undefined = sorted(set(re.findall(r"\$(\w+)", expr)) - set(variables))
        ok(not undefined, "%s / %s: its $variables are the dashboard's %s" % (
            p["title"], t.get("refId"), undefined or ""))
        ok(names and not missing, "%s / %s: %s %s" % (
            p["title"], t.get("refId"), ", ".join(sorted(names)) or "(no psd/psworker metric)",
            "exported" if not missing else "NOT exported: " + ", ".join(missing)))
        queried |= {family(x) for x in names if family(x)}
        fams = [family(x) for x in names if family(x)]
        for lab in re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", t.get("legendFormat", "")):
            if lab in ("instance", "job"):
                continue
            seen = [f for f in fams if f in labels]
            ok(not seen or any(lab in labels[f] for f in seen),
               "%s / %s: legend label {{%s}} is on the samples" % (p["title"], t.get("refId"), lab))

for prefix in ("psd", "psworker"):
    fams = {f for f in declared if f.startswith(prefix + "_")}
    ok(any(f.startswith(prefix + "_") for f in queried),
       "the dashboard shows %s's metrics (%d of %d families)" % (
           prefix, len([f for f in queried if f.startswith(prefix + "_")]), len(fams)))

if config:
    try:
        import yaml
    except ImportError:
        yaml = None
    if yaml is None:
        taplib._n += 1
        print("ok %d # SKIP no PyYAML to read %s" % (taplib._n, config))
    else:
        jobs = {j["job_name"] for j in yaml.safe_load(open(config)).get("scrape_configs", [])}
        ok(variables.get("server_job") in jobs and variables.get("worker_job") in jobs,
           "%s scrapes the jobs the dashboard selects by default (%s, %s)" % (
               config, variables.get("server_job"), variables.get("worker_job")))
sys.exit(plan())
