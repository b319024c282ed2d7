"""A local stand-in for S3, DynamoDB and Kinesis (moto) that applies one
request at a time, so that DynamoDB's condition check and write are atomic
with respect to other requests (moto's stock server is threaded and its
DynamoDB backend takes no lock). Each connection has a thread of its own
that reads the whole request before it takes the lock and writes the
answer after it let go: a client that stalls mid-request or mid-answer (a
process paused by a test) holds up nobody else.
Usage: python moto_serial.py PORT"""
import io
import os
import sys
import threading

from moto.moto_server.threaded_moto_server import MotoRequestHandler
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple
from werkzeug.wsgi import get_input_stream

port = int(sys.argv[1])
os.environ.setdefault("MOTO_PORT", str(port))
app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()


def serial(environ, start_response):
    # The body in full first (Content-Length or chunked), outside the lock.
    body = get_input_stream(environ).read()
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    environ.pop("HTTP_TRANSFER_ENCODING", None)
    environ["wsgi.input_terminated"] = False
    answer = {}

    def capture(status, headers, exc_info=None):
        answer["start"] = (status, headers, exc_info)
        return answer.setdefault("written", []).append

    with lock:
        result = app(environ, capture)
        try:
            chunks = list(result)
        finally:
            if hasattr(result, "close"):
                result.close()
    status, headers, exc_info = answer["start"]
    start_response(status, headers, exc_info)
    return answer.get("written", []) + chunks


run_simple("127.0.0.1", port, serial, threaded=True, request_handler=MotoRequestHandler)
