"""Interop between stormguard and gRPC C-core (the `grpcio` package), in three directions.

1. A grpcio client with a standard `retryPolicy` against the example server under overload:
   C-core's retries (marked by its own `grpc-previous-rpc-attempts`) are shed before any
   first attempt, it waits out each pushback, no pushback of 0 is ever sent, no call hangs.
2. The example client against a grpcio server that answers with pushback values: exact
   delays are honoured, `-1` and garbage stop retries, the deadline shrinks on each retry as
   the server sees it.
3. A grpcio client -> stormguard relay -> grpcio server that always fails: the relay's
   layer retries, gives up with `grpc-retry-pushback-ms: -1`, and the grpcio client does
   not retry on top of it.
4. A measurement: a grpcio client with a standard `retryPolicy` (5 attempts) sending an
   open-loop load at 1.1x, 1.5x and 2x the example server's measured capacity, against
   the server with the admission defaults and against the same server with the two "do
   not retry" rules turned off (`no_retry_margin` and `no_retry_after_shedding` null:
   the behaviour before them). Prints attempts per logical call (counted by the server,
   per `x-call-id`) and goodput; asserts the defaults' figure at 1.5x.

Run through `bash tests/interop/run.sh`. Every server binds port 0 and reports its address;
every wait has a bound; everything listens and connects on 127.0.0.1.
"""

import argparse
import concurrent.futures
import json
import os
import queue
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict

import grpc

SERVICE = "stormguard.demo.v1.Inventory"
RESERVE = f"/{SERVICE}/Reserve"
STARTUP_TIMEOUT_S = 60
# Slack for the timers of two processes on a loaded 2-core machine: a retry may come later
# than its pushback by this much, never earlier than the pushback less 1 ms.
LATE_SLACK_MS = 1000


# --- protobuf wire format for the two demo messages (field numbers from inventory.proto) ---


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(data, i):
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def encode_reserve_request(sku, quantity, request_id):
    out = bytearray()
    for field, text in ((1, sku), (3, request_id)):
        raw = text.encode()
        out += _varint(field << 3 | 2) + _varint(len(raw)) + raw
    out += _varint(2 << 3) + _varint(quantity)
    return bytes(out)


def decode_fields(data):
    """Field number -> value (varints as ints, length-delimited as bytes)."""
    fields, i = {}, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            fields[field], i = _read_varint(data, i)
        elif wire == 2:
            n, i = _read_varint(data, i)
            fields[field], i = data[i : i + n], i + n
        else:
            raise ValueError(f"unexpected wire type {wire}")
    return fields


def encode_reserve_reply(reserved, attempt, timeout_ms):
    return (
        _varint(1 << 3) + _varint(int(reserved))
        + _varint(2 << 3) + _varint(attempt)
        + _varint(3 << 3) + _varint(timeout_ms)
    )


# --- processes ---


