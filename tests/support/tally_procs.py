"""Real tally-ledger and tally-agent processes for Python tests (HTTP interface, Python client,
nginx example): started on a temp dir, waited for on their --ready-fd line, stopped by pid.

Standard library only. Every wait has a deadline; nothing sleeps to synchronise.
"""

import json
import os
import select
import signal
import subprocess
import tempfile
import time

READY_TIMEOUT_S = 20.0

TEST_POLICY = """
[[budget]]
subject = "tenant-*"
route = "chat"
unit = "tokens"
refill_per_second = 0
burst = {burst}
max_single_reservation = {burst}
hold_ttl_ms = 600000
hard_execution_limit_ms = 600000
"""


def _read_ready(read_fd, process, what):
    deadline = time.monotonic() + READY_TIMEOUT_S
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError(f"{what} not ready within {READY_TIMEOUT_S} s")
        ready, _, _ = select.select([read_fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(read_fd, 256)
        if not chunk:
            raise RuntimeError(f"{what} exited before ready (code {process.poll()})")
        line += chunk
    os.close(read_fd)
    return line.decode().split()


class Cluster:
    """One ledger and any number of agents under one temp dir."""

    def __init__(self, bin_dir, root=None):
        self.bin_dir = bin_dir
        self._tmp = None
        if root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tally-py-")
            root = self._tmp.name
        self.root = root
        self.processes = []
        self.ledger_port = None
        self.agents = []

    def binary(self, name):
        return os.path.join(self.bin_dir, name)

    def _spawn(self, name, args, log):
        return self.spawn([self.binary(name)] + args, log, name)

    def spawn(self, argv, log, what):
        """Runs argv + ["--ready-fd", N] and waits for its "ready ..." line (returned split)."""
        read_fd, write_fd = os.pipe()
        with open(os.path.join(self.root, log), "ab") as out:
            process = subprocess.Popen(argv + ["--ready-fd", str(write_fd)], stdout=out,
                                       stderr=subprocess.STDOUT, pass_fds=(write_fd,))
        os.close(write_fd)
        self.processes.append(process)
        return process, _read_ready(read_fd, process, what)

    def start_ledger(self):
        _, ready = self._spawn("tally-ledger",
                               ["--data-dir", os.path.join(self.root, "ledger"),
                                "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
                                "--insecure"],
                               "ledger.log")
        self.ledger_port = int(ready[1])
        return self.ledger_port

    def ledger_address(self):
        return f"127.0.0.1:{self.ledger_port}"

    def start_agent(self, name="agent", extra_args=(), config=""):
        """Returns (native socket path, HTTP socket path)."""
        socket_path = os.path.join(self.root, f"{name}.sock")
        config_path = os.path.join(self.root, f"{name}.toml")
        with open(config_path, "w") as out:
            out.write("policy_refresh_ms = 100\nrequest_timeout_ms = 1000\n" + config)
        process, _ = self._spawn("tally-agent",
                                 ["--data-dir", os.path.join(self.root, name),
                                  "--ledger", self.ledger_address(), "--socket", socket_path,
                                  "--config", config_path, "--metrics", "", "--insecure"]
                                 + list(extra_args),
                                 f"{name}.log")
        http_path = os.path.join(self.root, f"{name}-http.sock")
        self.agents.append(process)
        return socket_path, http_path

    def tallyctl(self, *args, agent=None, check=True):
        target = ["--agent", agent] if agent else ["--ledger", self.ledger_address(), "--insecure"]
        run = subprocess.run([self.binary("tallyctl"), "--json"] + target + list(args),
                             capture_output=True, text=True, timeout=30)
        if check and run.returncode not in (0, 4):
            raise RuntimeError(f"tallyctl {args}: exit {run.returncode}: {run.stdout}{run.stderr}")
        return json.loads(run.stdout)

    def publish_policy(self, burst=1000, text=None):
        path = os.path.join(self.root, "policy.toml")
        with open(path, "w") as out:
            out.write(text if text is not None else TEST_POLICY.format(burst=burst))
        return self.tallyctl("policy", "publish", path)

    def log(self, name):
        try:
            with open(os.path.join(self.root, f"{name}.log")) as log:
                return log.read()
        except OSError:
            return ""

    def stop(self):
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
