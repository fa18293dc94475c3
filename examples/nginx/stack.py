"""The examples/nginx stack: tally-ledger, tally-agent, the fake LLM upstream and nginx, each a
child process under one temp dir, stopped by pid. Used by `run` and by the test.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

EXAMPLE_DIR = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(os.path.dirname(EXAMPLE_DIR))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "support"))

from tally_procs import Cluster  # noqa: E402

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
START_TIMEOUT_S = 20.0


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Stack:
    def __init__(self, bin_dir, policy):
        self.cluster = Cluster(bin_dir)
        self.root = self.cluster.root
        self.policy = policy
        self.nginx = None
        self.port = None

    def start(self):
        os.chmod(self.root, 0o755)
        self.cluster.start_ledger()
        self.cluster.publish_policy(text=self.policy)
        self.native_socket, self.http_socket = self.cluster.start_agent()
        _, ready = self.cluster.spawn([sys.executable, os.path.join(EXAMPLE_DIR, "upstream.py")],
                                      "upstream.log", "upstream")
        self.upstream_port = int(ready[1])
        self.start_nginx()
        return self

    def start_nginx(self):
        prefix = os.path.join(self.root, "nginx")
        os.makedirs(prefix, exist_ok=True)
        self.port = free_port()
        user = "user root root;" if os.geteuid() == 0 else ""
        with open(os.path.join(EXAMPLE_DIR, "nginx.conf.in")) as template:
            conf = template.read()
        for key, value in {"@PREFIX@": prefix, "@USER@": user, "@EXAMPLE_DIR@": EXAMPLE_DIR,
                           "@AGENT_HTTP_SOCKET@": self.http_socket, "@PORT@": str(self.port),
                           "@UPSTREAM_PORT@": str(self.upstream_port)}.items():
            conf = conf.replace(key, value)
        conf_path = os.path.join(prefix, "nginx.conf")
        with open(conf_path, "w") as out:
            out.write(conf)
        with open(os.path.join(self.root, "nginx.log"), "ab") as log:
            self.nginx = subprocess.Popen([NGINX, "-p", prefix, "-e", prefix + "/error.log", "-c",
                                           conf_path], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.nginx.poll() is not None:
                raise RuntimeError("nginx exited: " + self.log("nginx/error.log")[-2000:])
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("nginx not listening: " + self.log("nginx/error.log"))
                time.sleep(0.02)

    def log(self, name):
        try:
            with open(os.path.join(self.root, name)) as log:
                return log.read()
        except OSError:
            return ""

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self):
        if self.nginx is not None and self.nginx.poll() is None:
            self.nginx.send_signal(signal.SIGQUIT)  # graceful, by pid
            try:
                self.nginx.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.nginx.kill()
                self.nginx.wait()
        self.cluster.stop()
