"""Application name and version of an endpoint: replicate only to targets at least as new."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigurationError, IncompatibleVersion

_VERSION = re.compile(r"^\d+(\.\d+)*$")


@dataclass(frozen=True, slots=True)
class Application:
    """``name`` and a dotted numeric ``version`` ("1.2"); compared part by part."""

    name: str = ""
    version: str = "0"

    def __post_init__(self) -> None:
        if not _VERSION.match(self.version):
            raise ConfigurationError(f"application version must be dotted numbers like '1.2', got {self.version!r}")

    @property
    def parts(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.version.split("."))

    def check_target(self, target: Application, source_location: str, target_location: str) -> None:
        """Raise :class:`IncompatibleVersion` when this source must not replicate to ``target``."""
        if self.name == target.name and target.parts < self.parts:
            raise IncompatibleVersion(
                f"replication from {source_location!r} to {target_location!r} refused: target application "
                f"{target.name!r} version {target.version} is older than the source's {self.version}"
            )
