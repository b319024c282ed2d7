"""A local stand-in for S3, DynamoDB and Kinesis (moto) that serves one
request at a time, so that DynamoDB's condition check and write are atomic
with respect to other requests (moto's stock server is threaded and its
DynamoDB backend takes no lock). Usage: python moto_serial.py PORT"""
import os
import sys

from moto.moto_server.threaded_moto_server import MotoRequestHandler
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

port = int(sys.argv[1])
os.environ.setdefault("MOTO_PORT", str(port))
run_simple(
    "127.0.0.1",
    port,
    DomainDispatcherApplication(create_backend_app),
    threaded=False,
    request_handler=MotoRequestHandler,
)
