"""Why livefit misses a target, from profiles: shown in BENCHMARKS.md under the benchmark.

Written by hand from py-spy (``py-spy record -r 100..200 -f raw --threads``, aggregated per
thread) and line_profiler runs on this 2-core machine; the figures quoted here are those of the
profiling runs, the tables above are the latest measurement. ``server/...`` names where the
change belongs. The report shows a text when any target of its benchmark is missed.
"""

from __future__ import annotations

TRAINER = """
**Profiled**: py-spy of an in-process `Trainer` at batch 256 fed 1-sample chunks (trainer
thread only); line_profiler on `SampleQueue.next_batch/_take`, `_concatenate`,
`Trainer.train_batch/_record` and `TrainStep.__call__` with the trainer loop run on the
profiled thread; and a micro-benchmark that adds livefit's differences to the raw step one at a
time (median of 7 x 200 steps, same model and data).

**Where a batch's time goes at batch 256** (one run of the same data, same process):

| what runs | ms per batch of 256 |
|---|---|
| raw step (tensors, fixed shape) | 0.60-0.72 |
| `TrainStep.__call__` alone, numpy in and out | 1.08-1.17 |
| `Trainer._run`, 100-sample chunks | 1.35-1.65 |
| `Trainer._run`, 1-sample chunks | 2.01-2.43 |

1. `tf.function` dispatch, every call: `Function.__call__` binds and canonicalises the three
   numpy inputs against the signature and looks the function up in its cache
   (`bind_function_inputs`, `trace_function`, `_maybe_define_function`): about 20% of the
   trainer thread's samples. Calling the concrete function directly took 0.61-0.71 ms instead
   of 0.86-1.27 ms.
2. numpy inputs: converting `x`, `y`, `w` costs 0.1-0.25 ms a step (raw step fed numpy: 0.70
   vs 0.60 ms on tensors); fetching `losses` and `pred` back with `.numpy()` and `float(loss)`
   another 0.1-0.4 ms.
3. The non-finite rollback (`train_step.py`, `apply`): before every update it copies every
   weight and Adam slot into backup variables and checks every gradient and every updated
   variable for finiteness: about 40 extra ops a step. At batch 1024: 1.33 ms a step without
   it, 1.74 ms with it (raw: 0.81 ms).
4. The queue, with 1-sample chunks (single-sample messages): `SampleQueue._take` walks 256
   chunks per batch in Python, calling `SampleChunk.__len__` (`int(x.shape[0])`) three times
   each, and `_concatenate` builds three lists and three `np.concatenate` of 256 tiny arrays:
   22.6% of the trainer thread's samples, about 0.5 ms per batch.
5. Per-step metrics (10 Prometheus calls): about 4% of `train_batch`; minor.

**What should change**

- `server/train_step.py`: keep `self._concrete = self._step.get_concrete_function()` from
  `warm_up()` and call it; return the predictions only when accuracy is tracked; replace the
  per-step backup copy with the checks that are cheap (loss and gradients finite, already
  computed) and, for the rare finite-gradient overflow, restore from the last snapshot (a host
  copy exists every `publish_interval_s`) instead of copying all state before every update.
- `server/samples.py`: hold queued samples in preallocated ring buffers of `queue_capacity`
  rows (`x`, `y`, `w`): `put` is one slice assignment, `next_batch` one or two slices, so a
  batch costs O(1) Python whatever the message size; keep per-chunk metadata (`published_at`,
  `position`) as running min/max per batch. Store `n` in `SampleChunk` instead of recomputing.
- Documentation (README, `train.max_batch_size`): the step's cost is nearly flat in the batch
  size for small models (raw: 0.6 ms at 256, 0.8 ms at 1024), so 1024 trains 2-3x more
  samples/s when samples arrive faster than the trainer steps.

At batch 32 no trainer can reach 100x per-message: the raw step itself is about 55x
`train_on_batch` per sample there, so that row carries no target.
"""

INGESTION = """
**Profiled**: py-spy `--threads` on the `livefit serve` process during a 20,000-message
single-sample JSON run and a 300,000-sample run of 100-sample messages.

**Single-sample messages** (0.75-0.85x): the bare subscriber is bound by the publisher and the
broker (one paho publisher, QoS 1). livefit's extra work per message is split across three
threads that share the GIL with paho's network thread: the ingest thread (decode and validate
about 5% of its samples; the write-ahead log `WriteAheadLog._write` 18% and `commit` 16%, since
`IngestWorker._run` commits, with an fsync, whenever the inbox is momentarily empty, which at a
few thousand messages/s means a commit every message or two; acks sent from this thread through
`Client.ack` 7%), and the trainer, which takes the few samples queued at a time and pays its
full per-step cost for each tiny batch (`quick_execute` 54% of its samples).

**100-sample messages** (about 0.2x): the trainer is the bottleneck. The ingest thread spends
58% of its samples blocked in `SampleQueue.put` (queue full: backpressure works), while the
trainer runs back-to-back steps of 256 (`quick_execute` 59%, `_concatenate` 22%). With the
broker, the publisher and paho on the same two cores, 256-sample steps top out near 100k
samples/s; the bare subscriber only parses (400-580k/s). The informative column, the same
learner with `train.max_batch_size` 1024, roughly doubles it.

**What should change**

- Everything listed under the trainer benchmark: batched ingestion is bounded by the step.
- `server/ingest.py`: group commit by time as well as by inbox state: after a commit, linger
  up to ~1-2 ms (or N messages) for more before the next fsync, as PostgreSQL's
  `commit_delay` and Kafka's `linger.ms` do, so one fsync covers dozens of messages at any rate.
- Optionally (`train.max_batch_size` stays the user's bound): when the queue holds several
  batches, the trainer could take up to `max_batch_size` from a deeper queue in one slice
  (ring buffer) instead of many chunk pops.
"""

