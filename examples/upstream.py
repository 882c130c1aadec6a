#!/usr/bin/env python3
"""A tiny HTTPS upstream for trying the sidecar by hand: it prints each request's headers on its own
terminal (what really arrived upstream) and answers 200 "ok". Usage: upstream.py CERT KEY PORT"""
import http.server
import ssl
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self):
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        print(f"upstream got {self.command} {self.path}", flush=True)
        for name, value in self.headers.items():
            print(f"  {name}: {value}", flush=True)
        body = b"ok\n"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args):
        pass


cert, key, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
server.serve_forever()
