"""Run a command and write its wall time, exit status and peak RSS as JSON:

    python rusage_run.py RESULT.json CMD [ARGS...]

Linux carries ru_maxrss across fork and exec, so a command started straight from the benchmark (which
holds torch and a tokenizer) would report at least the benchmark's own peak. Started from this small
process instead (nothing imported beyond the standard library), its peak RSS is its own.
"""

import json
import os
import sys
import time


def main() -> int:
    result, cmd = sys.argv[1], sys.argv[2:]
    start = time.perf_counter()
    pid = os.posix_spawnp(cmd[0], cmd, os.environ)
    _, status, usage = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    with open(result, "w") as f:
        json.dump({"seconds": time.perf_counter() - start, "peak_rss_mb": usage.ru_maxrss / 1024,
                   "returncode": code}, f)
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
