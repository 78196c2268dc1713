"""A standalone Spark cluster on this machine: a master and workers from pyspark's own launcher.

For trying cluster mode without a cluster, and for the tests. Every process listens on
127.0.0.1 on ports the system picks (``--port 0``: no collisions between parallel runs), logs
and work directories live in one throwaway directory, readiness is read from the master's log
and its web UI JSON (never a fixed sleep), and :meth:`LocalSparkCluster.stop` ends every process
it started (each worker's executors with it: they share its process group).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.errors import SparkSetupError

from .environment import find_java

_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_WEB_UI = re.compile(r"MasterWebUI.*started at http://[^:\s]+:(\d+)")


def spark_class() -> Path:
    """pyspark's ``bin/spark-class`` (the launcher of Spark's JVM classes)."""
    try:
        import pyspark
    except ImportError as e:
        raise SparkSetupError("a Spark cluster here needs the 'spark' extra: pip install 'slice-journal[spark]'") from e
    path = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not path.is_file():
        raise SparkSetupError(f"pyspark has no launcher at {path}")
    return path


@dataclass
class LocalSparkCluster:
    """``with LocalSparkCluster(workers=2) as c:`` then use ``c.master_url`` (``spark://...``)."""

    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    """What each worker offers executors (keep ``spark.executor.memory`` at or below it)."""
    daemon_memory: str = "256m"
    """Heap of the master and worker JVMs themselves."""
    host: str = "127.0.0.1"
    python: str = sys.executable
    """PYSPARK_PYTHON of the cluster's processes: the running interpreter by default."""
    base_dir: Path | None = None
    master_url: str = ""
    web_url: str = ""
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    def _env(self) -> dict[str, str]:
        assert self.base_dir is not None
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_class().parent.parent),
            SPARK_LOCAL_IP=self.host,
            SPARK_LOG_DIR=str(self.base_dir / "logs"),
            SPARK_LOCAL_DIRS=str(self.base_dir / "local"),
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            PYSPARK_PYTHON=self.python,
            JAVA_HOME=env.get("JAVA_HOME") or str(find_java().resolve().parent.parent),
        )
        return env

    def _launch(self, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        assert self.base_dir is not None
        log = self.base_dir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(spark_class()), *args], stdout=out, stderr=subprocess.STDOUT, env=self._env(),
                cwd=self.base_dir, start_new_session=True,
            )  # fmt: skip
        self._procs.append(proc)
        return proc, log

    def start(self, timeout: float = 180.0) -> str:
        """Start the master and the workers; return the master URL once every worker is ALIVE.

        Raises:
            SparkSetupError: a process exited, or the cluster was not ready within ``timeout``
                (the message carries the end of the process's log); everything started is stopped.
        """
        find_java()
        if self.base_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="sj-spark-cluster-")
            self.base_dir = Path(self._tmp.name)
        for d in ("logs", "local"):
            (self.base_dir / d).mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        try:
            master, log = self._launch(
                "master", "org.apache.spark.deploy.master.Master", "--host", self.host, "--port", "0",
                "--webui-port", "0",
            )  # fmt: skip
            url, port = self._wait_for_master(master, log, deadline)
            self.master_url, self.web_url = url, f"http://{self.host}:{port}"
            for i in range(self.workers):
                work = self.base_dir / f"work-{i}"
                work.mkdir(exist_ok=True)
                self._launch(
                    f"worker-{i}", "org.apache.spark.deploy.worker.Worker", "--host", self.host, "--port", "0",
                    "--webui-port", "0", "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                    "--work-dir", str(work), self.master_url,
                )  # fmt: skip
            self._wait_for_workers(deadline)
        except BaseException:
            self.stop()
            raise
        return self.master_url

    def _check_alive(self) -> None:
        assert self.base_dir is not None
        for proc in self._procs:
            if proc.poll() is not None:
                args = proc.args if isinstance(proc.args, list) else [str(proc.args)]
                name = "master" if any("master.Master" in str(a) for a in args) else "a worker"
                raise SparkSetupError(f"the Spark {name} exited with {proc.returncode}: {self.log_tail()}")

    def _wait_for_master(self, proc: subprocess.Popen[bytes], log: Path, deadline: float) -> tuple[str, str]:
        delay = 0.05
        while time.monotonic() < deadline:
            self._check_alive()
            text = log.read_text(errors="replace")
            url, web = _MASTER_URL.search(text), _WEB_UI.search(text)
            if url and web:
                return url.group(1), web.group(1)
            time.sleep(delay)  # polling the log for a condition, with a deadline
            delay = min(delay * 2, 0.5)
        raise SparkSetupError(f"the Spark master was not up in time: {self.log_tail()}")

    def status(self) -> dict[str, Any]:
        """The master's web UI JSON (workers, their state, applications)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as r:
            data: dict[str, Any] = json.load(r)
        return data

    def _wait_for_workers(self, deadline: float) -> None:
        delay = 0.05
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError, ValueError):
                if self.status().get("aliveworkers", 0) >= self.workers:
                    return
            time.sleep(delay)  # polling the web UI for a condition, with a deadline
            delay = min(delay * 2, 0.5)
        raise SparkSetupError(f"{self.workers} Spark workers were not ALIVE in time: {self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of every process's log (for error messages)."""
        if self.base_dir is None:
            return ""
        out = []
        for log in sorted(self.base_dir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(out)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the workers (and their executors), then the master; kill what does not stop."""
        for proc in reversed(self._procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
        for proc in self._procs:  # executors left in a worker's group after it exited
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self._procs.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self.base_dir = None

    def __enter__(self) -> LocalSparkCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
