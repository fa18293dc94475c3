"""examples/nginx end to end: real nginx (Debian's, with libnginx-mod-http-lua) in front of the
fake streaming upstream, reserving through a real tally-agent and ledger.

Checks: a completed stream is settled at the usage the upstream reported (the rest refunded,
visible in `tallyctl audit`); an upstream failure before start is released; an upstream dying
mid-stream is marked unknown; an exhausted budget is 429 with Retry-After; a client retrying
with the same Idempotency-Key is not charged twice; concurrent clients; conservation.

Usage: nginx_test.py BIN_DIR        (exit 77: nginx or its Lua module is not installed)
"""

import concurrent.futures
import os
import sys
import time
import unittest
import urllib.error
import urllib.request

EXAMPLE_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, EXAMPLE_DIR)

from stack import NGINX, Stack  # noqa: E402

BIN_DIR = sys.argv[1] if len(sys.argv) > 1 else ""
WAIT_S = 15.0

# t-ex refills (1 token/s) so its rejection names a time; every other tenant never refills, so
# its balances are exact sums.
POLICY = """
[[budget]]
subject = "t-ex"
route = "chat"
unit = "tokens"
refill_per_second = 1
burst = 1000
max_single_reservation = 1000
hold_ttl_ms = 600000
hard_execution_limit_ms = 600000

[[budget]]
subject = "t-*"
route = "chat"
unit = "tokens"
refill_per_second = 0
burst = 10000
max_single_reservation = 1000
hold_ttl_ms = 600000
hard_execution_limit_ms = 600000
"""


def fetch(stack, query, tenant, estimate, key=None):
    """(status, headers, body bytes, complete): complete is False for a truncated stream."""
    headers = {"X-Tenant": tenant, "X-Max-Tokens": str(estimate)}
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(stack.url("/v1/chat?" + query), headers=headers,
                                     method="POST", data=b'{"prompt":"hi"}')
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            try:
                return response.status, response.headers, response.read(), True
            except Exception:  # http.client.IncompleteRead: the stream was cut
                return response.status, response.headers, b"", False
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read(), True


class NginxExampleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stack = Stack(BIN_DIR, POLICY).start()

    @classmethod
    def tearDownClass(cls):
        cls.stack.stop()

    def query(self, key):
        return self.stack.cluster.tallyctl("query", "--id", "nginx:" + key, check=False)

    def wait_state(self, key, states):
        """The reservation once it is in one of `states` (the follow-ups run after the
        response, in nginx timers)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            answer = self.query(key)
            if answer.get("state") in states:
                return answer
            if time.monotonic() > deadline:
                self.fail(f"{key}: {answer} never reached {states}\n"
                          + self.stack.log("nginx/error.log")[-3000:])
            time.sleep(0.02)

    def account(self, tenant):
        audit = self.stack.cluster.tallyctl("audit", "--subject", tenant, "--route", "chat")
        accounts = [a for a in audit["accounts"] if a["subject"] == tenant]
        self.assertEqual(len(accounts), 1, audit)
        return audit, accounts[0]

    def test_completed_stream_is_settled_at_reported_usage_and_the_rest_refunded(self):
        status, headers, body, complete = fetch(self.stack, "tokens=30", "t-done", 100, "done-1")
        self.assertEqual(status, 200)
        self.assertTrue(complete)
        self.assertEqual(body.count(b"token "), 30)
        settled = self.wait_state("done-1", {"SETTLED"})
        self.assertEqual(settled["actualUnits"], 30)
        self.assertEqual(settled["refundedUnits"], 70)
        _, account = self.account("t-done")
        self.assertEqual(account["spent"], 30)
        self.assertEqual(account["reserved"], 0)
        self.assertEqual(account["available"], 10000 - 30)  # the 70 came back

    def test_upstream_failure_before_start_is_released(self):
        status, _, _, _ = fetch(self.stack, "fail=early", "t-early", 200, "early-1")
        self.assertEqual(status, 502)
        released = self.wait_state("early-1", {"RELEASED"})
        self.assertEqual(released["refundedUnits"], 200)
        _, account = self.account("t-early")
        self.assertEqual((account["spent"], account["reserved"], account["available"]),
                         (0, 0, 10000))

    def test_upstream_dying_mid_stream_is_marked_unknown(self):
        status, _, _, complete = fetch(self.stack, "fail=mid&tokens=20", "t-mid", 100, "mid-1")
        self.assertEqual(status, 200)
        self.assertFalse(complete)
        unknown = self.wait_state("mid-1", {"USAGE_UNKNOWN"})
        self.assertEqual(unknown["operationId"], "nginx:mid-1")
        _, account = self.account("t-mid")
        self.assertEqual(account["reserved"], 100)  # held until a report or the hard limit

    def test_exhausted_budget_is_429_with_retry_after(self):
        for i in range(2):
            status, _, _, _ = fetch(self.stack, "tokens=450", "t-ex", 450, f"ex-{i}")
            self.assertEqual(status, 200)
            self.wait_state(f"ex-{i}", {"SETTLED"})
        status, headers, body, _ = fetch(self.stack, "tokens=10", "t-ex", 400, "ex-2")
        self.assertEqual(status, 429, body)
        retry_after = int(headers["Retry-After"])
        self.assertGreater(retry_after, 0)
        self.assertIn(b'"limitingDimension":"capacity"', body)
        self.assertIn(b'"policyGeneration"', body)

    def test_a_client_retry_with_the_same_key_is_not_charged_twice(self):
        first = fetch(self.stack, "tokens=40", "t-retry", 100, "retry-1")
        self.assertEqual(first[0], 200)
        self.wait_state("retry-1", {"SETTLED"})
        again = fetch(self.stack, "tokens=40", "t-retry", 100, "retry-1")
        self.assertEqual(again[0], 409, again[2])  # already served: not run, not charged
        self.assertIn(b'"duplicate":true', again[2])
        _, account = self.account("t-retry")
        self.assertEqual(account["spent"], 40)
        self.assertEqual(account["available"], 10000 - 40)

    def test_concurrent_clients_conserve(self):
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(
                lambda i: fetch(self.stack, f"tokens={10 + i}", "t-conc", 50, f"conc-{i}"),
                range(16)))
        self.assertEqual([r[0] for r in results], [200] * 16)
        for i in range(16):
            self.wait_state(f"conc-{i}", {"SETTLED"})
        audit, account = self.account("t-conc")
        self.assertEqual(account["spent"], sum(10 + i for i in range(16)))
        self.assertEqual(account["reserved"], 0)
        self.assertTrue(account["conserved"])
        self.assertTrue(audit["conservation"], audit)

    def test_zz_the_whole_ledger_conserves(self):
        audit = self.stack.cluster.tallyctl("audit")
        self.assertTrue(audit["conservation"], audit)
        self.assertEqual(audit["violations"], [])


if __name__ == "__main__":
    if not os.path.exists(NGINX) or not os.path.exists("/usr/lib/nginx/modules/ngx_http_lua_module.so"):
        print("nginx or libnginx-mod-http-lua not installed: skipped")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1], verbosity=2)
