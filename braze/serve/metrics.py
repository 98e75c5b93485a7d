"""``/metrics`` in Prometheus' text format: the engine's snapshot (``Engine.metrics``)
as gauges and counters, its latency samples as histograms, and the server's requests
by endpoint and status. Each app has its own ``CollectorRegistry`` (two apps in one
process, as in the tests, do not share counters)."""

from __future__ import annotations

import time
from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .engine import Engine, Metrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: the shortest window tokens/s is measured over (a scrape right after another keeps the last rate)
_RATE_WINDOW_S = 1.0


class ServerMetrics(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.registry = CollectorRegistry()
        self.requests = Counter("braze_requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "status"], registry=self.registry)
        self.ttft = Histogram("braze_time_to_first_token_seconds", "Time from a request's arrival in the "
                              "engine to its first token", buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.step = Histogram("braze_step_seconds", "Duration of one engine step (prefill chunks and one "
                              "decoding step of the running batch)", buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(self)
        self.last = Metrics()
        self.tokens_per_second = 0.0
        self._rate_from = (time.monotonic(), 0)

    def refresh(self) -> Metrics:
        """Take the engine's snapshot: its latency samples into the histograms, and the
        generation rate since the last refresh at least a second ago."""
        snap = self.engine.metrics()
        for s in snap.ttft_seconds:
            self.ttft.observe(s)
        for s in snap.step_seconds:
            self.step.observe(s)
        now = time.monotonic()
        t0, n0 = self._rate_from
        if now - t0 >= _RATE_WINDOW_S:
            self.tokens_per_second = (snap.generated_tokens - n0) / (now - t0)
            self._rate_from = (now, snap.generated_tokens)
        self.last = snap
        return snap

    def render(self) -> bytes:
        self.refresh()
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        m = self.last
        gauges = [("braze_queue_depth", "Requests waiting for a place in the running batch", m.waiting),
                  ("braze_running_sequences", "Sequences in the running batch", m.running),
                  ("braze_batch_size", "Sequences in the last decoding step", m.batch_size),
                  ("braze_kv_blocks_used", "KV cache blocks held by sequences", m.kv_blocks_used),
                  ("braze_kv_blocks_total", "KV cache blocks in the pool", m.kv_blocks_total),
                  ("braze_generation_tokens_per_second", "Generated tokens per second, over the last "
                   "window between scrapes", self.tokens_per_second)]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)
        counters = [("braze_generated_tokens", "Tokens generated", m.generated_tokens),
                    ("braze_prompt_tokens", "Prompt tokens prefilled", m.prompt_tokens),
                    ("braze_sequences_finished", "Sequences finished (any reason)", m.finished),
                    ("braze_sequences_aborted", "Sequences cancelled (client gone, shutdown)", m.aborted),
                    ("braze_steps", "Engine steps run", m.steps)]
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value=value)
