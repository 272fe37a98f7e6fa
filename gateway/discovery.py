"""Where the workers are: a static list (CLI / env / file, re-read when the file
changes) or Kubernetes EndpointSlices of a Service (watched, re-listed periodically).

Discovery only produces the desired set of URLs; ``WorkerPool.sync`` applies it: new
URLs join at once, removed ones are marked draining (no new requests) and dropped
when their in-flight count reaches zero.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from gateway.routing.base import WorkerState

log = logging.getLogger(__name__)


class WorkerPool:
    def __init__(self, urls: list[str]) -> None:
        self.workers: dict[str, WorkerState] = {}
        self.on_remove: list = []           # callbacks(url) when a worker has left for good
        self.sync(urls)

    def __iter__(self):
        return iter(list(self.workers.values()))

    def __len__(self) -> int:
        return len(self.workers)

    def sync(self, urls: list[str]) -> None:
        want = {u.rstrip("/") for u in urls}
        for u in want:
            w = self.workers.get(u)
            if w is None:
                self.workers[u] = WorkerState(u)
                log.info("worker joined: %s", u)
            elif w.draining:
                w.draining = False
        for u, w in list(self.workers.items()):
            if u not in want and not w.draining:
                w.draining = True
                log.info("worker leaving (draining): %s", u)
        self.reap()

    def reap(self) -> None:
        for u, w in list(self.workers.items()):
            if w.draining and w.in_flight == 0:
                del self.workers[u]
                for cb in self.on_remove:
                    cb(u)


def read_workers_file(path: str | Path) -> list[str]:
    """One URL per line (``#`` comments), or a JSON/YAML list, or {"workers": [...]}."""
    import yaml

    text = Path(path).read_text()
    data = yaml.safe_load(text) if text.strip().startswith(("[", "{", "-", "workers")) else None
    if isinstance(data, dict):
        data = data.get("workers")
    if isinstance(data, list):
        return [str(u).strip() for u in data if str(u).strip()]
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


async def watch_file(path: str, pool: WorkerPool, interval: float = 2.0) -> None:
    last = None
    while True:
        try:
            mtime = Path(path).stat().st_mtime_ns
            if mtime != last:
                pool.sync(read_workers_file(path))
                last = mtime
        except (OSError, ValueError) as exc:
            log.warning("cannot read workers file %s: %s", path, exc)
        await asyncio.sleep(interval)


def endpoints_from_slices(slices, port_name: str | None, default_port: int, scheme: str = "http") -> list[str]:
    """Ready, non-terminating endpoint addresses of EndpointSlice objects (client objects or dicts)."""
    def get(obj, key):
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    urls = []
    for s in slices:
        port = default_port
        for p in get(s, "ports") or []:
            if port_name is None or get(p, "name") == port_name:
                port = get(p, "port") or default_port
                break
        for ep in get(s, "endpoints") or []:
            cond = get(ep, "conditions") or {}
            ready, terminating = get(cond, "ready"), get(cond, "terminating")
            if ready is False or terminating:
                continue
            for addr in get(ep, "addresses") or []:
                host = f"[{addr}]" if ":" in addr else addr
                urls.append(f"{scheme}://{host}:{port}")
    return sorted(set(urls))


async def watch_kubernetes(service: str, namespace: str, pool: WorkerPool, port_name: str | None, default_port: int,
                           relist: float = 30.0) -> None:
    """Keep ``pool`` equal to the Service's ready endpoints (watch + periodic re-list)."""
    try:
        from kubernetes import client, config, watch
    except ImportError as exc:           # the gateway image installs the k8s extra
        raise RuntimeError("Kubernetes discovery needs the 'kubernetes' package (pip install swiftserve[k8s])") from exc
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    api = client.DiscoveryV1Api()
    selector = f"kubernetes.io/service-name={service}"
    loop = asyncio.get_running_loop()

    def list_once():
        return api.list_namespaced_endpoint_slice(namespace, label_selector=selector)

    def watch_for(seconds: float):
        w = watch.Watch()
        for _ in w.stream(api.list_namespaced_endpoint_slice, namespace, label_selector=selector,
                          timeout_seconds=int(seconds)):
            return True          # any change: re-list
        return False

    while True:
        try:
            items = (await loop.run_in_executor(None, list_once)).items
            pool.sync(endpoints_from_slices(items, port_name, default_port))
            await loop.run_in_executor(None, watch_for, relist)
        except Exception as exc:  # noqa: BLE001 - keep the last known set and retry
            log.warning("kubernetes discovery failed: %s", exc)
            await asyncio.sleep(5)
