"""The ingestion ceiling: a bare paho subscriber that only decodes what it receives.

``python -m bench.bare_subscriber --broker URL --topic T --expect N`` subscribes QoS 1 (MQTT 5,
paho's automatic acknowledgement), prints ``ready`` once subscribed, decodes every message
(JSON or msgpack by content type, like livefit) and counts its samples, and prints
``done <epoch s> <samples> <messages>`` when N samples arrived (or ``timeout`` after
``--timeout`` seconds). No validation, no arrays, no queue, no training: the least any consumer
of these messages can do.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

import msgpack
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from livefit.server.config.broker_urls import parse_broker_url


class Counter:
    """Decodes messages on paho's thread and signals when ``expect`` samples arrived."""

    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.samples = 0
        self.messages = 0
        self.done = threading.Event()
        self.done_at = 0.0

    def on_message(self, _client: Any, _userdata: Any, message: paho.MQTTMessage) -> None:
        props = message.properties
        content_type = getattr(props, "ContentType", None) if props else None
        if content_type == "application/json":
            document = json.loads(message.payload)
        else:
            document = msgpack.unpackb(message.payload, raw=False)
        x = document["x"]
        batched = isinstance(x, list) and bool(x) and isinstance(x[0], list)
        if isinstance(x, dict):  # a raw buffer: its first dimension
            batched = len(x["shape"]) > 1
            n = x["shape"][0] if batched else 1
        else:
            n = len(x) if batched else 1
        self.samples += n
        self.messages += 1
        if self.samples >= self.expect and not self.done.is_set():
            self.done_at = time.time()
            self.done.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bare_subscriber")
    parser.add_argument("--broker", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--expect", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    address = parse_broker_url(args.broker)
    counter = Counter(args.expect)
    subscribed = threading.Event()
    client = paho.Client(CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
    client.on_message = counter.on_message
    client.on_connect = lambda c, *_: c.subscribe(args.topic, qos=1)
    client.on_subscribe = lambda *_: subscribed.set()
    client.connect(address.host, address.port)
    client.loop_start()
    try:
        if not subscribed.wait(10):
            print("timeout subscribing", flush=True)
            return 1
        print("ready", flush=True)
        if counter.done.wait(args.timeout):
            print(f"done {counter.done_at:.6f} {counter.samples} {counter.messages}", flush=True)
            return 0
        print(f"timeout {counter.samples} {counter.messages}", flush=True)
        return 1
    finally:
        client.disconnect()
        client.loop_stop()


if __name__ == "__main__":
    sys.exit(main())
