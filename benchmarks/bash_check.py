"""What checking a bash command costs (issue 11): parse, normalize, build the needs.

Run from the repository root::

    python benchmarks/bash_check.py            # 500 rounds per command
    python benchmarks/bash_check.py --rounds 50 --quick

For each command of a typical mix, ``bash_needs`` runs ``--rounds`` times with the parse
cache cleared before each call, so every call parses afresh (the cache only helps when the
same line is checked twice). It prints p50/p90 per command in microseconds, and the cost
of loading the parser (importing tree_sitter and tree_sitter_bash, built once per process),
measured in a fresh interpreter. Target: well under 1 ms per typical command.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "bash_check.json"
COMMANDS = [
    "git status",
    "ls -la && npm run build | tee build.log",
    "FOO=1 make test 2>&1 | tail -20",
    "git commit -m \"$(cat <<'EOF'\nfix: the parser\n\nlonger body\nEOF\n)\" && git push",
    "find . -name '*.py' -exec grep -l foo {} \\; | xargs sed -i 's/a/b/'",
    "for f in $(ls src); do echo \"$f\" >> out.txt; done",
    "bash -c 'cd sub && pytest -q -x tests/test_a.py'",
]
# In a fresh interpreter with harness imported: the first check imports tree_sitter and
# tree_sitter_bash and builds the parser.
LOAD = (
    "from harness.permissions.shell import analyze; import time; t = time.perf_counter();"
    "analyze('true'); print((time.perf_counter() - t) * 1000)"
)


def per_command(rounds: int) -> list[dict[str, object]]:
    from harness.permissions.bash import bash_needs
    from harness.permissions.shell import analyze

    bash_needs("true")  # the parser is built once per process: not part of a call
    rows: list[dict[str, object]] = []
    for command in COMMANDS:
        times: list[float] = []
        for _ in range(rounds):
            analyze.cache_clear()
            start = time.perf_counter()
            needs = bash_needs(command)
            times.append((time.perf_counter() - start) * 1e6)
        times.sort()
        rows.append(
            {
                "command": command,
                "needs": len(needs),
                "p50_us": round(statistics.median(times), 1),
                "p90_us": round(times[int(len(times) * 0.9)], 1),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--quick", action="store_true", help="do not write the results file")
    args = parser.parse_args()
    rows = per_command(args.rounds)
    loads = [
        float(subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True,
                             check=True).stdout)
        for _ in range(5)
    ]  # fmt: skip
    for row in rows:
        shown = str(row["command"]).replace("\n", "\\n")[:60]
        print(f"{row['p50_us']:>8} us p50 {row['p90_us']:>8} us p90  {row['needs']} needs  {shown}")
    print(f"first check in a process (parser imports): {statistics.median(loads):.1f} ms")
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "rounds": args.rounds,
        "commands": rows,
        "first_check_ms": round(statistics.median(loads), 1),
    }
    if not args.quick:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
