#!/usr/bin/env python3
"""A fake streaming LLM upstream for examples/nginx (standard library only).

POST (or GET) any path: answers 200 with `x-usage-tokens: N` (the tokens it will have
consumed) and streams N small chunks ("token 1\n", ...), flushed one by one. Query parameters:

  tokens=N   usage to report and chunks to stream (default 20)
  fail=early close the connection before any response byte (an upstream failure before the
             work started)
  fail=mid   announce usage, stream half, then close the connection without the last chunk
             (the upstream died mid-stream: the usage is unknown)

Usage: upstream.py --ready-fd FD   binds 127.0.0.1:0 and writes "ready PORT\n" to FD.
It counts what it served in GET /stats: {"requests": N, "tokens_streamed": T}.
"""

import http.server
import json
import os
import socket
import sys
import threading
import urllib.parse

STATS = {"requests": 0, "tokens_streamed": 0}
LOCK = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/stats":
            with LOCK:
                body = json.dumps(STATS).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.generate()

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.generate()

    def generate(self):
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        tokens = int(query.get("tokens", ["20"])[0])
        fail = query.get("fail", [""])[0]
        with LOCK:
            STATS["requests"] += 1
        if fail == "early":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
            self.close_connection = True
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-usage-tokens", str(tokens))
        self.end_headers()
        stream = tokens // 2 if fail == "mid" else tokens
        for i in range(stream):
            chunk = f"token {i + 1}\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
            with LOCK:
                STATS["tokens_streamed"] += 1
        if fail == "mid":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       b"\x01\x00\x00\x00\x00\x00\x00\x00")
            self.close_connection = True
            return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if len(sys.argv) != 3 or sys.argv[1] != "--ready-fd":
        sys.exit("usage: upstream.py --ready-fd FD")
    ready_fd = int(sys.argv[2])
    os.write(ready_fd, f"ready {server.server_address[1]}\n".encode())
    os.close(ready_fd)
    server.serve_forever()


if __name__ == "__main__":
    main()
