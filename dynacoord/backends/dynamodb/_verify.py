"""The DynamoDB backend's checks of what it was given: the client at construction, the table on
first use.

Why a check: a table keyed on ``pk`` alone takes a PutItem of a dynacoord item without complaint
(``sk`` is just one more attribute there), and a table without ``gsi1`` (or with an index keyed on
other attributes) takes every write; the damage shows later, as reads that fail with DynamoDB's
``The number of conditions on the keys is invalid`` or listings that never find an item, naming
neither the table nor the fix. Only a DescribeTable sees the index, so no write can be its own
check: one DescribeTable before the **first write** of each client and table finds a wrong shape
while nothing is written yet.

Reads go first without it. A read cannot damage a table, and DynamoDB refuses every read of a
table that could not answer it (``ResourceNotFoundException`` for a missing table or index,
``ValidationException`` for a key schema the request does not match); such a refusal runs the
check, which names the table and the fix. A read that succeeds leaves the check to the first
write.

When it is sent (``verify=``):

* ``True``, the default: with the first write, which sends the DescribeTable just before itself
  (no thread) -- except in a Lambda execution environment initialised ahead of its requests
  (``AWS_LAMBDA_INITIALIZATION_TYPE=provisioned-concurrency``), where it is sent early, during
  init, and no request waits for it.
* ``"early"``: when the backend is made, on a thread of its own, so that its answer is in (or on
  its way) by the first write, which waits for it instead of sending its own. Measured in bench
  section 5, an early check made a script's cold start slower, not faster: under the GIL the
  check's botocore work (about 2 ms) runs in place of the caller's, its thread holds up the
  backend's maker until its request is sent, and only the server's answer can overlap the
  caller's work (on a machine shared with the server, DynamoDB Local there, even that answer came
  later). It pays where the process has other work to overlap the round
  trip with, or time before its first request.
* ``"first-write"``: with the first write, everywhere (no thread: for a process that forks right
  after making its backend, say).
* ``False``: never (an IAM policy without ``dynamodb:DescribeTable``).

An early check never raises: a table created after the backend (tests and scripts commonly build
the backend first), a role refused DescribeTable or no network makes it find nothing, and the
first write checks again and raises what it finds. Either way the check is made once per client
and table (a process that builds a backend per request pays it once).

The table's TTL (off, or on another attribute) is read by one DescribeTimeToLive a second
(:data:`TTL_CHECK_DELAY_S`) after a passing check: by the early check's own thread, or, after a
check the first write made, on a thread that write starts once it is done. Its finding is a
logged warning, never a refusal, so the first write neither waits for it nor shares the
connection, the server or the interpreter with it, and neither do the operations right after
it (a cold start's first invocation: a thread started by the first write and sending at once
took 1-2 ms of it). A process that exits sooner sends it on its way out (``atexit``), so a
short script or CLI command still logs its warning.

The same DescribeTable shows whether the table is a DynamoDB global table; what that lets its
writes promise, and the gate that refuses the others, is :mod:`._global_tables`.

The check is the first guard of the session's request path (:class:`FirstUseCheck`, in
:attr:`DynamoTable.guards`); once the table passed it removes itself, so later requests pass no
guard at all on a table in one Region (one empty tuple tested per request).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Any, Literal

from ..._table_schema import DEFAULT_LAYOUT, TableLayout, schema_problems, ttl_problem
from ..._table_state import mark_verified, table_state
from ...errors import BackendError, ConfigurationError
from ...metrics import Metrics
from ._replication import GlobalTableWrites, remember, ttl_problem_on, write_gate
from ._table import DynamoTable, Send

__all__ = [
    "TTL_CHECK_DELAY_S",
    "FirstUseCheck",
    "TableConfigurationError",
    "VerifiedTable",
    "Verify",
    "check_client",
    "check_table",
    "check_verify",
    "sends_early",
    "start_ttl_check",
    "wait_for_ttl_checks",
]

logger = logging.getLogger(__name__)

#: ``verify=`` of a backend: True (the check sent with the first write, or early in a Lambda
#: environment initialised ahead of its requests), ``"early"`` (sent when the backend is made,
#: waited for by the first write), ``"first-write"`` (sent with the first write) or False (none)
Verify = bool | Literal["early", "first-write"]


def check_verify(value: Any) -> Verify:
    """``verify=`` as given, or a :class:`ConfigurationError` naming the choices."""
    if isinstance(value, bool) or value in ("early", "first-write"):
        return value  # type: ignore[no-any-return]
    raise ConfigurationError(
        f"verify must be True (check the table before the first write), 'early' (send the check "
        f"when the backend is made), 'first-write' (send it with the first write) or False "
        f"(never), got {value!r}"
    )


def sends_early(verify: Verify) -> bool:
    """Whether the check is sent when the backend is made (see the module docstring)."""
    if verify == "early":
        return True
    return verify is True and (
        os.environ.get("AWS_LAMBDA_INITIALIZATION_TYPE") == "provisioned-concurrency"
    )


#: the operations the stores call on the client, and DescribeTable for the check
_CLIENT_METHODS = (
    "get_item",
    "put_item",
    "update_item",
    "delete_item",
    "query",
    "transact_write_items",
    "batch_write_item",
    "describe_table",
)


class TableConfigurationError(ConfigurationError):
    """The backend's table cannot hold dynacoord's items (missing, or another key schema, or no
    ``gsi1``). A :class:`~dynacoord.errors.ConfigurationError`; ``problems`` lists what is
    wrong, in the words of ``dynacoord table verify``."""

    def __init__(self, message: str, *, table_name: str, problems: list[str]) -> None:
        super().__init__(message)
        self.table_name = table_name
        self.problems = problems


def check_client(client: Any) -> None:
    """Refuse what is not a low-level DynamoDB client, naming what it is instead.

    Duck-typed on the methods the stores call, so a wrapped or instrumented client passes."""
    missing = [name for name in _CLIENT_METHODS if not callable(getattr(client, name, None))]
    if not missing:
        return
    meta = getattr(client, "meta", None)
    service_model = getattr(meta, "service_model", None)
    service = getattr(service_model, "service_name", None)
    if isinstance(service, str) and service != "dynamodb":
        what = f"a boto3 {service!r} client"
    elif getattr(meta, "client", None) is not None and hasattr(client, "Table"):
        what = (
            "a boto3 DynamoDB resource (boto3.resource); pass its low-level client, "
            "resource.meta.client, or boto3.client('dynamodb')"
        )
    else:
        what = f"a {type(client).__name__} without {', '.join(missing)}"
    raise ConfigurationError(
        f"DynamoDBBackend needs a low-level DynamoDB client, boto3.client('dynamodb'); got {what}"
    )


def _where(client: Any) -> str:
    meta = getattr(client, "meta", None)
    parts = []
    region = getattr(meta, "region_name", None)
    if isinstance(region, str) and region:
        parts.append(f"region {region}")
    endpoint = getattr(meta, "endpoint_url", None)
    if isinstance(endpoint, str) and endpoint and "amazonaws.com" not in endpoint:
        parts.append(f"endpoint {endpoint}")
    return f" ({', '.join(parts)})" if parts else ""


def _layout_option(layout: TableLayout) -> str:
    """The CLI option that names ``layout`` (nothing for the default)."""
    return "" if layout.is_default else f" --table-layout '{layout.to_json()}'"


def check_table(
    client: Any, table_name: str, layout: TableLayout = DEFAULT_LAYOUT, *, ttl: bool = True
) -> bool:
    """One DescribeTable of ``table_name``: raise :class:`TableConfigurationError` if it does
    not exist or cannot hold dynacoord's items (in ``layout``'s names); remember a table that
    passed for this client. Return whether it was described (False: it had passed before).

    A table or index still being created passes (its key schema is final). TTL off or on
    another attribute does not fail the check (reads treat expired items as absent; they are
    just never swept): with ``ttl``, one DescribeTimeToLive after a passing schema, on a thread
    of its own (:func:`start_ttl_check`), logs a warning with the fix, and a refused one (a role
    without ``dynamodb:DescribeTimeToLive``) is passed over.
    """
    if layout in table_state(client, table_name).verified:
        return False
    option = _layout_option(layout)
    from botocore.exceptions import ClientError

    try:
        table = client.describe_table(TableName=table_name)["Table"]
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        if code == "ResourceNotFoundException":
            problem = f"table {table_name!r} does not exist"
            raise TableConfigurationError(
                f"DynamoDB table {table_name!r} does not exist{_where(client)}: create it with "
                f"`dynacoord --table {table_name} table create{option}` (or deploy the stack: "
                "`dynacoord stack deploy`), or fix the table name or region; nothing was written",
                table_name=table_name,
                problems=[problem],
            ) from exc
        raise BackendError(
            f"cannot describe DynamoDB table {table_name!r} before its first use: "
            f"{error.get('Message', exc)} (pass verify=False to skip this check, for example "
            "when the IAM policy does not allow dynamodb:DescribeTable)",
            code=code,
        ) from exc
    problems = schema_problems(table, statuses=False, layout=layout)
    if problems:
        keys_wrong = any(not p.startswith(("global secondary index", "index ")) for p in problems)
        fix = (
            "a table's key schema cannot be changed: point the backend at a dynacoord table "
            "(or give it the layout of yours: TableLayout) or create one under another name "
            f"(`dynacoord --table NAME table create{option}`)"
            if keys_wrong
            else f"`dynacoord --table {table_name} table create{option}` adds a missing "
            f"{layout.index}"
        )
        raise TableConfigurationError(
            f"DynamoDB table {table_name!r}{_where(client)} cannot hold dynacoord's items: "
            f"{'; '.join(problems)}. Check it with `dynacoord --table {table_name} table verify"
            f"{option}`; "
            f"{fix}. Nothing was written",
            table_name=table_name,
            problems=problems,
        )
    remember(client, table_name, table)  # a global table: what its writes may promise
    mark_verified(client, table_name, layout)
    if ttl:
        start_ttl_check(client, table_name, layout)
    return True


#: seconds from a passing check (or from the first write, when that write made the check) to the
#: TTL check's DescribeTimeToLive (see the module docstring)
TTL_CHECK_DELAY_S = 1.0


class _TTLCheck:
    """One table's TTL read, :data:`TTL_CHECK_DELAY_S` after it is made or as soon as
    :func:`wait_for_ttl_checks` asks; logs what is wrong with it."""

    def __init__(self, client: Any, table_name: str, layout: TableLayout) -> None:
        self.now = threading.Event()
        self.done = threading.Event()
        self._args = (client, table_name, layout)

    def run(self) -> None:
        try:
            self.now.wait(TTL_CHECK_DELAY_S)
            _warn_about_ttl(*self._args)
        finally:
            self.done.set()


#: the TTL checks made by this process and not finished (see :func:`wait_for_ttl_checks`)
_ttl_checks: list[_TTLCheck] = []
_ttl_checks_guard = threading.Lock()


def _ttl_check(client: Any, table_name: str, layout: TableLayout) -> _TTLCheck:
    check = _TTLCheck(client, table_name, layout)
    with _ttl_checks_guard:
        _ttl_checks[:] = [c for c in _ttl_checks if not c.done.is_set()]
        _ttl_checks.append(check)
    return check


def start_ttl_check(client: Any, table_name: str, layout: TableLayout) -> None:
    """Read the table's TTL on a thread of its own, a little later (:data:`TTL_CHECK_DELAY_S`),
    and log what is wrong with it."""
    # A daemon, so that its delay holds up no exit; wait_for_ttl_checks runs at exit.
    threading.Thread(
        target=_ttl_check(client, table_name, layout).run,
        name=f"dynacoord-ttl-check-{table_name}",
        daemon=True,
    ).start()


def wait_for_ttl_checks(timeout: float | None = None) -> None:
    """Send the TTL checks made so far now and wait until they have logged what they found
    (for at most ``timeout`` seconds in all)."""
    with _ttl_checks_guard:
        pending = list(_ttl_checks)
    for check in pending:
        check.now.set()
    deadline = None if timeout is None else time.monotonic() + timeout
    for check in pending:
        check.done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))


def _forget_ttl_checks_in_child() -> None:
    """A forked child has none of its parent's threads: the parent reads the TTL, and the
    child's exit must not wait for checks no thread of its own will ever finish."""
    global _ttl_checks_guard
    _ttl_checks_guard = threading.Lock()
    _ttl_checks.clear()


