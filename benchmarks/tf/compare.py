#!/usr/bin/env python3
"""tfjob-runtime against TensorFlow's tf.compat.v1 parameter-server training,
side by side in one run: the same workloads, data and step counts, in a
single process, 1 ps + 2 workers async and 1 ps + 2 workers sync, rounds
alternating ours and TensorFlow's; prints a table of medians and writes every
figure to OUT/tf-compare.json. Run by hand, never in CI:

    python3 benchmarks/tf/compare.py --venv VENV [--runtime PATH] [--quick]
        [--rounds 3] [--only linear,mlp,sparse_lr,wide_deep] [--out DIR]

The orchestration needs only the standard library; the TensorFlow tasks are
this script again under VENV/bin/python (`compare.py tf-task ...`, see
tf_task.py). See README.md next to it for how the figures are counted.
"""

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SKIP_MESSAGE = "skipped: no TensorFlow venv; create one with python3 -m venv V && V/bin/pip install tensorflow-cpu==2.20.0"

WORKLOADS = ("linear", "mlp", "sparse_lr", "wide_deep")
CONFIGS = ("single", "async", "sync")
CONFIG_LABELS = {"single": "1 process", "async": "1ps+2w async", "sync": "1ps+2w sync"}
NUM_WORKERS = 2
# The shared data beside the checkout (as CI lays it out).
MNIST_DIR = str(REPO.parent / "shared" / "data" / "synthetic-mnist")
# A multiple of the sparse batch (256) and of the runtime's shard (10
# batches): every batch of both sides is full, so steps x batch counts exactly.
SPARSE_TRAIN_EXAMPLES = 20480
SPARSE_EVAL_FILE_EXAMPLES = 5000
HASH_BUCKETS = 1 << 20


@dataclass(frozen=True)
class Workload:
    name: str
    batch_size: int
    # Batches trained in all (global steps in single and async; sync takes half
    # as many global steps, each a batch per worker).
    full_steps: int
    quick_steps: int
    quality: tuple  # report keys shown in the table, the first one printed
    # Held-out examples the quality is measured on, all there are: on 500
    # MLP examples one example moved accuracy by 0.002 and our async runs'
    # accuracy spread 0.72-0.74 between rounds; on all 10,000, 0.737-0.739.
    eval_examples: int


WORKLOAD_SPECS = {
    "linear": Workload("linear", 1, full_steps=3000, quick_steps=300, quality=("loss", "W", "b"), eval_examples=500),
    "mlp": Workload("mlp", 100, full_steps=1000, quick_steps=100, quality=("accuracy", "loss"), eval_examples=10000),
    "sparse_lr": Workload("sparse_lr", 256, full_steps=1600, quick_steps=160, quality=("auc", "accuracy", "log_loss"), eval_examples=SPARSE_EVAL_FILE_EXAMPLES),
    "wide_deep": Workload("wide_deep", 256, full_steps=800, quick_steps=80, quality=("auc", "accuracy", "log_loss"), eval_examples=SPARSE_EVAL_FILE_EXAMPLES),
}


class RunFailed(Exception):
    pass


# ---------------------------------------------------------------------------
# Child processes: every one is registered, in its own process group, and
# killed (by its group id) when the script ends, however it ends.


