"""A tally-agent client over its HTTP/1.1 + JSON Unix socket, standard library only.

The agent's HTTP interface is described in docs/protocol.md ("HTTP"). This client speaks it
over a Unix socket (default /run/tally/agent-http.sock) or loopback TCP, keeps one connection
open and builds in the protocol's retry rules:

* a reserve or a follow-up whose outcome is unknown (HTTP 503, a lost connection, a timeout) is
  retried with the **same** id and the same fields, after a jittered backoff, until a definitive
  answer or the deadline; a new id is never invented (that could hold the units twice);
* a rejection (429) is returned to the caller as it is (`Answer.rejected`, `retry_after_s`,
  `limiting_dimension`): a later attempt is a new reservation with a new id;
* every other reservation answer (ok, queued, conflict, not found, ...) is definitive and
  returned; an error object (`"error": true`, a bad request) raises `TallyError`.

Usage (a LiteLLM-style gateway):

    from tally_client import TallyClient
    tally = TallyClient()                       # /run/tally/agent-http.sock
    answer = tally.reserve("req-42", subject="tenant-a", route="chat", units=2000)
    if answer.rejected:
        return http_429(retry_after=answer.retry_after_s)
    tally.start("req-42", operation_id="req-42")
    ...                                         # call the model
    tally.settle("req-42", operation_id="req-42", actual_units=used)

Errors: `TallyUnavailable` when the deadline passes without a definitive answer (the caller
retries later with the same id), `TallyError` for a definitive error answer (a bad request, a
conflict), carrying the HTTP status and the JSON body.
"""

import http.client
import json
import random
import socket
import time
import urllib.parse

DEFAULT_SOCKET = "/run/tally/agent-http.sock"

__all__ = ["Answer", "TallyClient", "TallyError", "TallyUnavailable", "DEFAULT_SOCKET"]


class TallyError(Exception):
    """A definitive error answer from the agent (4xx other than 429, 5xx other than 503)."""

    def __init__(self, status, body):
        self.status = status
        self.body = body
        super().__init__(f"HTTP {status}: {body.get('code', '')} {body.get('message', '')}")

    @property
    def code(self):
        return self.body.get("code", "")


class TallyUnavailable(TallyError):
    """No definitive answer before the deadline: retry later with the same id."""


