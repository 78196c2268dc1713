"""Java and a JAR set resolved by Maven into the user cache: what the local Cassandra node and the
local Kafka broker of the tests both need (one copy of the tool check and of the resolution)."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigurationError

Progress = Callable[[str], None]


@dataclass(frozen=True)
class JarSet:
    """The JARs a local JVM server runs on: ``artifacts`` (Maven coordinates, ``{version}`` in
    them the server's version; the first is the server's own) with their runtime dependencies,
    resolved into ``<cache>/<label>-<version>/lib``. ``what`` and ``error`` say a missing tool or
    a failed resolution (``what`` needs Java and Maven)."""

    label: str
    what: str
    error: type[ConfigurationError]
    artifacts: tuple[str, ...]

    def require_tools(self) -> tuple[str, str]:
        """Paths of ``java`` and ``mvn``, or ``error`` saying that ``what`` needs them and how to install them."""
        java, mvn = shutil.which("java"), shutil.which("mvn")
        missing = [name for name, path in (("Java 17 (java)", java), ("Maven (mvn)", mvn)) if path is None]
        if missing:
            needs = " and ".join(missing)
            raise self.error(
                f"{self.what} needs {needs} on PATH (Debian: apt-get install openjdk-17-jre-headless maven)"
            )
        assert java is not None and mvn is not None
        return java, mvn

    def ensure(self, version: str, cache: Path, progress: Progress) -> Path:
        """The ``lib`` directory of ``version``: resolved by Maven the first time (printing
        progress), then reused without Java or Maven; a file lock keeps two processes from
        resolving into the same directory at once, and ``COMPLETE`` beside it marks a whole set."""
        coordinates = [a.format(version=version) for a in self.artifacts]
        return _resolve(cache / f"{self.label}-{version}", coordinates, self, progress)

    def pom(self, coordinates: list[str]) -> str:
        """A POM that depends on ``coordinates`` (``group:artifact:version``) and nothing else."""
        dependencies = "".join(
            f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>\n"
            for g, a, v in (c.split(":") for c in coordinates)
        )
        return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>slice-journal</groupId>
  <artifactId>{self.label}-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}  </dependencies>
</project>
"""


def _resolve(home: Path, coordinates: list[str], jars: JarSet, progress: Progress) -> Path:
    """``home/lib``, as :meth:`JarSet.ensure` says."""
    artifact, label, error = coordinates[0], jars.label, jars.error
    lib, done = home / "lib", home / "COMPLETE"
    if done.exists():
        return lib
    _, mvn = jars.require_tools()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return lib
        progress(f"{label}: resolving {artifact} from Maven Central into {lib}")
        work = Path(tempfile.mkdtemp(prefix="resolve-", dir=home))
        try:
            (work / "pom.xml").write_text(jars.pom(coordinates), encoding="utf-8")
            cmd = [mvn, "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
                   f"-DoutputDirectory={work / 'lib'}", "-DincludeScope=runtime"]  # fmt: skip
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work)
            assert proc.stdout is not None
            tail: list[str] = []
            fetched = 0
            for line in proc.stdout:
                tail = [*tail[-40:], line.rstrip()]
                if line.startswith("Downloaded from") and ".jar" in line:
                    fetched += 1
                    if fetched % 10 == 1:
                        progress(f"{label}: downloaded {fetched} jars ...")
            if proc.wait() != 0:
                raise error(f"Maven could not resolve {artifact} (is Maven Central reachable?):\n" + "\n".join(tail))
            if lib.exists():
                shutil.rmtree(lib)
            (work / "lib").rename(lib)
            done.write_text(artifact, encoding="utf-8")
            progress(f"{label}: {len(list(lib.glob('*.jar')))} jars ready in {lib}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return lib