class Proc:
    """A child process whose stdout lines are collected by a thread."""

    def __init__(self, argv):
        self.argv = argv
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines = queue.Queue()
        self.seen = []
        self.stderr = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True).start()

    @staticmethod
    def _pump(stream, sink):
        for line in stream:
            sink(line.rstrip("\n"))

    def wait_line(self, accept, timeout_s):
        """Returns the first stdout line (later ones stay queued) for which `accept` is true."""
        end = time.monotonic() + timeout_s
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.argv[0]}: no expected line within {timeout_s} s; stderr: {self.stderr[-5:]}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(line)
            if accept(line):
                return line

    def listening(self):
        line = self.wait_line(lambda l: l.startswith("listening on "), STARTUP_TIMEOUT_S)
        return line.removeprefix("listening on ")

    def drain(self):
        """Every stdout line so far, including those `wait_line` went past."""
        out, self.seen = self.seen, []
        while True:
            try:
                out.append(self.lines.get_nowait())
            except queue.Empty:
                return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def json_lines(lines):
    out = []
    for line in lines:
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def retrying_channel(addr, max_attempts, backoff):
    config = {
        "methodConfig": [{
            "name": [{"service": SERVICE}],
            "retryPolicy": {
                "maxAttempts": max_attempts,
                "initialBackoff": backoff,
                "maxBackoff": backoff,
                "backoffMultiplier": 1,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }]
    }
    return grpc.insecure_channel(
        addr,
        options=[("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))],
    )


def reserve_stub(channel):
    return channel.unary_unary(RESERVE, request_serializer=None, response_deserializer=None)


# --- 1. grpcio client -> example server under overload ---


def c_core_client_against_overloaded_server(bins):
    server = Proc([
        os.path.join(bins, "server"), "--addr", "127.0.0.1:0", "--workers", "2",
        "--queue", "512", "--retry-depth", "4", "--service-time-ms", "10",
        "--fail-rate", "0.3", "--seed", "7", "--log-calls",
    ])
    try:
        addr = server.listening()
        channel = retrying_channel(addr, max_attempts=5, backoff="0.02s")
        grpc.channel_ready_future(channel).result(timeout=STARTUP_TIMEOUT_S)
        stub = reserve_stub(channel)
        calls, in_flight, deadline_s = 400, 48, 5.0

        def one(i):
            started = time.monotonic()
            try:
                stub(
                    encode_reserve_request(f"sku-{i % 10}", 1, f"req-{i}"),
                    timeout=deadline_s,
                    metadata=[("x-call-id", f"c{i}")],
                )
                code = grpc.StatusCode.OK
            except grpc.RpcError as error:
                code = error.code()
            return code, time.monotonic() - started

        with concurrent.futures.ThreadPoolExecutor(in_flight) as pool:
            results = list(pool.map(one, range(calls), timeout=deadline_s * calls / in_flight * 4 + 30))
        channel.close()

        durations = [d for _, d in results]
        codes = defaultdict(int)
        for code, _ in results:
            codes[code.name] += 1
        # No call outlives its deadline by more than the slack: nothing hangs on a pushback.
        assert max(durations) < deadline_s + 1.0, f"a call took {max(durations):.2f} s"
        assert codes["OK"] > calls // 2, dict(codes)

        # Every call has its answer, so every log line is already written; read up to the
        # first stats line that counts every shed answer logged before it (a line printed
        # after the last answer), within a bound.
        shed = lambda l: l["status"] in ("14", "8") and l["pushback"] is not None  # noqa: E731
        logs, stats, end = [], None, time.monotonic() + 30
        while stats is None:
            line = server.wait_line(lambda l: True, max(end - time.monotonic(), 0.1))
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if "call" in record:
                logs.append(record)
            elif (record["queue_depth"] == 0 and record["in_flight"] == 0
                  and record["shed_first"] + record["shed_retry"] == sum(map(shed, logs))):
                stats = record
    finally:
        server.stop()

    by_call = defaultdict(list)
    for line in logs:
        by_call[line["call"]].append(line)
    first = [l for l in logs if l["attempt"] in (None, "0")]
    retries = [l for l in logs if l["attempt"] not in (None, "0")]
    shed_first = [l for l in first if shed(l)]
    shed_retries = [l for l in retries if shed(l)]
    assert len(first) == calls, f"{len(first)} first attempts logged for {calls} calls"
    cancelled = sum(1 for l in logs if l["cancelled"])
    assert retries, "C-core sent no attempt marked with grpc-previous-rpc-attempts"
    assert shed_retries, "no retry was shed"
    assert not shed_first, f"{len(shed_first)} first attempts shed"
    assert stats["shed_first"] == 0 and stats["shed_retry"] == len(shed_retries), stats
    pushbacks = [int(l["pushback"]) for l in logs if l["pushback"] is not None]
    assert all(p != 0 for p in pushbacks), "the server sent a pushback of 0"

    # Each attempt after a pushback of P ms arrives at least P ms after that answer left
    # (C-core's own backoff here is at most 20 ms, far below every pushback sent).
    waits = []
    for attempts in by_call.values():
        attempts.sort(key=lambda l: int(l["attempt"] or 0))
        for earlier, later in zip(attempts, attempts[1:]):
            assert int(later["attempt"]) == int(earlier["attempt"] or 0) + 1, attempts
            if not shed(earlier):
                continue
            p = int(earlier["pushback"])
            assert p > 0, earlier
            waited_ms = (later["arrived_us"] - earlier["answered_us"]) / 1000
            assert waited_ms >= p - 1, f"retry came {waited_ms:.1f} ms after a pushback of {p} ms"
            waits.append((p, waited_ms))
    assert waits, "no retry followed a pushback"
    late = sorted(w - p for p, w in waits)
    print(
        f"1. C-core client -> example server: {calls} calls {dict(codes)}, "
        f"{len(retries)} retries, {len(shed_retries)} shed (first attempts shed: 0), "
        f"{len(waits)} retries after a pushback (min {min(p for p, _ in waits)} ms, "
        f"max {max(p for p, _ in waits)} ms), each >= its pushback, "
        f"median lateness {late[len(late) // 2]:.1f} ms; longest call {max(durations):.2f} s; "
        f"attempts left unanswered by a departed caller: {cancelled}"
    )


# --- a grpcio server whose answers a test scripts ---


class ScriptedServer:
    """A grpcio server for `Inventory/Reserve` that records every attempt.

    `answer(attempt_number) -> (status or None, trailing metadata)` decides each answer.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.attempts = []
        self.answer = lambda n: (None, ())
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "Reserve": grpc.unary_unary_rpc_method_handler(self._reserve),
        })
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(8), handlers=[handler])
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.addr = f"127.0.0.1:{port}"

    def _reserve(self, request, context):
        arrived = time.monotonic()
        fields = decode_fields(request)
        metadata = dict(context.invocation_metadata())
        previous = metadata.get("grpc-previous-rpc-attempts")
        number = int(previous) if previous is not None else 0
        status, trailers = self.answer(number)
        record = {
            "request_id": fields.get(3, b"").decode(),
            "previous": previous,
            "arrived": arrived,
            "time_remaining": context.time_remaining(),
            "answered": time.monotonic(),
        }
        with self.lock:
            self.attempts.append(record)
        if status is None:
            return encode_reserve_reply(True, number + 1, 0)
        context.set_trailing_metadata(trailers)
        context.abort(status, "scripted")

    def take(self):
        with self.lock:
            out, self.attempts = self.attempts, []
        return out

    def stop(self):
        self.server.stop(grace=None)


def run_client(bins, addr, config, requests, deadline_ms):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
    try:
        out = subprocess.run(
            [
                os.path.join(bins, "client"), "--target", f"http://{addr}",
                "--requests", str(requests), "--concurrency", "4",
                "--deadline-ms", str(deadline_ms), "--service-config", f.name, "--seed", "11",
            ],
            capture_output=True, text=True, timeout=120, check=True,
        )
    finally:
        os.unlink(f.name)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- 2. example client -> grpcio server sending pushback ---


def example_client_against_c_core_server(bins):
    # A backoff far longer than any pushback used here: a retry that comes on time came
    # from the pushback, not from the backoff.
    config = {
        "methodConfig": [{
            "name": [{"service": SERVICE}],
            "retryPolicy": {
                "maxAttempts": 3, "initialBackoff": "10s", "maxBackoff": "10s",
                "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }]
    }
    requests, deadline_ms, pushback_ms = 20, 5000, 300
    server = ScriptedServer()
    try:
        # a) a pushback of 300 ms on every first attempt, then success
        server.answer = lambda n: (
            (grpc.StatusCode.UNAVAILABLE, (("grpc-retry-pushback-ms", str(pushback_ms)),))
            if n == 0 else (None, ())
        )
        report = run_client(bins, server.addr, config, requests, deadline_ms)
        attempts = server.take()
        assert report["ok"] == requests and report["retries"] == requests, report
        by_id = defaultdict(list)
        for a in attempts:
            by_id[a["request_id"]].append(a)
        assert len(by_id) == requests and all(len(v) == 2 for v in by_id.values()), by_id
        delays, shrink = [], []
        for first, retry in (sorted(v, key=lambda a: a["arrived"]) for v in by_id.values()):
            assert first["previous"] is None and retry["previous"] == "1", (first, retry)
            waited_ms = (retry["arrived"] - first["answered"]) * 1000
            assert pushback_ms - 1 <= waited_ms <= pushback_ms + LATE_SLACK_MS, waited_ms
            delays.append(waited_ms)
            # The retry's grpc-timeout is what is left of the same deadline, not a new one.
            assert first["time_remaining"] < deadline_ms / 1000 + 0.01, first
            lost = first["time_remaining"] - retry["time_remaining"]
            assert lost >= (pushback_ms - 20) / 1000, (first, retry)
            shrink.append(lost * 1000)
        delays.sort()
        print(
            f"2a. example client -> C-core server, pushback {pushback_ms} ms: {requests}/{requests} ok "
            f"after one retry each; retry delay {delays[0]:.1f}..{delays[-1]:.1f} ms; "
            f"deadline seen by the server shrank by {min(shrink):.0f}..{max(shrink):.0f} ms"
        )

        # b) `-1` and garbage: no retry at all
        for value in ("-1", "soon", ""):
            server.answer = lambda n, v=value: (
                grpc.StatusCode.UNAVAILABLE, (("grpc-retry-pushback-ms", v),)
            )
            report = run_client(bins, server.addr, config, requests, deadline_ms)
            attempts = server.take()
            assert len(attempts) == requests, (value, len(attempts))
            assert all(a["previous"] is None for a in attempts), value
            assert report["retries"] == 0 and report["refused"]["pushback"] == requests, report
            print(f"2b. pushback {value!r}: {requests} calls, {len(attempts)} attempts, 0 retries, "
                  f"{report['refused']['pushback']} refused by pushback")
    finally:
        server.stop()


# --- 3. grpcio client -> stormguard relay -> grpcio server ---


def do_not_retry_crosses_the_relay(bins):
    downstream = ScriptedServer()
    downstream.answer = lambda n: (grpc.StatusCode.UNAVAILABLE, ())
    relay = Proc([os.path.join(bins, "relay"), "--addr", "127.0.0.1:0",
                  "--target", f"http://{downstream.addr}"])
    calls = 10
    try:
        addr = relay.listening()
        channel = retrying_channel(addr, max_attempts=3, backoff="0.02s")
        grpc.channel_ready_future(channel).result(timeout=STARTUP_TIMEOUT_S)
        stub = reserve_stub(channel)
        pushbacks = []
        for i in range(calls):
            started = time.monotonic()
            try:
                stub(encode_reserve_request("sku", 1, f"r{i}"), timeout=5.0)
                raise AssertionError("the downstream always fails")
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                pushbacks.append(dict(error.trailing_metadata() or ()).get("grpc-retry-pushback-ms"))
            assert time.monotonic() - started < 5.0
        channel.close()
        # Every call is answered, so the downstream saw every attempt; wait for the relay's
        # stats line that counts them all.
        with downstream.lock:
            seen = len(downstream.attempts)
        stats = json.loads(relay.wait_line(
            lambda l: l.startswith("{") and json.loads(l)["logical"] >= calls
            and json.loads(l)["attempts"] >= seen, 30))
    finally:
        relay.stop()
        downstream.stop()
    attempts = downstream.take()
    assert pushbacks == ["-1"] * calls, pushbacks
    # The grpcio client reached the relay once per call; only the relay retried.
    assert stats["admitted"] == calls and stats["logical"] == calls, stats
    assert stats["retries"] > 0 and stats["attempts"] == len(attempts), (stats, len(attempts))
    # Each call's attempts downstream carry grpc-previous-rpc-attempts 0, 1, ... in turn
    # (how many a call gets is the relay's budget's to say: against a dependency that never
    # answers, its floor is lent only to the first failures).
    by_id = defaultdict(list)
    for a in attempts:
        by_id[a["request_id"]].append(int(a["previous"] or 0))
    assert len(by_id) == calls, by_id
    assert all(sorted(p) == list(range(len(p))) for p in by_id.values()), by_id
    print(
        f"3. C-core client -> relay -> C-core server: {calls} calls, all UNAVAILABLE with "
        f"pushback -1; the relay saw {stats['admitted']} calls (C-core did not retry) and made "
        f"{stats['attempts']} attempts downstream ({stats['retries']} retries)"
    )


# --- 4. attempts per call of a standard client under overload ---

MEASURE_WORKERS, MEASURE_SERVICE_MS, MEASURE_QUEUE = 4, 10, 64
MEASURE_DEADLINE_S, MEASURE_SECONDS = 2.0, 4.0
# The target for the defaults' attempts per call at 1.5x is 1.3. Runs on a 2-core machine
# busy with other builds gave 1.04-1.19 with 4 s per load (the first ~0.3 s fills the
# queue, the next 0.5 s of shedding still sends delays, and a batch of queued calls
# expiring together can empty the queue for a moment, which starts a new stretch);
# without the rules, 1.8-2.5. Not stable enough under CI load to assert 1.3 itself: the
# run asserts a looser bound, still far below the figure without the rules, and prints
# the figure.
MAX_ATTEMPTS_PER_CALL_AT_1_5X = 1.5
# Goodput with the rules may not fall below goodput without them by more than this (the
# run-to-run noise of goodput on a busy machine is several points).
GOODPUT_SLACK = 0.10


def measuring_server(bins, admission, log_calls=True):
    """The example server with `admission` (the fields of `admission`)."""
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    with f:
        json.dump({"admission": admission}, f)
    server = Proc([
        os.path.join(bins, "server"), "--addr", "127.0.0.1:0", "--config", f.name,
        "--service-time-ms", str(MEASURE_SERVICE_MS), "--seed", "7",
    ] + (["--log-calls"] if log_calls else []))
    return server, f.name


def open_loop(stub, rate, seconds, seed, deadline_s):
    """Sends Poisson arrivals at `rate` calls/s for `seconds`; returns the futures."""
    rng = random.Random(seed)
    futures, started = [], time.monotonic()
    due, end = started, started + seconds
    # Every call due by now is sent, then a short sleep.
    while due < end:
        now = time.monotonic()
        while due <= now and due < end:
            i = len(futures)
            futures.append(stub.future(
                encode_reserve_request(f"sku-{i % 10}", 1, f"m{i}"),
                timeout=deadline_s,
                metadata=[("x-call-id", f"m{seed}-{i}")],
            ))
            due += rng.expovariate(rate)
        time.sleep(0.0005)
    return futures, len(futures) / (time.monotonic() - started)


def measure_capacity(bins, admission):
    """Calls/s the server completes while offered about twice what its workers can serve,
    with no retries: the completions between its first and third stats lines (1 s and 3 s
    after it started), counted by the server itself, so a slow client cannot lower them."""
    server, path = measuring_server(bins, admission, log_calls=False)
    try:
        channel = grpc.insecure_channel(server.listening(), options=[("grpc.enable_retries", 0)])
        grpc.channel_ready_future(channel).result(timeout=STARTUP_TIMEOUT_S)
        stub = reserve_stub(channel)
        rate = 2 * MEASURE_WORKERS * 1000 / MEASURE_SERVICE_MS
        stats = lambda l: l.startswith("{") and "call" not in json.loads(l)  # noqa: E731
        futures, _ = open_loop(stub, rate, 3.3, 3, MEASURE_DEADLINE_S)
        first = json.loads(server.wait_line(stats, 30))
        json.loads(server.wait_line(stats, 30))
        second = json.loads(server.wait_line(stats, 30))
        for future in futures:
            try:
                future.result(timeout=MEASURE_DEADLINE_S + 30)
            except grpc.RpcError:
                pass
        channel.close()
    finally:
        server.stop()
        os.unlink(path)
    assert first["queue_depth"] > 0 and second["queue_depth"] > 0, (
        f"the capacity run did not keep the queue busy: {first} {second}")
    return (second["completed"] - first["completed"]) / 2


def overload_run(bins, admission, rate, seed):
    """`rate` calls/s for MEASURE_SECONDS from a 5-attempt grpcio client; returns
    (offered calls/s, attempts per call, goodput, share of shed answers that were -1)."""
    server, path = measuring_server(bins, admission)
    try:
        addr = server.listening()
        channel = retrying_channel(addr, max_attempts=5, backoff="0.02s")
        grpc.channel_ready_future(channel).result(timeout=STARTUP_TIMEOUT_S)
        stub = reserve_stub(channel)
        futures, offered = open_loop(stub, rate, MEASURE_SECONDS, seed, MEASURE_DEADLINE_S)
        ok = 0
        for future in futures:
            try:
                future.result(timeout=MEASURE_DEADLINE_S + 30)
                ok += 1
            except grpc.RpcError:
                pass
            except grpc.FutureTimeoutError:
                raise AssertionError("a call outlived its deadline by 30 s")
        channel.close()
        # Every call has its answer; a stats line with nothing queued or running that
        # counts every served call comes after every answer's log line.
        def quiet(line):
            if not line.startswith("{"):
                return False
            r = json.loads(line)
            return ("call" not in r and r["queue_depth"] == 0 and r["in_flight"] == 0
                    and r["unsettled"] == 0 and r["completed"] >= ok)
        server.wait_line(quiet, 30)
        logs = [l for l in json_lines(server.drain()) if "call" in l]
    finally:
        server.stop()
        os.unlink(path)
    calls = {l["call"] for l in logs if l["call"].startswith(f"m{seed}-")}
    assert len(calls) == len(futures), f"{len(calls)} calls logged for {len(futures)} sent"
    shed = [l for l in logs if l["status"] in ("14", "8") and l["pushback"] is not None]
    refused = sum(1 for l in shed if l["pushback"] == "-1")
    assert all(l["pushback"] != "0" for l in shed), "the server sent a pushback of 0"
    return offered, len(logs) / len(futures), ok / len(futures), refused / max(len(shed), 1)


def attempts_per_call_under_overload(bins):
    base = {"workers": MEASURE_WORKERS, "queue_capacity": MEASURE_QUEUE}
    configs = {
        "defaults": base,
        "rules off": {**base, "no_retry_margin": None, "no_retry_after_shedding": None},
    }
    capacity = measure_capacity(bins, base)
    print(
        f"4. C-core client (5 attempts, {MEASURE_DEADLINE_S:.0f} s deadline) -> example server "
        f"({MEASURE_WORKERS} workers x {MEASURE_SERVICE_MS} ms, queue {MEASURE_QUEUE}): "
        f"capacity {capacity:.0f} calls/s measured; {MEASURE_SECONDS:.0f} s per load"
    )
    figures = {}
    for level in (1.1, 1.5, 2.0):
        for name, admission in configs.items():
            offered, apc, goodput, refused = overload_run(bins, admission, level * capacity, 11)
            figures[(name, level)] = (apc, goodput)
            print(
                f"   {level:.1f}x ({offered / capacity:.2f}x sent) {name:>9}: "
                f"{apc:.2f} attempts/call, goodput {goodput * 100:.1f} % of offered "
                f"({goodput * offered / capacity * 100:.0f} % of capacity), "
                f"{refused * 100:.0f} % of shed answers -1"
            )
    apc, goodput = figures[("defaults", 1.5)]
    assert apc <= MAX_ATTEMPTS_PER_CALL_AT_1_5X, f"{apc:.2f} attempts per call at 1.5x"
    old_goodput = figures[("rules off", 1.5)][1]
    assert goodput >= old_goodput - GOODPUT_SLACK, (goodput, old_goodput)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True, help="folder with the example binaries")
    parser.add_argument("--only", choices=["1", "2", "3", "4"])
    args = parser.parse_args()
    started = time.monotonic()
    suites = {
        "1": c_core_client_against_overloaded_server,
        "2": example_client_against_c_core_server,
        "3": do_not_retry_crosses_the_relay,
        "4": attempts_per_call_under_overload,
    }
    for key, suite in suites.items():
        if args.only in (None, key):
            suite(args.bin)
    print(f"interop: passed in {time.monotonic() - started:.1f} s (grpcio {grpc.__version__})")


if __name__ == "__main__":
    sys.exit(main())
