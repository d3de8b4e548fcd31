"""The code bundle of the stack's relay and sweeper functions: a deterministic zip of dynacoord,
typing-extensions and the user's handlers (:func:`package_relay`), uploaded to S3 under a key
named by its content (:func:`upload_bundle`), which is what makes CloudFormation update the
functions when, and only when, the code changed."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from ._aws import Refusal, call, request

__all__ = ["HANDLER_SPEC", "RelayBundle", "package_relay", "upload_bundle"]

#: ``MODULE:ATTRIBUTE`` of a handler (the stack parameters RelayHandlers and ReconcileHandler)
HANDLER_SPEC = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$")

#: Every entry of a bundle gets this time stamp, so the same files make the same bytes (and the
#: same S3 key): a redeploy of unchanged code changes nothing.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class RelayBundle:
    """The code bundle of the stack's relay and sweeper (:func:`package_relay`)."""

    #: the zip file's bytes
    data: bytes
    #: hex SHA-256 of ``data``
    sha256: str
    #: the paths inside the zip, sorted
    files: tuple[str, ...]

    @property
    def name(self) -> str:
        """A file name that changes with the content: a new S3 key for new code is what makes
        CloudFormation update the functions."""
        return f"dynacoord-relay-{self.sha256[:20]}.zip"


def _tree(root: Path, arcroot: str) -> Iterable[tuple[Path, str]]:
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if (
            path.is_file()
            and "__pycache__" not in rel.parts
            and path.suffix not in (".pyc", ".pyo")
        ):
            yield path, f"{arcroot}/{rel.as_posix()}"


def _module_files(module: str) -> list[tuple[Path, str]]:
    """The files of the top-level module or package ``module`` (found as ``import`` would)."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin in (None, "built-in", "frozen"):
        raise ValueError(f"cannot find module {module!r} to package (is it importable here?)")
    origin = Path(str(spec.origin))
    if spec.submodule_search_locations:
        return list(_tree(origin.parent, module))
    return [(origin, f"{module}{origin.suffix}")]


def package_relay(
    handlers: str,
    *,
    include: Iterable[str | Path] = (),
    reconcile: str | None = None,
    check: bool = True,
) -> RelayBundle:
    """Build the code bundle of the stack's relay and sweeper: a zip of dynacoord,
    typing-extensions (dynacoord's one dependency that Lambda's Python runtime lacks), the
    top-level module or package of ``handlers`` (``MODULE:ATTRIBUTE``), the module of
    ``reconcile`` if given, and every file or folder of ``include`` (at its own name). boto3 and
    botocore come from the Lambda runtime and are not bundled.

    With ``check`` (default), ``handlers`` (and ``reconcile``) are imported here first, as the
    functions will import them, and must be a callable or a mapping of event types to callables:
    a typo fails now, not in the deployed function. The bytes are deterministic (fixed entry
    times, sorted entries)."""
    import io
    import zipfile

    import typing_extensions

    from ..serverless import load_object

    specs = [("handlers", handlers)] + ([("reconcile handler", reconcile)] if reconcile else [])
    for what, spec in specs:
        if not isinstance(spec, str) or not HANDLER_SPEC.match(spec):
            raise ValueError(f"{what} must be MODULE:ATTRIBUTE, got {spec!r}")
    if check:
        for what, spec in specs:
            try:
                target = load_object(spec, what)
            except Exception as exc:
                # Most often the module reads its HandlerSettings at import (as the example
                # does) and finds none here: say where the check's settings come from.
                raise ConfigurationError(
                    f"the check imports {what} {spec!r} as the relay will, and that failed: "
                    f"{type(exc).__name__}: {exc}. If the module reads its HandlerSettings at "
                    "import, set DYNACOORD_HANDLER_SETTINGS to them here (the JSON you give the "
                    "stack as HandlerSettings; `stack deploy` uses the stack's); or skip the "
                    "check: --no-check (check=False)"
                ) from exc
            if what == "handlers" and isinstance(target, Mapping):
                bad = [k for k, v in target.items() if not isinstance(k, str) or not callable(v)]
                if bad:
                    raise ValueError(
                        f"handlers {spec!r}: entries {bad!r} do not map an event type to a callable"
                    )
            elif not callable(target):
                raise ValueError(f"{what} {spec!r} is not callable (nor a mapping of handlers)")
    package_root = Path(__file__).resolve().parents[1]  # dynacoord/
    entries: dict[str, Path] = {}
    sources = list(_tree(package_root, "dynacoord"))
    sources.append((Path(str(typing_extensions.__file__)), "typing_extensions.py"))
    for _, spec in specs:
        top = spec.partition(":")[0].split(".")[0]
        if top != "dynacoord":
            sources.extend(_module_files(top))
    for item in include:
        path = Path(item)
        if path.is_dir():
            sources.extend(_tree(path, path.resolve().name))
        elif path.is_file():
            sources.append((path, path.name))
        else:
            raise ValueError(f"cannot include {str(item)!r}: no such file or folder")
    for path, arcname in sources:
        previous = entries.setdefault(arcname, path)
        if previous.resolve() != path.resolve():
            raise ValueError(f"two files would be {arcname!r} in the bundle: {previous}, {path}")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for arcname in sorted(entries):
            info = zipfile.ZipInfo(arcname, _ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            bundle.writestr(info, entries[arcname].read_bytes())
    data = buffer.getvalue()
    import hashlib

    return RelayBundle(data, hashlib.sha256(data).hexdigest(), tuple(sorted(entries)))


def upload_bundle(s3_client: Any, bundle: RelayBundle, bucket: str, *, prefix: str = "") -> str:
    """Upload ``bundle`` to ``s3://bucket/{prefix}{bundle.name}`` (unless that key already holds
    it) and return the key, for the stack parameters ``CodeS3Bucket`` / ``CodeS3Key``."""
    key = f"{prefix}{bundle.name}"
    there = call(
        s3_client,
        "head_object",
        f"check s3://{bucket}/{key}",
        expect=lambda r: r.not_found,
        Bucket=bucket,
        Key=key,
    )
    if not isinstance(there, Refusal):
        return key  # the key names the content: it is there already
    request(
        s3_client,
        "put_object",
        f"upload the relay bundle to s3://{bucket}/{key}",
        Bucket=bucket,
        Key=key,
        Body=bundle.data,
    )
    return key
