"""Run the chaos fault cases by hand and print the report table.

    python -m tests.chaos.run            # the short mode, as CI runs it
    python -m tests.chaos.run --long     # 100,000 input records, eight injections a fault
    python -m tests.chaos.run --long --records 20000 -k CopierPause

It runs ``tests/chaos/test_faults.py`` under pytest in a child process (so the assertions
are the same as in CI), collects each case's row through ``EOS_CHAOS_REPORT`` and prints
the table with the wall-clock time of the whole run. The exit status is pytest's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos.harness import load_rows, table


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--long", action="store_true", help="the long mode (100,000 records)")
    parser.add_argument("--records", type=int, help="input records of the long mode")
    parser.add_argument("-k", dest="select", help="pytest -k expression (fault class names)")
    args = parser.parse_args(argv)
    report = Path(tempfile.mkdtemp(prefix="eos-chaos-")) / "rows.jsonl"
    env = {**os.environ, "EOS_CHAOS_REPORT": str(report)}
    if args.long:
        env["EOS_CHAOS_LONG"] = "1"
    if args.records:
        env["EOS_CHAOS_RECORDS"] = str(args.records)
    command = [sys.executable, "-m", "pytest", str(Path(__file__).with_name("test_faults.py")),
               "-q", "-p", "no:cacheprovider"]  # fmt: skip
    if args.select:
        command += ["-k", args.select]
    started = time.monotonic()
    status = subprocess.run(command, env=env, check=False).returncode
    elapsed = time.monotonic() - started
    rows = load_rows(report)
    mode = "long" if args.long else "short"
    print(f"\nchaos report, {mode} mode, {elapsed / 60:.1f} minutes in all\n")
    print(table(rows))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