# A process that exits within the delay still reads its tables' TTL and logs the warning, as it
# did when the checks were not daemons; bounded, so an unreachable endpoint holds up no exit.
atexit.register(wait_for_ttl_checks, 10.0)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_ttl_checks_in_child)


def _warn_about_ttl(client: Any, table_name: str, layout: TableLayout) -> None:
    """Log, once per check, a table whose TTL would never sweep dynacoord's expired items."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        description = client.describe_time_to_live(TableName=table_name)["TimeToLiveDescription"]
    except (BotoCoreError, ClientError, KeyError) as exc:
        logger.debug("TTL of table %r not read at first use: %s", table_name, exc)
        return
    problem = ttl_problem(description, layout)
    if problem is not None:
        problem = ttl_problem_on(client, table_name, problem)
        logger.warning("DynamoDB table %r%s: %s", table_name, _where(client), problem)


#: the operations that read: sent before the check (DynamoDB refuses a read the table cannot
#: answer, and that refusal runs the check); every other operation writes, and waits for it
_READS = frozenset({"get_item", "query", "scan", "batch_get_item", "transact_get_items"})
#: the error codes with which DynamoDB refuses a request the table's shape cannot take
_SHAPE_CODES = frozenset({"ResourceNotFoundException", "ValidationException"})


def _shape_refusal(exc: BaseException) -> bool:
    """Whether ``exc`` (translated by :meth:`DynamoTable.call`) is DynamoDB refusing a request
    for the table's shape: no such table or index, or keys that do not match its key schema."""
    cause = exc.__cause__
    response = getattr(cause, "response", None)
    if not isinstance(response, dict):
        return False
    return response.get("Error", {}).get("Code") in _SHAPE_CODES


