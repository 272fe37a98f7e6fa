"""Container health probe: exit 0 when ``URL`` answers HTTP 200, else 1 (with a reason on stderr).

    python healthcheck.py [URL] [--timeout SECONDS]      # URL default: http://127.0.0.1:8000/health

The images carry no curl; this uses the standard library only. A worker answers 200
on /health once its engine is up (503 otherwise; nothing while the model loads); the
gateway answers 200 while at least one worker is routable.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request


def check(url: str, timeout: float) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:   # noqa: S310 - a fixed local URL
            return resp.status == 200, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:       # 4xx/5xx: the server is up but not healthy
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return False, f"unreachable: {getattr(exc, 'reason', exc)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Exit 0 when URL answers HTTP 200, else 1.")
    p.add_argument("url", nargs="?", default="http://127.0.0.1:8000/health")
    p.add_argument("--timeout", type=float, default=4.0, help="seconds (default: %(default)s)")
    args = p.parse_args(argv)
    ok, why = check(args.url, args.timeout)
    if not ok:
        print(f"unhealthy: {args.url}: {why}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
