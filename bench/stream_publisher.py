"""The publisher every MQTT benchmark uses: livefit's ``SamplePublisher``, in its own process.

``python -m bench.stream_publisher --broker URL --topic T --fmt json|msgpack --batch K
--count N [--duration S] [--rate R]`` pre-generates N samples (so making data is not measured),
prints ``start <epoch s>``, publishes them QoS 1 with a window of 1000 unacknowledged messages
(as ``livefit publish`` does) until all are acknowledged, S seconds passed or SIGTERM came, and
prints ``end <epoch s> <json stats>``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from livefit.clients.publisher import SamplePublisher
from livefit.clients.synthetic import cycle_chunks, stream_for_shape


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_publisher")
    parser.add_argument("--broker", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--fmt", choices=["json", "msgpack"], default="msgpack")
    parser.add_argument("--raw", action="store_true", help="msgpack raw buffers")
    parser.add_argument("--batch", type=int, default=1, help="samples per message")
    parser.add_argument("--count", type=int, required=True, help="samples to publish")
    parser.add_argument("--duration", type=float, default=0.0, help="stop after S seconds")
    parser.add_argument("--rate", type=float, default=0.0, help="samples/s (0: as fast as it can)")
    parser.add_argument("--input-shape", default="8")
    parser.add_argument("--window", type=int, default=1000)
    args = parser.parse_args(argv)
    shape = tuple(int(d) for d in args.input_shape.split(","))
    stream = stream_for_shape(shape, seed=11)
    x, y = stream.sample(min(args.count, 100_000))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    if args.duration > 0:  # a daemon: SIGTERM before the duration must not wait it out
        timer = threading.Timer(args.duration, stop.set)
        timer.daemon = True
        timer.start()
    publisher = SamplePublisher(
        args.broker, args.topic, fmt=args.fmt, raw=args.raw, window=args.window, source="bench"
    )
    publisher.connect()
    try:
        print(f"start {time.time():.6f}", flush=True)
        stats = publisher.publish_stream(
            cycle_chunks(x, y, args.count, 10_000), batch=args.batch, rate=args.rate, stop=stop
        )
        print(
            f"end {time.time():.6f} "
            + json.dumps(
                {
                    "samples": stats.samples,
                    "messages": stats.messages,
                    "seconds": stats.seconds,
                    "rejected": stats.rejected,
                    "dropped": stats.dropped,
                }
            ),
            flush=True,
        )
    finally:
        stop.set()
        publisher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