SERVING = """
**Profiled**: py-spy `--threads` on the learner at 64 clients (MLP); line_profiler on
`predict_api` (`predict`, `_read_body`, `_run`, `_timeout_s`), `protocols.parse_tfserving` and
`format_tfserving`, and `RequestBatcher.submit/_run/_take_batch`, with the same app served by
uvicorn in the profiled thread; `gc.callbacks` timing every collection during the same load.

1. **Garbage collection pauses are the tail.** After start, TensorFlow and Keras leave about
   340,000 objects tracked by the cyclic GC. Every generation-2 collection walks all of them: 8
   in 5 s at 64 clients, 180-200 ms each, 1.4 s of the 5 s with the event loop and batcher
   stopped. That is the p90/p99 (p50 22 ms, p90 136 ms, p99 210 ms in that run). With
   `gc.freeze()` called once after warm-up, the same load gave p90 32 ms, p99 45 ms and
   2,681 req/s instead of 2,106 (gen-2 collections then took at most 4 ms).
2. **The event loop is the bottleneck, not the model.** The model thread was idle 81% of the
   time (batches averaged 31 rows at 64 clients). Per request the loop runs: FastAPI's routing
   and `solve_dependencies` for `(name, request)`; `_read_body` through `request.stream()` inside
   a per-request `asyncio.timeout` (about 37 µs under the profiler); `parse_tfserving` (52 µs,
   half in `_tf_rows`' validation); `RequestBatcher.submit` (34 µs, two thirds in
   `asyncio.wait_for(asyncio.shield(future))`); `format_tfserving` and `JSONResponse`; two
   Prometheus observations and a gauge update per request. The constant endpoint does only the
   routing and the body read, so it answers 3-5x more.
3. **One client waits the whole batch timeout**: at 1 client every request waits
   `batch_timeout_ms` (2 ms) for company that never comes (p50 about 4 ms vs 0.7-1 ms for the
   FastAPI + `predict_on_batch` peer).

**What should change**

- `server/app.py` (lifespan, after `runtime.start()` and `start_batching`): `gc.freeze()`, so
  import- and build-time objects leave the collector's reach (same for replicas).
- `server/predict_api.py`: mount the predict routes as plain Starlette routes (no FastAPI
  parameter machinery); read the body with `await request.body()` after the Content-Length
  check; a fast path for the common body (`np.asarray(doc["instances"], np.float32)` and one
  shape check, the full validator only when that fails); build the response bytes with one
  `json.dumps` (or orjson) into a `Response` rather than `JSONResponse` of a nested dict.
- `server/batcher.py`: one deadline handle per request (`loop.call_at` that fails the future
  if still pending) instead of `wait_for(shield(...))`; update the queue-rows gauge and the
  latency metrics per batch, not per request; fire a batch at once when the model thread is
  idle and only wait `batch_timeout_ms` while a batch is running (the next batch forms during
  the current model call), which removes the 2 ms at low load without losing batching at high
  load.
"""

INTERFERENCE = """
**Profiled**: the learner served in-process by uvicorn with `gc.callbacks` timing every
collection, 64 clients for 5 s idle, then 5 s while a publisher streams 100-sample messages;
once as livefit runs today and once with `gc.freeze()` after warm-up:

| | idle req/s | idle p90 / p99 ms | saturated req/s | saturated p90 / p99 ms | gen-2 pauses |
|---|---|---|---|---|---|
| as is | 2,038 | 145 / 210 | 1,255 | 164 / 339 | 8 idle, 4 saturated, 180-290 ms each |
| `gc.freeze()` | 2,393 | 34 / 40 | 1,274 | 99 / 341 | at most 7 ms |

So the ratio measured here (about 1.6-1.9x) understates the interference: the idle p99 is
itself inflated by garbage-collection pauses (see serving), and once those are gone the
saturated p99 is 8x the idle one. What remains is contention for two cores and one GIL: the
trainer's TensorFlow kernels (an intra-op pool of 2 threads), the trainer's, ingest's and paho's
Python work and the broker and publisher all compete with the event loop and the model thread;
requests/s halve and the loop waits for the GIL behind them.

**What should change**

- `gc.freeze()` after warm-up (`server/app.py`), as for serving: it removes the pauses but
  makes the true interference visible, so it must come with the next points.
- `server/trainer.py`: give way to serving: before each step, when the request batcher has rows
  queued, wait (bounded, 1-2 ms) for it to drain; and lower the trainer thread's OS priority
  (`os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)` at the top of
  `Trainer._run`; Linux sets niceness per thread), so the event loop wins on a small machine.
- `server/modeling.py` / config: a setting for TensorFlow's intra-op threads (default
  `cores - 1` when the learner also serves), since the pool is process-wide.
- Structurally, training and ingestion in a child process (weights already travel as
  snapshots) would take them off the serving process's GIL entirely.
"""

MEMORY = """
**Profiled**: RSS sampled every 0.25 s with psutil during the run; a miss here means growth
after warm-up. Look first at the weight store (`weights.keep_versions` encoded payloads),
the WAL segments not yet truncated, and the prequential window; none grows without bound by
design.
"""

FRESHNESS = """
A miss here would come from `weights.publish_interval_s` (0.5 s by default): a probe waits up
to one interval for the next snapshot, plus the trainer's 0.1 s poll when it was idle.
"""

ANALYSIS: dict[str, str] = {
    "trainer": TRAINER,
    "ingestion": INGESTION,
    "serving": SERVING,
    "interference": INTERFERENCE,
    "memory": MEMORY,
    "freshness": FRESHNESS,
}
