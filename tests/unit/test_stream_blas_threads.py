"""The worker caps numpy's BLAS pool at one thread: sized to every CPU, its second thread
took the encoder's CPU on a 2-CPU worker (`benchmarks/results/e2e_openblas_threads.json`)."""

from __future__ import annotations

import pytest
from threadpoolctl import ThreadpoolController, threadpool_info

from sidecar.stream._app import _one_blas_thread


def test_the_worker_leaves_one_blas_thread() -> None:
    if not any(i["user_api"] == "blas" for i in threadpool_info()):
        pytest.skip("numpy has no BLAS pool threadpoolctl can see on this machine")
    with ThreadpoolController().limit(limits=2, user_api="blas"):  # restored after
        _one_blas_thread()
        blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
        assert blas and all(i["num_threads"] == 1 for i in blas)
