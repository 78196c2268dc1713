"""Java and a JAR set resolved by Maven into the user cache: what the local Cassandra node and the
local Kafka broker of the tests both need (one copy of the tool check and of the resolution)."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from .errors import ConfigurationError

Progress = Callable[[str], None]


def require_tools(what: str, error: type[ConfigurationError]) -> tuple[str, str]:
    """Paths of ``java`` and ``mvn``, or ``error`` saying that ``what`` needs them and how to install them."""
    java, mvn = shutil.which("java"), shutil.which("mvn")
    missing = [name for name, path in (("Java 17 (java)", java), ("Maven (mvn)", mvn)) if path is None]
    if missing:
        raise error(
            f"{what} needs {' and '.join(missing)} on PATH (Debian: apt-get install openjdk-17-jre-headless maven)"
        )
    assert java is not None and mvn is not None
    return java, mvn


def resolve_jars(
    home: Path, artifact: str, pom: str, what: str, error: type[ConfigurationError], progress: Progress, label: str
) -> Path:
    """``home/lib``: the runtime dependencies of ``pom`` (which names ``artifact``), resolved by
    Maven the first time (printing progress), then reused without Java or Maven; a file lock keeps
    two processes from resolving into the same directory at once, and ``home/COMPLETE`` marks a
    whole set. ``what`` and ``error``: as :func:`require_tools` says a missing tool."""
    lib, done = home / "lib", home / "COMPLETE"
    if done.exists():
        return lib
    _, mvn = require_tools(what, error)
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return lib
        progress(f"{label}: resolving {artifact} from Maven Central into {lib}")
        work = Path(tempfile.mkdtemp(prefix="resolve-", dir=home))
        try:
            (work / "pom.xml").write_text(pom, encoding="utf-8")
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
