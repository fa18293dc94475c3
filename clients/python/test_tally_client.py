"""tally_client against a real tally-agent (and ledger), plus its retry rules against a socket
that answers 503 first.

Usage: test_tally_client.py BIN_DIR SOURCE_DIR
"""

import json
import os
import socket
import sys
import threading
import time
import unittest

BIN_DIR, SOURCE_DIR = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "support"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tally_procs import Cluster  # noqa: E402
from tally_client import TallyClient, TallyError, TallyUnavailable  # noqa: E402

POLICY = """
[[budget]]
subject = "tenant-*"
route = "chat"
unit = "tokens"
refill_per_second = 10
burst = 1000
max_single_reservation = 1000
hold_ttl_ms = 600000
hard_execution_limit_ms = 600000
"""


class AgainstARealAgent(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(BIN_DIR)
        cls.cluster.start_ledger()
        cls.cluster.publish_policy(text=POLICY)
        cls.native, cls.http = cls.cluster.start_agent()
        cls.tally = TallyClient(cls.http, deadline_s=10)
        deadline = time.monotonic() + 10
        while not cls.tally.ready():
            if time.monotonic() > deadline:
                raise RuntimeError("agent never ready:\n" + cls.cluster.log("agent"))
            time.sleep(0.05)

    @classmethod
    def tearDownClass(cls):
        cls.tally.close()
        cls.cluster.stop()

    def test_reserve_start_settle_refunds_the_unused_part(self):
        answer = self.tally.reserve("py-1", subject="tenant-a", route="chat", units=300)
        self.assertTrue(answer.ok, answer)
        self.assertEqual(answer.state, "RESERVED")
        self.assertEqual(answer["reservedUnits"], 300)
        self.assertEqual(self.tally.start("py-1", operation_id="op-1").state, "STARTED")
        settled = self.tally.settle("py-1", operation_id="op-1", actual_units=120)
        self.assertEqual(settled.state, "SETTLED")
        self.assertEqual(settled["refundedUnits"], 180)
        # A retried settle is a duplicate: nothing refunded twice.
        again = self.tally.settle("py-1", operation_id="op-1", actual_units=120)
        self.assertTrue(again["duplicate"])
        self.assertEqual(again["refundedUnits"], 0)
        self.assertEqual(self.tally.query("py-1")["actualUnits"], 120)

    def test_extend_grows_a_started_reservation_and_a_refusal_is_a_429(self):
        self.assertTrue(self.tally.reserve("py-x2", subject="tenant-x", route="chat",
                                           units=100).ok)
        self.assertTrue(self.tally.reserve("py-x", subject="tenant-x", route="chat",
                                           units=300).ok)
        self.assertEqual(self.tally.extend("py-x", operation_id="op-x",
                                           reserved_units_total=500).status, 409)  # not started
        self.tally.start("py-x", operation_id="op-x")
        grown = self.tally.extend("py-x", operation_id="op-x", reserved_units_total=800)
        self.assertTrue(grown.ok, grown)
        self.assertEqual(grown["reservedUnits"], 800)
        again = self.tally.extend("py-x", operation_id="op-x", reserved_units_total=800)
        self.assertTrue(again["duplicate"])
        # 200 more where about 100 are available (refill earns 10/s): 429 with Retry-After, and
        # the reservation keeps its 800.
        refused = self.tally.extend("py-x", operation_id="op-x", reserved_units_total=1000)
        self.assertEqual(refused.status, 429, refused)
        self.assertEqual(refused.limiting_dimension, "capacity")
        self.assertGreaterEqual(refused.retry_after_s, 1)
        self.assertEqual(refused["reservedUnits"], 800)
        settled = self.tally.settle("py-x", operation_id="op-x", actual_units=750)
        self.assertEqual(settled.state, "SETTLED")
        self.assertEqual(settled["refundedUnits"], 50)
        self.assertEqual(self.tally.release("py-x2").state, "RELEASED")

    def test_rejection_comes_back_with_retry_after_and_dimension(self):
        self.assertTrue(self.tally.reserve("py-big", subject="tenant-r", route="chat",
                                           units=1000).ok)
        rejected = self.tally.reserve("py-over", subject="tenant-r", route="chat", units=500)
        self.assertTrue(rejected.rejected)
        self.assertEqual(rejected.limiting_dimension, "capacity")
        self.assertGreaterEqual(rejected.retry_after_s, 1)
        self.assertEqual(self.tally.release("py-big").state, "RELEASED")

    def test_unknown_ids_and_bad_requests(self):
        self.assertEqual(self.tally.query("py-never").status, 404)
        with self.assertRaises(TallyError) as caught:
            self.tally.reserve("x" * 200, subject="tenant-a", route="chat", units=1)
        self.assertEqual(caught.exception.status, 400)
        self.assertEqual(self.tally.health()["status"], "HEALTHY")

    def test_mark_unknown_then_report(self):
        self.assertTrue(self.tally.reserve("py-u", subject="tenant-u", route="chat", units=50).ok)
        self.tally.start("py-u", operation_id="op-u")
        self.assertEqual(self.tally.mark_unknown("py-u", operation_id="op-u").state,
                         "USAGE_UNKNOWN")
        self.assertEqual(self.tally.report("py-u", operation_id="op-u", actual_units=50).state,
                         "SETTLED")


class Flaky:
    """An HTTP server on a Unix socket answering 503 `failures` times, then 200; records every
    request body it got."""

    def __init__(self, path, failures):
        self.bodies = []
        self.failures = failures
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(8)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with connection:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += connection.recv(4096)
                head, body = data.split(b"\r\n\r\n", 1)
                length = int([l for l in head.decode().split("\r\n")
                              if l.lower().startswith("content-length")][0].split(":")[1])
                while len(body) < length:
                    body += connection.recv(4096)
                self.bodies.append(json.loads(body))
                if len(self.bodies) <= self.failures:
                    answer = b'{"error":true,"code":"UNAVAILABLE","message":"outcome unknown"}'
                    status = b"503 Service Unavailable"
                else:
                    answer = b'{"code":"OK","reservationId":"same","state":"RESERVED"}'
                    status = b"200 OK"
                connection.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: "
                                   + str(len(answer)).encode() + b"\r\nConnection: close\r\n\r\n"
                                   + answer)

    def close(self):
        self.listener.close()


