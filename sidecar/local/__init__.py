"""Local parts for the demo, the benchmarks and the tests.

An embedded Kafka-compatible broker and a private ``redis-server`` (child processes on free
ports, stopped by pid), ``sidecar worker`` run as a child process configured through its
environment, the packaged demo KB and queries, and :func:`run_demo`, which puts them
together as ``sidecar demo``.
"""

from sidecar.local._demo import (
    DemoData,
    demo_data,
    demo_multilingual_queries,
    publish,
    train_demo_model,
    training_half,
)
from sidecar.local._demo_run import DemoConfig, DemoRun, run_demo
from sidecar.local._embedded import EmbeddedBroker, EmbeddedRedis, free_port
from sidecar.local._worker import WorkerProcess, settings_env

__all__ = [
    "DemoConfig",
    "DemoData",
    "DemoRun",
    "EmbeddedBroker",
    "EmbeddedRedis",
    "WorkerProcess",
    "demo_data",
    "demo_multilingual_queries",
    "free_port",
    "publish",
    "run_demo",
    "settings_env",
    "train_demo_model",
    "training_half",
]
