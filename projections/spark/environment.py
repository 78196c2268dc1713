"""Finding what Spark needs (Java, the PostgreSQL JDBC driver) and starting a session.

Spark needs a Java runtime and the PostgreSQL JDBC driver on its class path. The driver comes
from configuration (``JOURNAL_SPARK_JDBC_JAR``), a well-known system location (Debian's
``libpostgresql-jdbc-java`` installs /usr/share/java/postgresql.jar), the user's cache, where
Maven (``mvn``) resolves ``spark.jdbc_package`` from Maven Central once, or, failing that, Spark's
own package resolution. When none works the error says what to do.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from journal.errors import SparkSetupError
from journal.settings import SparkSettings

WELL_KNOWN_JARS: tuple[str, ...] = (
    "/usr/share/java/postgresql.jar",
    "/usr/share/java/postgresql-jdbc4.jar",
    "/usr/share/java/postgresql-jdbc.jar",
    "/usr/local/share/java/postgresql.jar",
    "/opt/homebrew/share/java/postgresql.jar",
)
"""Where distributions put the PostgreSQL JDBC driver (Debian/Ubuntu first)."""

MAVEN_HOST = ("repo1.maven.org", 443)

MVN_TIMEOUT = 300.0
"""Seconds ``mvn`` may take to fetch the driver (a cold local repository downloads its plugin)."""

log = logging.getLogger("projections.spark")

INSTALL_HINT = (
    "install the PostgreSQL JDBC driver (Debian/Ubuntu: apt-get install libpostgresql-jdbc-java, "
    "which provides /usr/share/java/postgresql.jar), or point JOURNAL_SPARK_JDBC_JAR at a "
    "postgresql-<version>.jar, or install Maven (mvn) or run where Spark can download {package} "
    "from Maven Central"
)


@dataclass(frozen=True)
class JdbcDriver:
    """How the driver reaches Spark: a local jar (``spark.jars``) or Maven coordinates."""

    jar: Path | None = None
    package: str | None = None

    def spark_conf(self) -> dict[str, str]:
        if self.jar is not None:
            return {"spark.jars": str(self.jar), "spark.driver.extraClassPath": str(self.jar)}
        assert self.package is not None
        return {"spark.jars.packages": self.package}

    def describe(self) -> str:
        return f"jar {self.jar}" if self.jar is not None else f"package {self.package} (from Maven)"


def find_java(env: dict[str, str] | None = None) -> Path:
    """The ``java`` Spark will use: ``$JAVA_HOME/bin/java`` or ``java`` on PATH."""
    env = dict(os.environ) if env is None else env
    home = env.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        if java.exists():
            return java
        raise SparkSetupError(
            f"JAVA_HOME={home} has no bin/java: set JAVA_HOME to a Java 17+ runtime "
            "(Debian/Ubuntu: apt-get install default-jre-headless)"
        )
    found = shutil.which("java", path=env.get("PATH"))
    if found is None:
        raise SparkSetupError(
            "Spark needs Java 17 or newer and none was found (no JAVA_HOME, no java on PATH): "
            "install one (Debian/Ubuntu: apt-get install default-jre-headless) or set JAVA_HOME"
        )
    return Path(found)


def maven_reachable(timeout: float = 3.0) -> bool:
    """Whether Maven Central answers a TCP connect (Spark's package resolution needs it)."""
    try:
        with socket.create_connection(MAVEN_HOST, timeout=timeout):
            return True
    except OSError:
        return False


def jar_cache_dir() -> Path:
    """Where jars resolved with Maven are kept: ``<user cache>/slice-journal/jars``."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("slice-journal")) / "jars"


def _jar_name(package: str) -> str:
    parts = package.split(":")
    if len(parts) != 3 or not all(parts):
        raise SparkSetupError(f"spark.jdbc_package must be group:artifact:version, got {package!r}")
    return f"{parts[1]}-{parts[2]}.jar"


def maven_jar(package: str, cache_dir: Path | None = None, *, mvn: str | None = None) -> Path | None:
    """The jar of ``package`` in the cache; when absent, fetched there with ``mvn`` (the
    dependency plugin's ``copy`` goal). None when ``mvn`` is missing or fails (logged)."""
    cache_dir = cache_dir or jar_cache_dir()
    jar = cache_dir / _jar_name(package)
    if jar.is_file():
        return jar
    mvn = mvn or shutil.which("mvn")
    if mvn is None:
        return None
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".mvn-") as tmp:
        cmd = [
            mvn, "-B", "-q", "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy",
            f"-Dartifact={package}:jar", f"-DoutputDirectory={tmp}",
        ]  # fmt: skip
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=MVN_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("mvn could not fetch %s: %s", package, e)
            return None
        got = Path(tmp) / jar.name
        if done.returncode != 0 or not got.is_file():
            log.warning("mvn could not fetch %s (exit %s): %s", package, done.returncode, done.stdout[-2000:])
            return None
        os.replace(got, jar)  # atomic: a concurrent reader sees no half-written jar
    return jar


def find_jdbc_driver(
    settings: SparkSettings,
    *,
    candidates: Sequence[str] = WELL_KNOWN_JARS,
    probe_maven: bool = True,
    cache_dir: Path | None = None,
) -> JdbcDriver:
    """The configured jar, else a well-known jar, else (``probe_maven``) the jar resolved with
    ``mvn`` into the cache, else the Maven package for Spark to resolve if Maven is reachable.

    Raises:
        SparkSetupError: the configured jar does not exist, or nothing was found; the message
            lists what was tried and what to install.
    """
    if settings.jdbc_jar:
        jar = Path(settings.jdbc_jar).expanduser()
        if not jar.is_file():
            raise SparkSetupError(
                f"JOURNAL_SPARK_JDBC_JAR={settings.jdbc_jar} does not exist: "
                + INSTALL_HINT.format(package=settings.jdbc_package)
            )
        return JdbcDriver(jar=jar)
    for c in candidates:
        if Path(c).is_file():
            return JdbcDriver(jar=Path(c))
    if probe_maven and settings.jdbc_package:
        fetched = maven_jar(settings.jdbc_package, cache_dir)
        if fetched is not None:
            return JdbcDriver(jar=fetched)
        if maven_reachable():
            return JdbcDriver(package=settings.jdbc_package)
    tried = ", ".join(candidates) or "(no locations)"
    raise SparkSetupError(
        f"no PostgreSQL JDBC driver found (looked at JOURNAL_SPARK_JDBC_JAR, {tried}; "
        f"Maven Central {'not tried' if not probe_maven else 'unreachable'}): "
        + INSTALL_HINT.format(package=settings.jdbc_package)
    )


def session_conf(settings: SparkSettings, driver: JdbcDriver, master: str | None = None) -> dict[str, str]:
    """The Spark configuration this library starts sessions with (small, UTC, driver on path)."""
    conf = {
        "spark.master": master or settings.master,
        "spark.app.name": "slice-journal",
        "spark.driver.memory": settings.driver_memory,
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "true" if sys.stderr.isatty() else "false",
    }
    if not conf["spark.master"].startswith("local"):
        conf["spark.executor.memory"] = settings.executor_memory
    if runs_on_this_host(conf["spark.master"]):
        # Python workers on this machine run this Python (its packages: the journal's codec,
        # serializers and upcasters read payloads in them), not whatever python3 is on PATH
        conf["spark.pyspark.python"] = os.environ.get("PYSPARK_PYTHON") or sys.executable
    if is_cluster_on_this_host(conf["spark.master"]):
        # executors on this machine: they call the driver back on loopback
        conf.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    conf.update(driver.spark_conf())
    return conf


_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}