class Children:
    def __init__(self):
        self.running = []

    def start(self, name, argv, log_dir, env=None):
        stdout_path = log_dir / f"{name}.stdout.log"
        stderr_path = log_dir / f"{name}.stderr.log"
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        with open(log_dir / f"{name}.cmd.txt", "w") as f:
            f.write(" ".join(argv) + "\n")
        child = Child(name, proc, stdout_path, stderr_path)
        self.running.append(child)
        return child

    def kill(self, child):
        if child.proc.poll() is None:
            try:
                os.killpg(child.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.proc.wait()
        if child in self.running:
            self.running.remove(child)

    def kill_all(self):
        for child in list(self.running):
            self.kill(child)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    stdout_path: Path
    stderr_path: Path

    def logs(self):
        return f"{self.stderr_path} (stdout: {self.stdout_path.name})"

    def report(self):
        """The last JSON line of its stdout."""
        for line in reversed(self.stdout_path.read_text(errors="replace").splitlines()):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    break
        raise RunFailed(f"{self.name}: no JSON report on its stdout; see {self.logs()}")


CHILDREN = Children()


def raise_on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


# A worker still running this long after its ps exited is stuck (ours' ps
# leaves by itself once training is over).
WORKER_OUTLIVES_PS_SECS = 15


def wait_for(children, timeout_secs, watched=()):
    """Waits for `children` to exit 0. Fails, naming the log, as soon as one
    of them or of the `watched` (a ps) exits otherwise, when a child outlives
    a watched one by WORKER_OUTLIVES_PS_SECS, or at the timeout."""
    deadline = time.monotonic() + timeout_secs
    pending = list(children)
    watched_exits = {}
    while pending:
        for child in list(pending) + list(watched):
            code = child.proc.poll()
            if code is None:
                continue
            if code != 0:
                raise RunFailed(f"{child.name} failed (exit code {code}); see {child.logs()}\n{tail(child.stderr_path)}")
            if child in pending:
                pending.remove(child)
            else:
                watched_exits.setdefault(child.name, time.monotonic())
        now = time.monotonic()
        for name, exited in watched_exits.items():
            if pending and now - exited > WORKER_OUTLIVES_PS_SECS:
                stuck = pending[0]
                raise RunFailed(f"{stuck.name} still running {now - exited:.0f} s after {name} exited; see {stuck.logs()}\n{tail(stuck.stderr_path)}")
        if pending and now > deadline:
            raise RunFailed(f"{pending[0].name} still running after {timeout_secs} s; see {pending[0].logs()}")
        time.sleep(0.02)


def tail(path, lines=8):
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join("    | " + line for line in text)


def free_ports(count):
    """Ports the kernel hands out for port 0 (closed again: a tiny race)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class Cluster:
    ps_hosts: str
    worker_hosts: str

    @staticmethod
    def on_free_ports():
        ports = free_ports(1 + NUM_WORKERS)
        return Cluster(f"127.0.0.1:{ports[0]}", ",".join(f"127.0.0.1:{p}" for p in ports[1:]))


# ---------------------------------------------------------------------------
# One run of one workload in one configuration, on either side: the workers'
# reports reduced to examples/s the same way for both.


@dataclass
class RunResult:
    side: str
    workload: str
    config: str
    round: int
    train_steps: int
    examples: int = 0
    loop_secs: float = 0.0
    examples_per_sec: float = 0.0
    wall_secs: float = 0.0  # the whole run: start-up, training, evaluation, shutdown
    quality: dict = field(default_factory=dict)
    reports: list = field(default_factory=list)
    warnings: list = field(default_factory=list)


def examples_per_sec(per_worker):
    """(examples, loop seconds) per worker -> total examples, the longest loop, their ratio."""
    examples = sum(e for e, _ in per_worker)
    longest = max(s for _, s in per_worker)
    return examples, longest, (examples / longest if longest > 0 else float("nan"))


def ours_worker_figures(report, batch_size):
    steps = report["local_steps"]
    return steps * batch_size, steps / report["steps_per_sec"] if report["steps_per_sec"] > 0 else 0.0


def tf_worker_figures(report, batch_size):
    return report["timed_steps"] * batch_size, report["loop_secs"]


def steps_for(workload, config, quick):
    batches = workload.quick_steps if quick else workload.full_steps
    return batches // NUM_WORKERS if config == "sync" else batches


@dataclass
class Setup:
    runtime: Path
    venv_python: Path
    sparse_dir: Path
    log_dir: Path
    quick: bool
    timeout_secs: int


def ours_flags(workload, setup):
    common = ["--log_every_steps=0", f"--eval_examples={workload.eval_examples}"]
    if workload.name == "linear":
        return common + ["--model=linear", "--learning_rate=0.01", "--batch_size=1"]
    if workload.name == "mlp":
        # --activation=sigmoid is the runtime's default, said for the reader.
        return common + ["--model=mlp", "--hidden_units=100", "--activation=sigmoid", "--batch_size=100", "--learning_rate=0.5", f"--data_dir={MNIST_DIR}"]
    flags = [
        f"--model={workload.name}",
        "--data_format=libsvm",
        f"--train_files={setup.sparse_dir / 'train.txt'}",
        f"--eval_files={setup.sparse_dir / 'eval.txt'}",
        "--batch_size=256",
        "--optimizer=ftrl",
        "--learning_rate=0.1",
        f"--hash_buckets={HASH_BUCKETS}",
    ]
    if workload.name == "wide_deep":
        flags += ["--hidden_units=64,32", "--embedding_dim=8"]
    return common + flags


def tf_flags(workload, setup):
    flags = [f"--workload={workload.name}", f"--batch_size={workload.batch_size}", f"--eval_examples={workload.eval_examples}"]
    if workload.name == "mlp":
        flags.append(f"--data_dir={MNIST_DIR}")
    if workload.name in ("sparse_lr", "wide_deep"):
        flags += [
            f"--train_file={setup.sparse_dir / 'train.txt'}",
            f"--eval_file={setup.sparse_dir / 'eval.txt'}",
            "--learning_rate=0.1",
            f"--hash_buckets={HASH_BUCKETS}",
            "--hidden_units=64,32",
            "--embedding_dim=8",
        ]
    return flags


def run_ours(workload, config, round_index, setup):
    steps = steps_for(workload, config, setup.quick)
    base = [str(setup.runtime)] + ours_flags(workload, setup) + [f"--train_steps={steps}", f"--seed={round_index}"]
    prefix = f"r{round_index}-{workload.name}-{config}-ours"
    if config == "single":
        child = CHILDREN.start(f"{prefix}-local", base + ["--sync_replicas=false"], setup.log_dir)
        wait_for([child], setup.timeout_secs)
        return reduce_reports("ours", workload, config, round_index, steps, [child.report()], ours_worker_figures)
    cluster = Cluster.on_free_ports()
    clustered = base + [
        f"--ps_hosts={cluster.ps_hosts}",
        f"--worker_hosts={cluster.worker_hosts}",
        "--bind=127.0.0.1",
        "--shutdown_grace_secs=5",
        f"--sync_replicas={'true' if config == 'sync' else 'false'}",
    ]
    ps = CHILDREN.start(f"{prefix}-ps0", clustered + ["--job_name=ps", "--task_index=0"], setup.log_dir)
    workers = [CHILDREN.start(f"{prefix}-worker{i}", clustered + ["--job_name=worker", f"--task_index={i}"], setup.log_dir) for i in range(NUM_WORKERS)]
    try:
        wait_for(workers, setup.timeout_secs, watched=[ps])
        reports = [w.report() for w in workers]
    finally:
        stop_ps(ps)
    return reduce_reports("ours", workload, config, round_index, steps, reports, ours_worker_figures)


def stop_ps(ps, grace_secs=6.0):
    """Ours leaves by itself once the workers are done (--shutdown_grace_secs);
    TensorFlow's ps serves forever. Either way it is gone after this."""
    try:
        ps.proc.wait(timeout=grace_secs)
    except subprocess.TimeoutExpired:
        pass
    CHILDREN.kill(ps)


def tf_env():
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("TF_CONFIG", None)
    return env


def run_tf(workload, config, round_index, setup):
    steps = steps_for(workload, config, setup.quick)
    base = [str(setup.venv_python), str(Path(__file__).resolve()), "tf-task"] + tf_flags(workload, setup) + [f"--train_steps={steps}", f"--mode={config}", f"--seed={round_index}"]
    prefix = f"r{round_index}-{workload.name}-{config}-tf"
    if config == "single":
        child = CHILDREN.start(f"{prefix}-local", base, setup.log_dir, env=tf_env())
        wait_for([child], setup.timeout_secs)
        return reduce_reports("tf", workload, config, round_index, steps, [child.report()], tf_worker_figures)
    cluster = Cluster.on_free_ports()
    ready_dir = setup.log_dir / f"{prefix}.ready"
    shutil.rmtree(ready_dir, ignore_errors=True)
    ready_dir.mkdir()
    clustered = base + [f"--ps_hosts={cluster.ps_hosts}", f"--worker_hosts={cluster.worker_hosts}", f"--ready_dir={ready_dir}"]
    ps = CHILDREN.start(f"{prefix}-ps0", clustered + ["--job_name=ps", "--task_index=0"], setup.log_dir, env=tf_env())
    workers = [CHILDREN.start(f"{prefix}-worker{i}", clustered + ["--job_name=worker", f"--task_index={i}"], setup.log_dir, env=tf_env()) for i in range(NUM_WORKERS)]
    try:
        wait_for(workers, setup.timeout_secs, watched=[ps])
        reports = [w.report() for w in workers]
    finally:
        CHILDREN.kill(ps)
        shutil.rmtree(ready_dir, ignore_errors=True)
    return reduce_reports("tf", workload, config, round_index, steps, reports, tf_worker_figures)


def reduce_reports(side, workload, config, round_index, steps, reports, worker_figures):
    result = RunResult(side, workload.name, config, round_index, steps, reports=reports)
    result.examples, result.loop_secs, result.examples_per_sec = examples_per_sec([worker_figures(r, workload.batch_size) for r in reports])
    chief = reports[0]
    result.quality = {k: chief[k] for k in workload.quality if chief.get(k) is not None}
    for r in reports:
        if r.get("step_timed_out"):
            result.warnings.append(f"{r.get('task')}: a step timed out at global step {r.get('global_step')} of {steps}; its figures end there")
    return result


# ---------------------------------------------------------------------------
# Preparation: the venv, the runtime, the generated click-through data.


def tensorflow_version(venv):
    """TensorFlow's version in the venv, or None when it cannot be imported."""
    if venv is None:
        return None
    python = Path(venv) / "bin" / "python"
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", "import tensorflow as tf; print(tf.__version__)"], capture_output=True, text=True, env=tf_env(), timeout=300
    )
    return probe.stdout.strip().splitlines()[-1] if probe.returncode == 0 and probe.stdout.strip() else None


