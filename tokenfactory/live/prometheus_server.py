"""A real Prometheus on loopback for the tests and the live study: config written, started, stopped.

:class:`PrometheusServer` writes a config scraping the given targets every ``scrape_interval_s``
(default 1 s), starts Debian's ``prometheus`` binary (``.ci/run`` installs the package) on
``127.0.0.1`` with its storage in a temporary folder, waits until ``/-/ready`` answers, and stops
the process (terminate, then kill after 5 s) on :meth:`stop` or when the ``with`` block ends.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from tokenfactory.core.errors import ConfigError

__all__ = ["PrometheusServer", "prometheus_binary", "free_port"]


def prometheus_binary() -> str | None:
    """Path of the ``prometheus`` executable, or None when it is not installed."""
    return shutil.which("prometheus") or (str(Path("/usr/bin/prometheus")) if Path("/usr/bin/prometheus").is_file()
                                          else None)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """A Prometheus process scraping ``targets`` (``{job: ["127.0.0.1:PORT", ...]}``).

    Parameters
    ----------
    targets : dict
        Job name -> host:port targets (loopback only).
    scrape_interval_s : float
        Scrape and evaluation interval (s; default 1).
    port : int, optional
        Its listen port (default a free one).
    """

    def __init__(self, targets: dict[str, list[str]], scrape_interval_s: float = 1.0, port: int | None = None):
        for job, ts in targets.items():
            for t in ts:
                if not (t.startswith("127.") or t.startswith("localhost:")):
                    raise ConfigError(f"targets.{job}", f"{t!r}: only loopback targets")
        self.targets, self.interval = targets, float(scrape_interval_s)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.dir: tempfile.TemporaryDirectory | None = None

    def config_text(self) -> str:
        iv = f"{int(self.interval * 1000)}ms"
        jobs = "\n".join(f"  - job_name: {json.dumps(job)}\n    metrics_path: /metrics\n    static_configs:\n"
                         f"      - targets: {json.dumps(ts)}" for job, ts in self.targets.items())
        return f"global:\n  scrape_interval: {iv}\n  evaluation_interval: {iv}\n  scrape_timeout: {iv}\n" \
               f"scrape_configs:\n{jobs}\n"

    def start(self, timeout_s: float = 30.0) -> "PrometheusServer":
        binary = prometheus_binary()
        if binary is None:
            raise ConfigError("prometheus", "the prometheus binary is not installed (apt-get install prometheus)")
        self.dir = tempfile.TemporaryDirectory(prefix="tf-prom-")
        cfg = Path(self.dir.name) / "prometheus.yml"
        cfg.write_text(self.config_text())
        self.proc = subprocess.Popen([binary, f"--config.file={cfg}", f"--storage.tsdb.path={self.dir.name}/data",
                                      f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        t_end = time.monotonic() + timeout_s
        while time.monotonic() < t_end:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace")[-500:]
                self.stop()
                raise ConfigError("prometheus", f"exited with {self.proc.returncode}: {err}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1.0) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise ConfigError("prometheus", f"not ready after {timeout_s} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        self.proc = None
        if self.dir is not None:
            self.dir.cleanup()
            self.dir = None

    def query(self, promql: str) -> dict:
        """An instant query's JSON response."""
        import urllib.parse
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}",
                                    timeout=5.0) as r:
            return json.loads(r.read())

    def __enter__(self) -> "PrometheusServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
