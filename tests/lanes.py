#!/usr/bin/env python3
"""Runs the workspace's test binaries in lanes: several binaries at once, longest first.

`cargo test` runs one test binary after another. Most of ours wait on a control plane, on
containers or on training processes for much of their time (the cores were 53 % busy with
one binary at a time, 82 % with two), so two binaries at once use the machine's two cores better. Binaries
cannot run at once under two `cargo test` commands: each holds the target directory's lock
while its tests run. So `tests/run.sh` builds them with `cargo test --no-run
--message-format=json` and this script runs the executables that build lists, as `cargo test`
would (working directory the package's, `CARGO_MANIFEST_DIR` and `CARGO_PKG_NAME` set), plus
one job that runs the doc tests with cargo.

Order: longest first (greedy, so the longest binary does not start last), by the durations of
the last run on this machine (`--durations`: `test-durations.tsv` in the target directory,
`test-durations-long.tsv` for the long run), else by
`tests/test-durations.tsv` (committed; binaries in neither go first). Each binary's output is
printed whole when it ends, in the form `cargo test` prints it (`Running ...`, the libtest
output), so the log reads as before, one binary after another.

Usage: lanes.py --messages FILE [--lanes N] [--durations FILE] [--doc 'SHELL COMMAND'] -- TEST-ARGS...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SEED_DURATIONS = Path(__file__).resolve().parent / "test-durations.tsv"


@dataclass
class Job:
    """One thing to run: a test binary, or the doc tests' cargo command."""

    name: str  # "<package> <target kind> <target name>", the key of the durations file
    argv: list[str]
    cwd: str
    env: dict[str, str]
    shown_as: str  # the header line, as cargo prints it


@dataclass
class Outcome:
    job: Job
    code: int
    seconds: float
    cpu_seconds: float
    output: str


def test_binaries(messages: Path, test_args: list[str]) -> list[Job]:
    """The executables of `cargo test --no-run --message-format=json`'s compiler-artifact lines."""
    jobs = []
    for line in messages.read_text().splitlines():
        if not line.startswith("{"):
            continue
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable") or not msg["profile"]["test"]:
            continue
        target, manifest = msg["target"], Path(msg["manifest_path"])
        package = package_name(msg["package_id"], manifest)
        kind = target["kind"][0]
        src = os.path.relpath(target["src_path"], manifest.parent)
        env = dict(os.environ, CARGO_MANIFEST_DIR=str(manifest.parent), CARGO_PKG_NAME=package)
        env.setdefault("CARGO", shutil.which("cargo") or "cargo")
        jobs.append(
            Job(
                name=f"{package} {kind} {target['name']}",
                argv=[msg["executable"], *test_args],
                cwd=str(manifest.parent),
                env=env,
                shown_as=f"     Running {src} ({msg['executable']})",
            )
        )
    return jobs


def package_name(package_id: str, manifest: Path) -> str:
    """`path+file:///.../runtime#tfjob-runtime@0.1.0` -> `tfjob-runtime`; the directory's name
    when the id has no name (`path+file:///.../tests#0.1.0`: the name is the directory's)."""
    fragment = package_id.rpartition("#")[2]
    name = fragment.partition("@")[0]
    if not name or name[0].isdigit():
        return manifest.parent.name
    return name


def read_durations(path: Path) -> dict[str, float]:
    """name -> seconds, from lines `seconds<TAB>name` (others, as comments, skipped)."""
    durations: dict[str, float] = {}
    if not path.is_file():
        return durations
    for line in path.read_text().splitlines():
        seconds, _, name = line.partition("\t")
        try:
            durations[name] = float(seconds)
        except ValueError:
            continue
    return durations


def write_durations(path: Path, outcomes: list[Outcome], known: dict[str, float]) -> None:
    merged = dict(known)
    merged.update({o.job.name: round(o.seconds, 1) for o in outcomes})
    lines = [f"{s}\t{n}" for n, s in sorted(merged.items(), key=lambda kv: -kv[1])]
    path.write_text("\n".join(lines) + "\n")


def longest_first(jobs: list[Job], durations: dict[str, float]) -> list[Job]:
    unknown = float("inf")
    return sorted(jobs, key=lambda j: -durations.get(j.name, unknown))


def run_job(job: Job) -> Outcome:
    started = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as out:
        child = subprocess.Popen(job.argv, cwd=job.cwd, env=job.env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        # wait4: the CPU time of the binary and of the processes it waited for (control plane,
        # training processes; not the containers, which podman's conmon runs).
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        output = out.read()
    return Outcome(job, child.returncode, time.monotonic() - started, usage.ru_utime + usage.ru_stime, output)


def run_lanes(jobs: list[Job], lanes: int) -> list[Outcome]:
    """Runs `jobs` on `lanes` threads, each taking the next job of the list when it is free;
    prints each job's output whole as it ends."""
    queue = list(reversed(jobs))
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def lane() -> None:
        while True:
            with lock:
                if not queue:
                    return
                job = queue.pop()
                # Said when it starts, so that a binary that hangs is named in the log.
                print(f"== started {job.name}", flush=True)
            outcome = run_job(job)
            with lock:
                outcomes.append(outcome)
                print_outcome(outcome)

    threads = [threading.Thread(target=lane) for _ in range(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def print_outcome(o: Outcome) -> None:
    verdict = "ok" if o.code == 0 else f"FAILED (exit {o.code})"
    print(o.job.shown_as)
    print(o.output, end="" if o.output.endswith("\n") else "\n")
    print(f"== {o.job.name}: {verdict}; {o.cpu_seconds:.0f} CPU-s; finished in {o.seconds:.2f}s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=Path, required=True, help="cargo test --no-run --message-format=json's output")
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--durations", type=Path, help="durations of the last run (read, then rewritten)")
    parser.add_argument("--doc", metavar="COMMAND", help="the shell command that runs the doc tests (one more job)")
    parser.add_argument("test_args", nargs="*", help="arguments of every test binary (after --)")
    args = parser.parse_args()

    jobs = test_binaries(args.messages, args.test_args)
    if not jobs:
        print(f"lanes.py: no test binary in {args.messages}", file=sys.stderr)
        return 2
    if args.doc:
        jobs.append(Job("doc tests", ["bash", "-c", args.doc], os.getcwd(), dict(os.environ), f"   Doc-tests ({args.doc})"))
    measured_here = read_durations(args.durations) if args.durations else {}
    durations = read_durations(SEED_DURATIONS) | measured_here
    print(f"== {len(jobs)} test jobs on {args.lanes} lanes, longest first", flush=True)
    outcomes = run_lanes(longest_first(jobs, durations), max(1, args.lanes))
    if args.durations:
        write_durations(args.durations, outcomes, measured_here)

    failed = [o for o in outcomes if o.code != 0]
    print("== seconds (CPU-seconds) per test job: " + ", ".join(f"{o.job.name} {o.seconds:.0f} ({o.cpu_seconds:.0f})" for o in sorted(outcomes, key=lambda o: -o.seconds)))
    if failed:
        print("== failed: " + ", ".join(o.job.name for o in failed))
        return 101
    return 0


if __name__ == "__main__":
    sys.exit(main())
