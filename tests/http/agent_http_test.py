"""tally-agent's HTTP/1.1 + JSON socket end to end: a real ledger and a real agent, real HTTP
requests over the agent's Unix socket (and its loopback TCP listener).

Usage: agent_http_test.py BIN_DIR SOURCE_DIR
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

BIN_DIR, SOURCE_DIR = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "support"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "clients", "python"))

from tally_procs import Cluster  # noqa: E402
from tally_client import TallyClient  # noqa: E402

POLICY = """
[[budget]]
subject = "tenant-*"
route = "chat"
unit = "tokens"
refill_per_second = 1
burst = 1000
max_single_reservation = 1000
hold_ttl_ms = 600000
hard_execution_limit_ms = 600000
"""

TIMEOUT_S = 10.0


class Raw:
    """A bare HTTP connection over the Unix socket: sends bytes as given, reads responses."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(path)
        self.buffer = b""

    def send(self, data):
        self.sock.sendall(data)

    def response(self):
        """(status, headers dict, body bytes); None at EOF before a response."""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError("EOF inside a body")
            self.buffer += chunk
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, headers, body

    def closed_by_peer(self):
        """True if the agent closes this connection (EOF) before the timeout."""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buffer += chunk
        except (socket.timeout, ConnectionResetError):
            return False

    def close(self):
        self.sock.close()


def request(method, path, body=None, extra=b""):
    data = json.dumps(body).encode() if body is not None else b""
    return (f"{method} {path} HTTP/1.1\r\nHost: tally\r\nContent-Length: {len(data)}\r\n".encode()
            + extra + b"\r\n" + data)


class AgentHttpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(BIN_DIR)
        os.chmod(cls.cluster.root, 0o755)  # another uid may reach the socket (the 403 test)
        cls.cluster.start_ledger()
        cls.cluster.publish_policy(text=POLICY)
        cls.native, cls.http = cls.cluster.start_agent(
            extra_args=["--http", "127.0.0.1:0"], config='socket_mode = "0666"\n')
        match = re.search(r"event=http_listening .*tcp=127\.0\.0\.1:(\d+)", cls.cluster.log("agent"))
        cls.tcp_port = int(match.group(1)) if match else 0
        cls.client = TallyClient(cls.http, deadline_s=TIMEOUT_S)
        deadline = time.monotonic() + TIMEOUT_S
        while not cls.client.ready():
            if time.monotonic() > deadline:
                raise RuntimeError("agent never ready:\n" + cls.cluster.log("agent"))
            time.sleep(0.05)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.stop()

    def assertServing(self):
        """A fresh connection still gets answers."""
        with TallyClient(self.http, deadline_s=TIMEOUT_S) as fresh:
            self.assertEqual(fresh.health().status, 200)

    def test_reserve_start_settle_with_tallyctl_json(self):
        answer = self.client.reserve("flow-1", subject="tenant-a", route="chat", units=100)
        self.assertEqual(answer.status, 200, answer)
        # The reserve answer is the object `tallyctl --json reserve` prints: same fields.
        via_ctl = self.cluster.tallyctl("reserve", "--id", "flow-ctl", "--subject", "tenant-a",
                                        "--route", "chat", "--units", "100", agent=self.native)
        self.assertEqual(list(answer.body.keys()), list(via_ctl.keys()))
        self.assertEqual(answer["state"], "RESERVED")
        # The same reserve again is a duplicate with the original receipt.
        again = self.client.reserve("flow-1", subject="tenant-a", route="chat", units=100)
        self.assertTrue(again["duplicate"])
        self.assertEqual(again["expiresAtMs"], answer["expiresAtMs"])
        self.assertEqual(self.client.start("flow-1", operation_id="op-1")["state"], "STARTED")
        settled = self.client.settle("flow-1", operation_id="op-1", actual_units=40)
        self.assertEqual(settled["state"], "SETTLED")
        self.assertEqual(settled["refundedUnits"], 60)
        # GET is the same object tallyctl's query prints, byte for byte.
        raw = Raw(self.http)
        raw.send(request("GET", "/v1/reservations/flow-1"))
        status, _, body = raw.response()
        raw.close()
        self.assertEqual(status, 200)
        via_ctl = subprocess.run([os.path.join(BIN_DIR, "tallyctl"), "--json", "--agent",
                                  self.native, "query", "--id", "flow-1"],
                                 capture_output=True, timeout=30).stdout
        self.assertEqual(body, via_ctl)
        self.assertEqual(self.client.release("flow-ctl")["state"], "RELEASED")

    def test_rejection_is_429_with_retry_after_dimension_and_generation(self):
        first = self.client.reserve("big-1", subject="tenant-b", route="chat", units=1000)
        self.assertEqual(first.status, 200, first)
        raw = Raw(self.http)
        raw.send(request("POST", "/v1/reservations",
                         {"id": "big-2", "subject": "tenant-b", "route": "chat", "units": 500}))
        status, headers, body = raw.response()
        raw.close()
        self.assertEqual(status, 429)
        answer = json.loads(body)
        self.assertEqual(answer["limitingDimension"], "capacity")
        self.assertEqual(answer["policyGeneration"], first["policyGeneration"])
        # 500 units at 1 per second: Retry-After in whole seconds, rounded up.
        self.assertEqual(int(headers["retry-after"]), (answer["retryAfterMs"] + 999) // 1000)
        self.assertGreater(int(headers["retry-after"]), 0)
        self.client.release("big-1")

    def test_unknown_path_method_and_bad_json_are_4xx_on_a_kept_connection(self):
        raw = Raw(self.http)
        raw.send(request("GET", "/nope") + request("GET", "/v1/reservations")
                 + b"POST /v1/reservations HTTP/1.1\r\nContent-Length: 5\r\n\r\n{oops"
                 + request("POST", "/v1/reservations", {"id": "x", "units": -1})
                 + request("GET", "/healthz"))
        statuses = [raw.response()[0] for _ in range(5)]
        raw.close()
        self.assertEqual(statuses, [404, 405, 400, 400, 200])

    def test_pipelined_answers_come_back_in_order(self):
        raw = Raw(self.http)
        ids = [f"pipe-{i}" for i in range(20)]
        raw.send(b"".join(request("POST", "/v1/reservations",
                                  {"id": i, "subject": "tenant-p", "route": "chat", "units": 1})
                          for i in ids))
        got = [json.loads(raw.response()[2])["reservationId"] for _ in ids]
        raw.close()
        self.assertEqual(got, ids)
        for i in ids:
            self.client.release(i)

    def test_malformed_and_oversized_requests_get_4xx_and_the_agent_keeps_serving(self):
        cases = [
            (b"BLAH\x00\x01 / HTTP/1.1\r\n\r\n", 400),
            (b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 10000 + b"\r\n\r\n", 431),
            (b"POST /v1/reservations HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n", 413),
            (b"POST /v1/reservations HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
             + (b"8000\r\n" + b" " * 0x8000 + b"\r\n") * 3, 413),
            (b"GET /healthz HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400),
        ]
        for data, expected in cases:
            raw = Raw(self.http)
            try:
                raw.send(data)
            except (BrokenPipeError, ConnectionResetError):
                pass
            answer = raw.response()
            self.assertIsNotNone(answer, data[:40])
            self.assertEqual(answer[0], expected, data[:40])
            self.assertEqual(answer[1].get("connection"), "close")
            self.assertTrue(raw.closed_by_peer(), data[:40])
            raw.close()
            self.assertServing()

    def test_a_request_cut_short_is_not_answered_and_the_agent_keeps_serving(self):
        raw = Raw(self.http)
        raw.send(b"POST /v1/reservations HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"id\":")
        raw.sock.shutdown(socket.SHUT_WR)
        self.assertIsNone(raw.response())
        raw.close()
        self.assertServing()

    def test_a_peer_not_allowed_gets_403(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to connect as another uid")
        # An interpreter the other uid may run (a per-user install may not be).
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        script = ("import socket,sys\n"
                  "s=socket.socket(socket.AF_UNIX);s.connect(sys.argv[1])\n"
                  "s.sendall(sys.argv[2].encode())\n"
                  "sys.stdout.write(s.recv(4096).decode())\n")
        # A request, and bytes that are no HTTP at all: either way the refusal, nothing else.
        for payload in ("GET /healthz HTTP/1.1\r\n\r\n", "BLAH\x01 nonsense\r\n\r\n"):
            run = subprocess.run([python, "-c", script, self.http, payload], capture_output=True,
                                 text=True, timeout=30, user=65534, group=65534)
            self.assertTrue(run.stdout.startswith("HTTP/1.1 403 "), run.stdout + run.stderr)
            self.assertIn("PERMISSION_DENIED", run.stdout)
        self.assertServing()

    def test_loopback_tcp_listener_serves_the_same_api(self):
        self.assertGreater(self.tcp_port, 0, self.cluster.log("agent"))
        with TallyClient(tcp=f"127.0.0.1:{self.tcp_port}", deadline_s=TIMEOUT_S) as tcp:
            answer = tcp.reserve("tcp-1", subject="tenant-t", route="chat", units=5)
            self.assertEqual(answer.status, 200, answer)
            self.assertEqual(tcp.release("tcp-1")["state"], "RELEASED")

    def test_an_error_answer_with_the_body_unsent_reaches_a_tcp_peer_still_sending(self):
        # A 413 is decided from the headers; the client goes on sending its 4 MiB body, which
        # the agent never parses. Closed with that input unread, the socket would send RST and
        # the client could lose the answer; the lingering close reads it off until our EOF.
        self.assertGreater(self.tcp_port, 0, self.cluster.log("agent"))
        body_bytes = 4 << 20
        sock = socket.create_connection(("127.0.0.1", self.tcp_port), timeout=TIMEOUT_S)
        errors = []

        def send_all():
            try:
                sock.sendall(b"POST /v1/reservations HTTP/1.1\r\nHost: tally\r\n"
                             + f"Content-Length: {body_bytes}\r\n\r\n".encode())
                chunk = b"x" * 65536
                for _ in range(body_bytes // len(chunk)):
                    sock.sendall(chunk)
                sock.shutdown(socket.SHUT_WR)
            except OSError as error:
                errors.append(error)

        sender = threading.Thread(target=send_all)
        sender.start()
        received = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
        except OSError as error:
            errors.append(error)
        sender.join(TIMEOUT_S)
        sock.close()
        self.assertFalse(sender.is_alive())
        self.assertTrue(received.startswith(b"HTTP/1.1 413 "), (received[:80], errors))
        self.assertIn(b"BODY_TOO_LARGE", received)
        self.assertEqual(errors, [])  # no reset on either side: the agent read to our EOF
        self.assertServing()

    def test_zz_ledger_gone_start_is_503_retry_same_id_and_settle_is_queued(self):
        # Last (zz): it kills the ledger.
        self.assertEqual(
            self.client.reserve("gone-1", subject="tenant-g", route="chat", units=5).status, 200)
        self.assertEqual(
            self.client.reserve("gone-2", subject="tenant-g", route="chat", units=5).status, 200)
        self.assertEqual(self.client.start("gone-2", operation_id="op").status, 200)
        self.cluster.processes[0].send_signal(signal.SIGKILL)
        self.cluster.processes[0].wait()
        raw = Raw(self.http)
        raw.send(request("POST", "/v1/reservations/gone-1/start", {"operationId": "op"}))
        status, headers, body = raw.response()
        self.assertEqual(status, 503, body)
        self.assertEqual(json.loads(body)["retry"], "retry with the same id")
        self.assertIn("retry-after", headers)
        raw.send(request("POST", "/v1/reservations/gone-2/settle",
                         {"operationId": "op", "actualUnits": 3}))
        status, _, body = raw.response()
        self.assertEqual(status, 202, body)  # durably in the outbox
        self.assertEqual(json.loads(body)["code"], "QUEUED")
        raw.send(request("GET", "/readyz"))
        self.assertEqual(raw.response()[0], 503)
        raw.close()


class AgentHttpTimeoutTest(unittest.TestCase):
    """A small http_header_timeout_ms / http_idle_timeout_ms: silent and trickling
    connections are closed, a client that keeps asking keeps being served."""

    TIMEOUT_MS = 400

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(BIN_DIR)
        cls.cluster.start_ledger()
        cls.cluster.publish_policy(text=POLICY)
        cls.native, cls.http = cls.cluster.start_agent(
            config=f"http_header_timeout_ms = {cls.TIMEOUT_MS}\n"
                   f"http_idle_timeout_ms = {cls.TIMEOUT_MS}\n")
        deadline = time.monotonic() + TIMEOUT_S
        with TallyClient(cls.http, deadline_s=TIMEOUT_S) as client:
            while not client.ready():
                if time.monotonic() > deadline:
                    raise RuntimeError("agent never ready:\n" + cls.cluster.log("agent"))
                time.sleep(0.05)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def wait_for_log(self, needle):
        deadline = time.monotonic() + TIMEOUT_S
        while needle not in self.cluster.log("agent"):
            self.assertLess(time.monotonic(), deadline, needle)
            time.sleep(0.05)

    def test_silent_and_idle_connections_are_closed_while_a_busy_one_is_served(self):
        silent = Raw(self.http)  # never sends a byte
        idle = Raw(self.http)  # one request, then nothing
        idle.send(request("GET", "/healthz"))
        self.assertEqual(idle.response()[0], 200)
        busy = Raw(self.http)
        started = time.monotonic()
        served = 0
        # The busy client asks more often than the timeout, on one kept connection, until the
        # other two are closed (bounded by TIMEOUT_S inside closed_by_peer's socket timeout).
        silent.sock.settimeout(0.05)
        idle.sock.settimeout(0.05)
        silent_closed = idle_closed = False
        while not (silent_closed and idle_closed):
            self.assertLess(time.monotonic() - started, TIMEOUT_S, "never closed")
            busy.send(request("GET", "/healthz"))
            answer = busy.response()
            self.assertIsNotNone(answer, self.cluster.log("agent")[-2000:])
            self.assertEqual(answer[0], 200)
            served += 1
            silent_closed = silent_closed or silent.closed_by_peer()
            idle_closed = idle_closed or idle.closed_by_peer()
        elapsed_s = time.monotonic() - started
        self.assertGreaterEqual(elapsed_s, self.TIMEOUT_MS / 1000 * 0.5)
        self.assertGreater(served, 1)
        # Still served after the others' timeouts: its gaps were shorter than the idle bound.
        busy.send(request("GET", "/healthz"))
        self.assertEqual(busy.response()[0], 200)
        for raw in (silent, idle, busy):
            raw.close()
        self.wait_for_log("no request within header_timeout_ms")
        self.wait_for_log("idle above idle_timeout_ms")

    def test_a_request_trickled_in_is_closed_at_the_header_timeout(self):
        raw = Raw(self.http)
        raw.send(b"GET /healthz HTTP/1.1\r\n")
        raw.sock.settimeout(0.1)
        started = time.monotonic()
        closed = False
        while not closed:
            # A header byte more often than the timeout does not extend it.
            self.assertLess(time.monotonic() - started, TIMEOUT_S, "never closed")
            try:
                raw.send(b"X")
            except (BrokenPipeError, ConnectionResetError):
                break
            closed = raw.closed_by_peer()
        self.assertEqual(raw.buffer, b"")  # closed without an answer
        raw.close()
        self.wait_for_log("request not complete within header_timeout_ms")


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