class RetryRules(unittest.TestCase):
    def setUp(self):
        self.cluster = Cluster(BIN_DIR)  # only for its temp dir
        self.path = os.path.join(self.cluster.root, "flaky.sock")

    def tearDown(self):
        self.cluster.stop()

    def test_an_unknown_outcome_is_retried_with_the_same_id_and_fields(self):
        flaky = Flaky(self.path, failures=3)
        try:
            client = TallyClient(self.path, deadline_s=10, backoff_first_s=0.01)
            answer = client.reserve("same", subject="tenant-a", route="chat", units=7)
        finally:
            flaky.close()
        self.assertEqual(answer.status, 200)
        self.assertEqual(len(flaky.bodies), 4)
        self.assertTrue(all(body == flaky.bodies[0] for body in flaky.bodies), flaky.bodies)
        self.assertEqual(flaky.bodies[0]["reservationId"], "same")

    def test_no_definitive_answer_by_the_deadline_raises_unavailable(self):
        flaky = Flaky(self.path, failures=1_000_000)
        try:
            client = TallyClient(self.path, deadline_s=0.3, backoff_first_s=0.01)
            with self.assertRaises(TallyUnavailable):
                client.start("same", operation_id="op")
        finally:
            flaky.close()
        self.assertGreater(len(flaky.bodies), 1)

    def test_a_missing_socket_is_retried_until_the_deadline(self):
        client = TallyClient(os.path.join(self.cluster.root, "absent.sock"), deadline_s=0.2,
                             backoff_first_s=0.01)
        with self.assertRaises(TallyUnavailable):
            client.health()


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