def is_cluster_on_this_host(master: str) -> bool:
    """A ``spark://`` master whose every host is a loopback address (its workers run here)."""
    if not master.startswith("spark://"):
        return False
    hosts = [h.rsplit(":", 1)[0] if h.count(":") == 1 or h.startswith("[") else h for h in master[8:].split(",")]
    return all(h in _LOOPBACK or h.startswith("127.") for h in hosts)


def runs_on_this_host(master: str) -> bool:
    """Spark's executors run on this machine: ``local[...]`` or a cluster on loopback."""
    return master.startswith("local") or is_cluster_on_this_host(master)


def spark_session(settings: SparkSettings, *, master: str | None = None) -> Any:
    """Start (or reuse) a SparkSession with Java and the JDBC driver checked first.

    Raises:
        SparkSetupError: pyspark, Java or the JDBC driver is missing, or Spark failed to start.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:
        raise SparkSetupError("Spark pipelines need the 'spark' extra: pip install 'slice-journal[spark]'") from e
    find_java()
    driver = find_jdbc_driver(settings)
    builder = SparkSession.builder
    for k, v in session_conf(settings, driver, master).items():
        builder = builder.config(k, v)
    try:
        session = builder.getOrCreate()
    except Exception as e:
        raise SparkSetupError(
            f"Spark failed to start (master {master or settings.master}, JDBC driver {driver.describe()}): {e}"
        ) from e
    session.sparkContext.setLogLevel("ERROR")
    python = session.conf.get("spark.pyspark.python", None)
    if python:  # PySpark takes its workers' Python from $PYSPARK_PYTHON only (else python3 on PATH)
        session.sparkContext.pythonExec = python
    return session
