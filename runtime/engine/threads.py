"""Keep torch's and numpy's thread pools out of ONNX Runtime's way while a batch decodes.

ONNX Runtime's intra-op threads spin for more work after each run (by default for tens of
milliseconds; OrtEngine caps that at ort_engine.SPIN_US, and EAGLE's sessions never spin). A
multi-threaded BLAS call (numpy's OpenBLAS) or torch op issued while they spin competes with them
for the same cores: on 2 cores, with ONNX Runtime's default spin, one [3, 1728] x [1728, 576] matmul
right after a run was measured at 60-80 ms instead of 0.5 ms. And a pool of its own would wake
threads for arrays that do not need them: the arrays the decoding loop handles itself are small, so
one thread is all they need.
"""

from __future__ import annotations

import functools
import sys
from contextlib import contextmanager

from threadpoolctl import threadpool_limits


@contextmanager
def single_threaded_host_math():
    """Within: numpy's BLAS pool (threadpoolctl) at one thread, and torch's too when something has
    already imported torch (a TensorRT backend, a library caller); the cpu runtime itself never
    imports it, so this does not either."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        if torch is not None:
            torch.set_num_threads(before)


def leaves_cores_to_the_engine(function):
    """Decorator: run `function` under single_threaded_host_math."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with single_threaded_host_math():
            return function(*args, **kwargs)

    return wrapper
