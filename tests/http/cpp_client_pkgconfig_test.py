"""clients/cpp as a gateway would use it: clients/cpp/example.cc compiled with nothing but
`pkg-config --cflags --libs tally-client` (this build tree's tally-client.pc), run against a real
agent and ledger.

Usage: cpp_client_pkgconfig_test.py BIN_DIR SOURCE_DIR PC_DIR CXX
"""

import os
import shlex
import subprocess
import sys
import tempfile
import unittest

BIN_DIR, SOURCE_DIR, PC_DIR, CXX = sys.argv[1:5]
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "support"))

from tally_procs import Cluster  # noqa: E402

POLICY = """
[[budget]]
subject = "tenant-1"
route = "chat"
unit = "tokens"
refill_per_second = 0
burst = 1000
max_single_reservation = 1000
hold_ttl_ms = 600000
hard_execution_limit_ms = 600000
"""


class CppClientPkgConfigTest(unittest.TestCase):
    def test_example_builds_from_pkg_config_and_runs_the_flow(self):
        env = dict(os.environ, PKG_CONFIG_PATH=PC_DIR)
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "tally-client"], env=env,
                               capture_output=True, text=True, check=True).stdout
        with tempfile.TemporaryDirectory() as work:
            program = os.path.join(work, "example")
            build = subprocess.run([CXX, os.path.join(SOURCE_DIR, "clients", "cpp", "example.cc"),
                                    "-o", program] + shlex.split(flags),
                                   capture_output=True, text=True, timeout=300)
            self.assertEqual(build.returncode, 0, build.stderr[-3000:])
            cluster = Cluster(BIN_DIR)
            try:
                cluster.start_ledger()
                cluster.publish_policy(text=POLICY)
                native, _ = cluster.start_agent()
                run = subprocess.run([program, native, "pc-1"], capture_output=True, text=True,
                                     timeout=60)
            finally:
                cluster.stop()
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("settle ok refunded 60", run.stdout)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
