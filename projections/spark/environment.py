"""Finding what Spark needs (Java, the PostgreSQL JDBC driver) and starting a session.

Spark needs a Java runtime and the PostgreSQL JDBC driver on its class path. The driver comes
from configuration (``JOURNAL_SPARK_JDBC_JAR``), a well-known system location (Debian's
``libpostgresql-jdbc-java`` installs /usr/share/java/postgresql.jar), or, only on a machine that
can reach Maven Central, Spark's package resolution. When none works the error says what to do.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
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

INSTALL_HINT = (
    "install the PostgreSQL JDBC driver (Debian/Ubuntu: apt-get install libpostgresql-jdbc-java, "
    "which provides /usr/share/java/postgresql.jar), or point JOURNAL_SPARK_JDBC_JAR at a "
    "postgresql-<version>.jar, or run where Spark can download {package} from Maven Central"
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


def find_jdbc_driver(
    settings: SparkSettings,
    *,
    candidates: Sequence[str] = WELL_KNOWN_JARS,
    probe_maven: bool = True,
) -> JdbcDriver:
    """The configured jar, else a well-known jar, else the Maven package if Maven is reachable.

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
    if probe_maven and settings.jdbc_package and maven_reachable():
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
    conf.update(driver.spark_conf())
    return conf


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
    return session
