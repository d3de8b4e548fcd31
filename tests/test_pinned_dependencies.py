"""The test, tool and benchmark dependencies are pinned (issue 52: a fresh machine took the newest
moto and two tests failed; a machine with an older one stayed green). Every requirement of the
extras the Makefile installs has one exact version in constraints.txt, and every ``pip install``
of the Makefile and of .ci/run goes through that file."""

from __future__ import annotations

import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
PINNED_EXTRAS = ("dev", "redis", "mongo", "bench", "otel")


def _name(requirement: str) -> str:
    """The normalised project name of a requirement string (PEP 503)."""
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        assert _name(name) not in pins, f"constraints.txt pins {name} twice"
        pins[_name(name)] = version
    return pins


def test_every_requirement_of_the_installed_extras_is_pinned() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = _pins()
    wanted = list(project["dependencies"])
    for extra in PINNED_EXTRAS:
        wanted += project["optional-dependencies"][extra]
    missing = []
    for requirement in wanted:
        # a requirement only for another Python (tomli below 3.11) is pinned where it installs
        if ";" in requirement and "python_version" in requirement.split(";", 1)[1]:
            continue
        if _name(requirement) not in pins:
            missing.append(requirement)
    assert not missing, f"not pinned in constraints.txt: {missing} (run make constraints)"


def test_every_install_of_the_makefile_and_ci_takes_the_pins() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "PIP_PINNED := $(BIN)/pip install --quiet -c constraints.txt" in makefile
    unpinned = []
    for line in makefile.splitlines() + (ROOT / ".ci" / "run").read_text().splitlines():
        if (
            "pip install" not in line
            or "-c constraints.txt" in line
            or line.lstrip().startswith("#")
        ):
            continue
        # upgrading pip itself, and `make constraints`, which resolves the newest releases
        if "--upgrade pip" in line or "CONSTRAINTS_VENV" in line:
            continue
        unpinned.append(line.strip())
    assert not unpinned, f"pip installs that skip constraints.txt: {unpinned}"