class Answer:
    """One answer: the HTTP status, Retry-After (seconds, or None) and the JSON object, whose
    fields are `tallyctl --json`'s (reservationId, state, reservedUnits, refundedUnits, ...)."""

    def __init__(self, status, body, retry_after_s):
        self.status = status
        self.body = body
        self.retry_after_s = retry_after_s

    def __getitem__(self, key):
        return self.body[key]

    def get(self, key, default=None):
        return self.body.get(key, default)

    @property
    def rejected(self):
        return self.status == 429

    @property
    def queued(self):
        return self.status == 202

    @property
    def ok(self):
        return self.status in (200, 202)

    @property
    def limiting_dimension(self):
        return self.body.get("limitingDimension")

    @property
    def state(self):
        return self.body.get("state")

    def __repr__(self):
        return f"Answer({self.status}, {self.body!r})"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class TallyClient:
    """One connection to an agent; not thread-safe (use one client per thread)."""

    def __init__(self, socket_path=DEFAULT_SOCKET, *, tcp=None, timeout_s=5.0, deadline_s=30.0,
                 backoff_first_s=0.05, backoff_max_s=2.0):
        """`tcp`: "HOST:PORT" instead of the Unix socket. `timeout_s`: one attempt;
        `deadline_s`: all attempts of one call (retries of unknown outcomes)."""
        self._socket_path = socket_path
        self._tcp = tcp
        self._timeout_s = timeout_s
        self._deadline_s = deadline_s
        self._backoff_first_s = backoff_first_s
        self._backoff_max_s = backoff_max_s
        self._connection = None

    # --- the protocol's verbs -------------------------------------------------------------

    def reserve(self, reservation_id, *, subject, route, units, region=None, priority=None,
                policy_generation=None, request_digest=None):
        body = {"reservationId": reservation_id, "subject": subject, "route": route,
                "units": units}
        if region is not None:
            body["region"] = region
        if priority is not None:
            body["priority"] = priority
        if policy_generation is not None:
            body["policyGeneration"] = policy_generation
        if request_digest is not None:
            body["requestDigest"] = request_digest
        return self._call("POST", "/v1/reservations", body)

    def start(self, reservation_id, *, operation_id):
        return self._call("POST", self._path(reservation_id, "start"),
                          {"operationId": operation_id})

    def settle(self, reservation_id, *, operation_id, actual_units):
        return self._call("POST", self._path(reservation_id, "settle"),
                          {"operationId": operation_id, "actualUnits": actual_units})

    def release(self, reservation_id):
        return self._call("POST", self._path(reservation_id, "release"), {})

    def mark_unknown(self, reservation_id, *, operation_id):
        return self._call("POST", self._path(reservation_id, "unknown"),
                          {"operationId": operation_id})

    def report(self, reservation_id, *, operation_id, actual_units):
        return self._call("POST", self._path(reservation_id, "report"),
                          {"operationId": operation_id, "actualUnits": actual_units})

    def extend(self, reservation_id, *, operation_id, reserved_units_total):
        """Streaming top-up: the STARTED reservation now holds `reserved_units_total` in all
        (a new total, so a retry never charges twice). A refusal is `Answer.rejected` (429,
        `retry_after_s`): stop the stream, or extend again later with the same total."""
        return self._call("POST", self._path(reservation_id, "extend"),
                          {"operationId": operation_id,
                           "reservedUnitsTotal": reserved_units_total})

    def query(self, reservation_id):
        return self._call("GET", self._path(reservation_id, None), None)

    def health(self):
        return self._call("GET", "/healthz", None)

    def ready(self):
        """True while the agent can reach its ledger (GET /readyz is 200)."""
        try:
            return self._call("GET", "/readyz", None).status == 200
        except TallyUnavailable:
            return False

    def close(self):
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- transport and retry rules --------------------------------------------------------

    @staticmethod
    def _path(reservation_id, verb):
        quoted = urllib.parse.quote(reservation_id, safe="")
        return f"/v1/reservations/{quoted}" + (f"/{verb}" if verb else "")

    def _connect(self):
        if self._connection is None:
            if self._tcp is not None:
                host, _, port = self._tcp.rpartition(":")
                self._connection = http.client.HTTPConnection(host.strip("[]"), int(port),
                                                              timeout=self._timeout_s)
            else:
                self._connection = _UnixConnection(self._socket_path, self._timeout_s)
        return self._connection

    def _attempt(self, method, path, payload):
        connection = self._connect()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        data = response.read()
        if response.getheader("Connection", "").lower() == "close":
            self.close()
        retry_after = response.getheader("Retry-After")
        try:
            body = json.loads(data) if data else {}
        except ValueError:
            body = {"error": True, "code": "BAD_ANSWER", "message": data[:200].decode(errors="replace")}
        return Answer(response.status, body, int(retry_after) if retry_after else None)

    def _call(self, method, path, body):
        payload = json.dumps(body).encode() if body is not None else None
        deadline = time.monotonic() + self._deadline_s
        backoff = self._backoff_first_s
        last = None
        while True:
            try:
                answer = self._attempt(method, path, payload)
            except (OSError, http.client.HTTPException) as error:
                # Sent or not, the outcome is unknown: the same request again (same id).
                self.close()
                last = TallyUnavailable(0, {"code": "UNAVAILABLE", "message": str(error)})
            else:
                if answer.status != 503:
                    # A reservation answer of any code (ok, queued, rejected, conflict, not
                    # found, ...) is the agent's word: the caller acts on it. An error object
                    # (a bad request, a refused peer, ...) will not change by retrying.
                    if answer.body.get("error") is True:
                        raise TallyError(answer.status, answer.body)
                    return answer
                last = TallyUnavailable(503, answer.body)
            now = time.monotonic()
            if now >= deadline:
                raise last
            time.sleep(min(backoff * random.uniform(0.5, 1.0), max(0.0, deadline - now)))
            backoff = min(backoff * 2, self._backoff_max_s)
