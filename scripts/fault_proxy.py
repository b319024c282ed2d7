#!/usr/bin/env python3
"""An HTTP proxy that injects the faults of a cloud service between an AWS
SDK client and a local stand-in (moto, kinesalite): throttling answers,
server errors after the request was applied, dropped connections, and
delays. Tests point a client's endpoint (AWS_ENDPOINT_URL...) here.

    fault_proxy.py --target http://127.0.0.1:PORT [--seed N]
        [--match REGEX]        requests faulted: the X-Amz-Target header
                               or "METHOD path" matches (default: all)
        [--throttle P]         answer the service's throttling error, unapplied
        [--after P]            forward, then answer a 500 (applied, reported failed)
        [--drop P]             close the connection without an answer, unapplied
        [--delay-ms N]         delay each faulted request by up to N ms
        [--burst-every S --burst-secs D]
                               throttle every matching request for D of every S
                               seconds (past the SDK's own retries)
        [--burst-until S]      no bursts from S seconds on
        [--stall-after S]      from S seconds on, matching requests get no answer
                               (the service stalls; the client's deadlines fire)
        [--stats FILE]         counts of what was injected, as JSON, kept current

Prints "listening PORT" once it accepts connections. Standard library only.
"""
import argparse
import http.client
import http.server
import json
import random
import re
import sys
import threading
import time
import urllib.parse

LOCK = threading.Lock()
STATS = {"requests": 0, "throttled": 0, "after": 0, "dropped": 0, "delayed": 0, "burst": 0, "stalled": 0}


def count(kind, args):
    with LOCK:
        STATS[kind] += 1
        if args.stats:
            with open(args.stats + ".tmp", "w") as f:
                json.dump(STATS, f)
            import os

            os.replace(args.stats + ".tmp", args.stats)


def service_error(target, status_hint):
    """(status, headers, body) of a throttling (429-ish) or internal error
    (500) in the protocol of the service the request went to."""
    throttle = status_hint == "throttle"
    if target.startswith("Kinesis_"):
        kind = "ProvisionedThroughputExceededException" if throttle else "InternalFailure"
        return (400 if throttle else 500), {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(
            {"__type": kind, "message": "injected by fault_proxy"}
        ).encode()
    if target.startswith("DynamoDB_"):
        kind = "ThrottlingException" if throttle else "InternalServerError"
        return (400 if throttle else 500), {"Content-Type": "application/x-amz-json-1.0"}, json.dumps(
            {"__type": "com.amazonaws.dynamodb.v20120810#" + kind, "message": "injected by fault_proxy"}
        ).encode()
    if target == "lambda":
        kind = "TooManyRequestsException" if throttle else "ServiceException"
        return (429 if throttle else 500), {
            "Content-Type": "application/json",
            "x-amzn-ErrorType": kind,
        }, json.dumps({"Type": "User", "message": "injected by fault_proxy"}).encode()
    code = "SlowDown" if throttle else "InternalError"
    body = f"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code><Message>injected by fault_proxy</Message></Error>"
    return (503 if throttle else 500), {"Content-Type": "application/xml"}, body.encode()


def make_handler(args, rng):
    target = urllib.parse.urlparse(args.target)
    matcher = re.compile(args.match) if args.match else None
    started = time.monotonic()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):
            pass

        def body(self):
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().strip().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))

        def answer(self, status, headers, body):
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def forward(self, body):
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "connection", "content-length")}
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            out = [(k, v) for k, v in r.getheaders() if k.lower() not in ("transfer-encoding", "connection", "content-length")]
            conn.close()
            return r.status, out, data

        def handle_one(self):
            body = self.body()
            amz = self.headers.get("X-Amz-Target", "")
            service = amz or ("lambda" if self.path.startswith("/2015-03-31/functions") else "s3")
            key = amz or f"{self.command} {urllib.parse.urlparse(self.path).path}"
            faulted = matcher is None or matcher.search(key) is not None
            count("requests", args)
            with LOCK:
                roll = rng.random()
                delay = rng.random() * args.delay_ms / 1000.0
            if faulted and args.stall_after is not None and time.monotonic() - started >= args.stall_after:
                count("stalled", args)
                time.sleep(3600)
                return
            elapsed = time.monotonic() - started
            if faulted and args.burst_every > 0 and (args.burst_until is None or elapsed < args.burst_until):
                if elapsed % args.burst_every < args.burst_secs:
                    count("burst", args)
                    self.answer(*service_error(service, "throttle"))
                    return
            if faulted and args.delay_ms > 0:
                count("delayed", args)
                time.sleep(delay)
            if faulted and roll < args.drop:
                count("dropped", args)
                self.close_connection = True
                self.connection.shutdown(2)
                return
            roll -= args.drop if faulted else 0
            if faulted and roll < args.throttle:
                count("throttled", args)
                self.answer(*service_error(service, "throttle"))
                return
            roll -= args.throttle if faulted else 0
            status, headers, data = self.forward(body)
            if faulted and roll < args.after:
                count("after", args)
                self.answer(*service_error(service, "internal"))
                return
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = handle_one

    return Handler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--match")
    p.add_argument("--throttle", type=float, default=0.0)
    p.add_argument("--after", type=float, default=0.0)
    p.add_argument("--drop", type=float, default=0.0)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--burst-every", type=float, default=0.0)
    p.add_argument("--burst-secs", type=float, default=0.0)
    p.add_argument("--burst-until", type=float)
    p.add_argument("--stall-after", type=float)
    p.add_argument("--stats")
    args = p.parse_args()
    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            # A client that hung up (a killed process, a timed-out call)
            # is no error of the proxy's.
            if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", args.port), make_handler(args, random.Random(args.seed)))
    server.daemon_threads = True
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