class FirstUseCheck:
    """The first guard of a session's request path (:attr:`DynamoTable.guards`): a read is sent
    as it is, and checks the table (:func:`check_table`) only when DynamoDB refused it for the
    table's shape; a write waits for the check first. Once the table passed, the guard takes
    itself out of the session's guards and puts a global table's gate in its place, if the
    check found one (``_replication.write_gate``)."""

    __slots__ = ("_table", "_writes")

    def __init__(self, table: VerifiedTable, global_table_writes: GlobalTableWrites) -> None:
        self._table = table
        self._writes: GlobalTableWrites = global_table_writes

    def __call__(self, operation: str, kwargs: dict[str, Any], send: Send) -> dict[str, Any]:
        table = self._table
        if operation in _READS:
            try:
                return send(operation, kwargs)
            except Exception as exc:
                if not _shape_refusal(exc):
                    raise
                if self.check():  # a wrong table: TableConfigurationError, naming the fix
                    start_ttl_check(table.client, table.name, table.layout)
                raise  # a right one: the refusal was the request's own
        checked = self.check()
        try:
            return table.call(operation, **kwargs)  # through the guards now in place (a gate)
        finally:
            # The TTL is read once the write is done, so it does not compete with it (for the
            # connection, the server and the interpreter).
            if checked:
                start_ttl_check(table.client, table.name, table.layout)

    def check(self) -> bool:
        """Check the table unless it passed before; whether it was described now. Once it
        passed, this guard is out of the session's guards (and a gate in, if it needs one)."""
        table = self._table
        # Threads making their first writes at once (concurrent invocations) wait for one
        # check instead of each sending its own DescribeTable.
        with table.state.check_lock:  # an early check in flight is waited for
            checked = check_table(table.client, table.name, table.layout, ttl=False)
            gate = write_gate(table, table.client, self._writes)
            # This check is the only guard until the table passed (a gate comes from what it
            # found). One assignment: a request on another thread finds the check or the gate.
            table.guards = () if gate is None else (gate,)
        return checked


