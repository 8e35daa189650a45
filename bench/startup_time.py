#!/usr/bin/env python3
"""Start-up time of `longtron train` (docs/benchmarks.md, "Start-up"): launches the command
REPEATS times, stamps every stderr line with the seconds since launch, and stops the run (its own
child process) once the line "step 1 begins" is printed. Prints, per run, the time of the first
line, of the end of the start-up ("start-up took": before the validation at step 0) and of step
1, and the load average before each run. Python standard library only.

  bench/startup_time.py REPEATS build/longtron train --config X.toml [...]
"""
import os
import statistics
import subprocess
import sys
import time


def one_run(cmd, echo):
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = begins = ready = None
    for line in p.stderr:
        t = time.monotonic() - t0
        if echo:
            sys.stdout.write(f"{t:7.2f}s  {line}")
        if first is None:
            first = t
        if "start-up took" in line:
            ready = t
        if "begins" in line:
            begins = t
            break
    p.kill()
    p.wait()
    return load, first, ready, begins


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    repeats = int(sys.argv[1])
    cmd = sys.argv[2:]
    rows = []
    for i in range(repeats):
        load, first, ready, begins = one_run(cmd, echo=(i == 0))
        if begins is None or ready is None:
            sys.exit("the run ended before step 1 (see the lines above)")
        rows.append((load, first, ready, begins))
        print(f"run {i + 1}: load {load:.1f}, first line {first:.2f} s, start-up {ready:.2f} s, "
              f"step 1 begins {begins:.2f} s")
    for k, what in ((2, "start-up"), (3, "step 1 begins")):
        b = [r[k] for r in rows]
        print(f"{what}: median {statistics.median(b):.2f} s, min {min(b):.2f}, max {max(b):.2f} "
              f"over {len(b)} runs")
    print(f"first line at most {max(r[1] for r in rows):.2f} s; "
          f"load average {min(r[0] for r in rows):.1f}-{max(r[0] for r in rows):.1f}")


if __name__ == "__main__":
    main()