def generate_sparse_data(runtime, out_dir, log_dir):
    """train.txt and eval.txt in libsvm by the runtime's generator; its report (with the achievable AUC)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(runtime), "generate", "--data_format", "libsvm", "--out", str(out_dir),
        "--train_examples", str(SPARSE_TRAIN_EXAMPLES), "--eval_examples", str(SPARSE_EVAL_FILE_EXAMPLES),
    ]  # fmt: skip
    child = CHILDREN.start("generate-libsvm", argv, log_dir)
    wait_for([child], 300)
    try:
        return child.report()
    except RunFailed:
        return {}


def clear_old_logs(log_dir):
    for path in log_dir.glob("*"):
        if path.is_file() and path.name.endswith((".log", ".cmd.txt")):
            path.unlink()


# ---------------------------------------------------------------------------
# The table and the JSON.


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def summarize(results, workloads):
    """Medians of the rates per (workload, configuration, side), with each
    side's single-process rate; means of the quality over the rounds, each
    round trained from its own seed (initial values and data order) on both
    sides: one seed's draw alone moved the MLP's accuracy by ±0.007."""
    def pick(name, config, side):
        return [r for r in results if r.workload == name and r.config == config and r.side == side]

    rows = []
    for workload in workloads:
        single = {side: median([r.examples_per_sec for r in pick(workload.name, "single", side)]) for side in ("ours", "tf")}
        for config in CONFIGS:
            row = {"workload": workload.name, "config": config}
            for side in ("ours", "tf"):
                runs = pick(workload.name, config, side)
                row[f"{side}_examples_per_sec"] = median([r.examples_per_sec for r in runs])
                row[f"{side}_single_examples_per_sec"] = single[side]
                row[f"{side}_quality"] = {k: mean([r.quality.get(k) for r in runs]) for k in workload.quality}
                row[f"{side}_rounds"] = len(runs)
            ours, theirs = row["ours_examples_per_sec"], row["tf_examples_per_sec"]
            row["ratio_ours_over_tf"] = ours / theirs if ours and theirs else None
            rows.append(row)
    return rows


def format_rate(value):
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def format_quality(key, quality):
    value = quality.get(key)
    return "-" if value is None else f"{key} {value:.3f}"


def print_table(rows, workloads):
    quality_key = {w.name: w.quality[0] for w in workloads}
    header = ["workload", "configuration", "ours ex/s", "TF ex/s", "ours/TF", "ours 1-proc ex/s", "TF 1-proc ex/s", "ours quality", "TF quality"]
    lines = [header]
    for row in rows:
        key = quality_key[row["workload"]]
        ratio = row["ratio_ours_over_tf"]
        lines.append([
            row["workload"], CONFIG_LABELS[row["config"]],
            format_rate(row["ours_examples_per_sec"]), format_rate(row["tf_examples_per_sec"]),
            "-" if ratio is None else f"{ratio:.2f}",
            format_rate(row["ours_single_examples_per_sec"]), format_rate(row["tf_single_examples_per_sec"]),
            format_quality(key, row["ours_quality"]), format_quality(key, row["tf_quality"]),
        ])  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    left_aligned = {0, 1, 7, 8}
    for n, line in enumerate(lines):
        cells = [cell.ljust(w) if i in left_aligned else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))]
        print("  ".join(cells).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def draw_picture(runtime, json_path):
    """The picture (ours, TensorFlow and our single process per workload),
    drawn by tfjob-bench from the JSON: this script keeps to the standard
    library. tfjob-bench is built next to tfjob-runtime by cargo build --release."""
    bench = runtime.parent / "tfjob-bench"
    command = [str(bench), "--plot-tf", str(json_path)]
    if not os.access(bench, os.X_OK):
        print(f"no picture: no tfjob-bench beside {runtime}; draw it later with {' '.join(command)}", flush=True)
        return
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode == 0:
        print(f"picture: {done.stdout.strip()}", flush=True)
    else:
        print(f"no picture: {' '.join(command)} failed: {done.stderr.strip()}", file=sys.stderr, flush=True)


def write_json(path, meta, results, rows):
    document = {"meta": meta, "summary": rows, "runs": [r.__dict__ for r in results]}
    path.write_text(json.dumps(document, indent=2) + "\n")


# ---------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--venv", help="a venv with tensorflow(-cpu) 2.x installed")
    p.add_argument("--runtime", default=str(REPO / "target" / "release" / "tfjob-runtime"), help="the tfjob-runtime binary (default: target/release/tfjob-runtime)")
    p.add_argument("--quick", action="store_true", help="tiny step counts (a smoke test; the rates mean little)")
    p.add_argument("--rounds", type=int, help="rounds, each ours then TensorFlow per run (default 3; 1 with --quick)")
    p.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workloads (default: all of %(default)s)")
    p.add_argument("--out", default="bench-out/tf", help="where tf-compare.json and logs/ go (default %(default)s)")
    args = p.parse_args(argv)
    args.workloads = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = [w for w in args.workloads if w not in WORKLOAD_SPECS]
    if unknown or not args.workloads:
        p.error(f"--only: unknown workload(s) {unknown} (choose from {', '.join(WORKLOADS)})")
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    return args


def compare(args):
    tf_version = tensorflow_version(args.venv)
    if tf_version is None:
        print(SKIP_MESSAGE)
        return 0
    runtime = Path(args.runtime).resolve()
    if not os.access(runtime, os.X_OK):
        print(f"error: no tfjob-runtime binary at {runtime} (build it with cargo build --release, or give --runtime)", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    clear_old_logs(log_dir)
    workloads = [WORKLOAD_SPECS[name] for name in args.workloads]
    setup = Setup(runtime, Path(args.venv) / "bin" / "python", out / "data" / "libsvm", log_dir, args.quick, timeout_secs=180 if args.quick else 900)
    meta = {
        "tensorflow": tf_version,
        "runtime": str(runtime),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "quick": args.quick,
        "rounds": args.rounds,
        "workers": NUM_WORKERS,
        "batches_per_run": {w.name: (w.quick_steps if args.quick else w.full_steps) for w in workloads},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    print(f"TensorFlow {tf_version} ({setup.venv_python}) vs {runtime}; {args.rounds} round(s){', quick' if args.quick else ''}; logs in {log_dir}")
    results, failures = [], []
    interrupted = False
    try:
        if any(w.name in ("sparse_lr", "wide_deep") for w in workloads):
            meta["generated_libsvm"] = generate_sparse_data(runtime, setup.sparse_dir, log_dir)
        run_rounds(args.rounds, workloads, setup, results, failures)
    except RunFailed as failure:
        failures.append(str(failure))
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: every child process stopped; the figures so far follow", file=sys.stderr)
    CHILDREN.kill_all()
    meta["failures"] = failures
    meta["interrupted"] = interrupted
    rows = summarize(results, workloads)
    json_path = out / "tf-compare.json"
    write_json(json_path, meta, results, rows)
    if results:
        print()
        print_table(rows, workloads)
        print_notes(results, meta)
    print(f"\nall figures: {json_path}", flush=True)
    if results:
        draw_picture(runtime, json_path)
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    if interrupted:
        return 130
    return 1 if failures else 0


def run_rounds(rounds, workloads, setup, results, failures):
    """Every run of every round, ours then TensorFlow's, appended to `results`
    as they end; a failed run is said at once, kept in `failures`, and the
    others go on (its processes killed)."""
    for round_index in range(1, rounds + 1):
        for workload in workloads:
            for config in CONFIGS:
                for side, run in (("ours", run_ours), ("tf", run_tf)):
                    started = time.monotonic()
                    try:
                        result = run(workload, config, round_index, setup)
                    except RunFailed as failure:
                        CHILDREN.kill_all()
                        failures.append(f"round {round_index} {workload.name} {CONFIG_LABELS[config]} {side}: {failure}")
                        print(f"  round {round_index} {workload.name:9} {CONFIG_LABELS[config]:13} {side:4}: FAILED: {failure}", flush=True)
                        continue
                    result.wall_secs = time.monotonic() - started
                    results.append(result)
                    print(progress_line(result), flush=True)


def progress_line(r):
    quality = ", ".join(f"{k} {v:.4g}" for k, v in r.quality.items())
    warn = f"  WARNING: {'; '.join(r.warnings)}" if r.warnings else ""
    return (
        f"  round {r.round} {r.workload:9} {CONFIG_LABELS[r.config]:13} {r.side:4}: {r.examples_per_sec:12,.0f} ex/s "
        f"({r.examples} examples in {r.loop_secs:.3g} s, run {r.wall_secs:.1f} s; {quality}){warn}"
    )


def print_notes(results, meta):
    auc = meta.get("generated_libsvm", {}).get("achievable_auc")
    if auc is not None:
        print(f"\nlibsvm data: {SPARSE_TRAIN_EXAMPLES} training examples; the true model's AUC on the held-out file: {auc:.3f}")
    print("examples/s: examples of every worker's steps over the longest worker's training loop (TF: its first step, the graph's setup, left out); medians of the rounds; quality: means of the rounds, round k trained from seed k on both sides")
    warnings = [w for r in results for w in r.warnings]
    for w in warnings:
        print(f"warning: {w}")


def main(argv):
    if argv and argv[0] == "tf-task":
        sys.dont_write_bytecode = True  # no __pycache__ in the source tree
        sys.path.insert(0, str(HERE))
        import tf_task

        return tf_task.main(argv[1:])
    args = parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, raise_on_signal)
    try:
        return compare(args)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every child process", file=sys.stderr)
        return 130
    finally:
        CHILDREN.kill_all()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]) or 0)