class VerifiedTable(DynamoTable):
    """The table session of a backend: a :class:`DynamoTable` whose request path starts with
    :class:`FirstUseCheck` (the check's lock and its finding are the session's shared state: one
    check per client and table), and, on a global table, the gate it finds."""

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        metrics: Metrics,
        verify: Verify = True,
        layout: TableLayout = DEFAULT_LAYOUT,
        global_table_writes: GlobalTableWrites = "refuse",
    ) -> None:
        super().__init__(client, table_name, metrics=metrics, layout=layout)
        #: set once the early check is over (at once when there is none)
        self.early_check_done = threading.Event()
        if verify and layout not in self.state.verified:
            self.guards = (FirstUseCheck(self, global_table_writes),)
            if sends_early(verify):
                threading.Thread(
                    target=self._check_early, name=f"dynacoord-check-{table_name}", daemon=True
                ).start()
                return
        elif verify:
            gate = write_gate(self, self.client, global_table_writes)
            if gate is not None:
                self.guards = (gate,)
        self.early_check_done.set()

    def _check_early(self) -> None:
        """The check, sent before anything asks for it; finds nothing rather than raise (the
        first write checks again, and raises what it finds there). A table it described has
        its TTL read by this thread too, a while later: the first write starts no thread."""
        try:
            with self.state.check_lock:
                described = check_table(self.client, self.name, self.layout, ttl=False)
        except Exception as exc:
            logger.debug("early check of table %r found nothing: %s", self.name, exc)
            return
        finally:
            self.early_check_done.set()
        if described:
            _ttl_check(self.client, self.name, self.layout).run()
