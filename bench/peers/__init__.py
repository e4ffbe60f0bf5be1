"""The servers livefit's serving is compared with, each a script run as its users would run it.

Each is started as ``python -m bench.peers.<module> --port N ...`` in its own process, serves
``POST /v1/models/<name>:predict`` with the same request and response shapes as livefit's TF
Serving endpoint, and answers ``GET /health`` once it can serve.
"""
