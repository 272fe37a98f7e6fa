"""Audit the locked dependencies with pip-audit.

    python deploy/dependency_audit.py --out results/reliability      # or: make audit

"Locked" is what the project's install resolved: ``pip freeze`` of this interpreter's
environment (the project itself, installed editable, excluded) is written to
``requirements-audited.txt`` and audited with ``pip-audit -r ... --no-deps --disable-pip``
(no resolution, no downloads: every pin is looked up as it is). Results:

* ``vulnerable``: packages with known vulnerabilities (exit status 1);
* ``unreachable``: the vulnerability service could not be asked, or answered for none of
  the packages (every one "not found"): the audit did not happen (exit status 3, and the
  CI test reports a skip with the reason instead of a pass);
* otherwise ``clean`` (exit status 0).

``pip-audit.json`` keeps pip-audit's own JSON, and ``audit.json`` the verdict.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def freeze(python: str) -> list[str]:
    out = subprocess.run([python, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if line and not line.startswith(("#", "-e ")) and "==" in line]


def audit(python: str, out: Path, timeout: float = 600) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    reqs = out / "requirements-audited.txt"
    pins = freeze(python)
    reqs.write_text("\n".join(pins) + "\n")
    raw = out / "pip-audit.json"
    cmd = [python, "-m", "pip_audit", "-r", str(reqs), "--no-deps", "--disable-pip", "--progress-spinner", "off",
           "--format", "json", "--output", str(raw), "--timeout", "30"]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    verdict = {"command": " ".join(cmd[2:]), "packages": len(pins), "seconds": round(time.time() - t0, 1),
               "pip_audit_exit": proc.returncode}
    try:
        deps = json.loads(raw.read_text())["dependencies"]
    except (OSError, ValueError, KeyError):
        deps = None
    if deps is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        verdict.update(status="unreachable", reason=f"pip-audit produced no report: {tail[0][:300]}")
        return verdict
    skipped = [d for d in deps if d.get("skip_reason")]
    vulnerable = {d["name"]: [v["id"] for v in d.get("vulns", [])] for d in deps if d.get("vulns")}
    verdict.update(audited=len(deps) - len(skipped), skipped=len(skipped), vulnerable=vulnerable)
    if vulnerable:
        verdict["status"] = "vulnerable"
    elif deps and len(skipped) == len(deps):
        verdict.update(status="unreachable",
                       reason=f"the vulnerability service answered for none of {len(deps)} packages "
                              f"(e.g. {skipped[0]['skip_reason'][:160]})")
    else:
        verdict["status"] = "clean"
    return verdict


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/reliability", help="directory for the lock, the report and the verdict")
    p.add_argument("--python", default=sys.executable, help="interpreter whose environment is audited")
    a = p.parse_args(argv)
    verdict = audit(a.python, Path(a.out))
    (Path(a.out) / "audit.json").write_text(json.dumps(verdict, indent=1) + "\n")
    print(json.dumps(verdict, indent=1))
    return {"clean": 0, "vulnerable": 1, "unreachable": 3}[verdict["status"]]


if __name__ == "__main__":
    sys.exit(main())
