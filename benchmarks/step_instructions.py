"""A step's instructions, counted by callgrind: a figure the machine's noise cannot move.

``loop.py`` and ``step_turns.py`` give a step's CPU time, which on shared cores moves by
more than most changes to a step (and a core that idled while the model answered runs the
next step slower). This counts the instructions instead: ``valgrind --tool=callgrind``
runs ``loop.py``'s child (one embedded turn, fresh ``$HARNESS_HOME``, the wire server in
a process of its own, which valgrind does not follow) at two lengths, and a step is the
difference over the steps between them, so start-up, imports and the turn's one-off work
cancel out. The same tree gives the same count to ~1 % run after run, whatever else the
machine is doing (not exactly: under callgrind a run is ~50 times slower, so what the
ledger batches by time, a 2 ms commit window, batches differently than in a real run)::

    python benchmarks/step_instructions.py                       # wire, steps 20 -> 120
    python benchmarks/step_instructions.py --path scripted
    python benchmarks/step_instructions.py --base ../base/.venv/bin/python

``--base`` names the Python of another checkout (its own venv and harness), counted the
same way with this tree's fixtures. ``--keep`` leaves callgrind's files for
``callgrind_annotate`` (the C functions: SQLite, pydantic-core, the interpreter). Needs
valgrind (Debian's package); about a minute of one core a tree.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loop  # noqa: E402  (the child run, its fixtures and the wire server)

_COLLECTED = re.compile(rb"Collected : (\d+)")


def compile_tree(python: str) -> None:
    """Write the tree's bytecode first, as ``loop.py`` does: otherwise each run would
    count the compiling of every module it imports (unequally, at two lengths)."""
    code = (
        "import compileall, pathlib, harness;"
        "compileall.compile_dir(pathlib.Path(harness.__file__).parent, quiet=1)"
    )
    subprocess.run([python, "-c", code], check=True)


def instructions(python: str, steps: int, wire: str | None, keep: Path | None) -> int:
    """Instructions of one child run of ``steps`` steps (all its threads)."""
    with tempfile.TemporaryDirectory(prefix="harness-instr-") as tmp:
        out = (keep or Path(tmp)) / f"callgrind.{Path(python).parent.parent.name}.{steps}.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            python,
            str(HERE / "loop.py"),
            "--child",
            str(steps),
            tmp,
        ]
        if wire is not None:
            command += ["--child-wire", wire]
        env = loop._env(Path(tmp) / "home")
        env["PYTHONHASHSEED"] = "0"  # the same dict and set orders, run after run
        done = subprocess.run(command, capture_output=True, env=env, timeout=1200)
        found = _COLLECTED.search(done.stderr)
        if done.returncode != 0 or found is None:
            tail = done.stderr.decode(errors="replace")[-2000:]
            raise SystemExit(f"the run of {steps} steps under callgrind failed:\n{tail}")
        return int(found.group(1))


def per_step(python: str, short: int, long: int, wire: str | None, keep: Path | None) -> float:
    compile_tree(python)
    return (instructions(python, long, wire, keep) - instructions(python, short, wire, keep)) / (
        long - short
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--path", choices=loop.PATHS, default="wire")
    parser.add_argument("--steps", type=int, nargs=2, default=(20, 120), metavar=("A", "B"))
    parser.add_argument("--base", help="the Python of another checkout, counted the same way")
    parser.add_argument("--keep", type=Path, help="a directory for callgrind's files")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    loop._use_project_venv()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    short, long = args.steps
    trees = [("this tree", sys.executable)]
    if args.base:
        trees.append(("base", args.base))
    with loop.WireServerProcess() as root:
        wire = root if args.path == "wire" else None
        counts = {name: per_step(python, short, long, wire, args.keep) for name, python in trees}
    for name, count in counts.items():
        print(f"{args.path} step, {name}: {count:,.0f} instructions (steps {short} -> {long})")
    if args.base:
        ratio = counts["this tree"] / counts["base"]
        print(f"this tree / base: ×{ratio:.3f} ({(ratio - 1) * 100:+.1f} %)")
    return 0


if __name__ == "__main__":
    os.chdir(loop.ROOT)
    sys.exit(main())
