"""The TensorFlow side of compare.py: one task of a tf.compat.v1 job (the
single process, the ps or a worker), run under the TensorFlow venv as
`VENV/bin/python compare.py tf-task ...` (compare.py imports this module only
there: it needs numpy and tensorflow).

Workers print one JSON line on stdout at the end, like tfjob-runtime's report:
`local_steps`, `timed_steps` and `loop_secs` (the steps after the first one
and the time they took: the first session.run builds and registers the
graph's partitions, which is startup), `global_step`, and for the chief the
model's figures (`loss`, `accuracy`, `auc`, `W`, `b`).
"""

import argparse
import gzip
import json
import os
import struct
import sys
import time
from dataclasses import dataclass, field

import numpy as np

# Set before TensorFlow is imported (compare.py sets it too).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1

# How long a worker waits for the chief to have initialised the variables.
CHIEF_READY_TIMEOUT_SECS = 300
# A step (after the first) that takes longer ends training with a warning:
# a safety net against a worker left waiting for a sync token.
STEP_TIMEOUT_MS = 30_000


# ---------------------------------------------------------------------------
# Hashing of libsvm feature ids, bit for bit as tfjob-runtime does it
# (runtime/src/hash.rs: Fnv1a, derive_seed; runtime/src/data/sparse.rs:
# feature_key): the same ids land in the same rows of the tables.

MASK64 = (1 << 64) - 1
SPARSE_KEY_SALT = 0x5350_4152_5345  # "SPARSE"


def fnv1a64(data: bytes) -> int:
    h = 0xCBF2_9CE4_8422_2325
    for byte in data:
        h ^= byte
        h = (h * 0x0000_0100_0000_01B3) & MASK64
    return h


def rotate_left64(x: int, bits: int) -> int:
    return ((x << bits) | (x >> (64 - bits))) & MASK64


def derive_seed(a: int, b: int, c: int) -> int:
    z = a ^ ((b * 0x9E37_79B9_7F4A_7C15) & MASK64) ^ ((rotate_left64(c, 29) * 0xD1B5_4A32_D192_ED03) & MASK64)
    z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & MASK64
    return z ^ (z >> 31)


def libsvm_feature_key(index: int) -> int:
    """The key of libsvm feature `index` (field 0, the index's 8 little-endian bytes)."""
    return derive_seed(fnv1a64((0).to_bytes(4, "little") + index.to_bytes(8, "little")), SPARSE_KEY_SALT, 0)


def check_hash_matches_runtime():
    """The values pinned by runtime/src/hash.rs's tests."""
    assert fnv1a64(b"a") == 0xAF63_DC4C_8601_EC8C
    assert fnv1a64(b"dense/kernel") == 0x00E8_6620_1259_BA30
    assert derive_seed(1, 2, 3) == 0x8855_71EF_44D9_CC9B
    assert derive_seed(MASK64, 5, 0x5350_4152_5345) == 0xC49A_BDF0_970F_2394


# ---------------------------------------------------------------------------
# Data, read and batched before training starts.


def read_idx(path):
    """An IDX file (gzipped) as a numpy array of its shape."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = struct.unpack(">" + "I" * dims, raw[4 : 4 + 4 * dims])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def read_mnist(data_dir, split):
    """Images scaled to [0, 1] and flattened, and labels, of `train` or `t10k`."""
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    pixels = images.reshape(len(images), -1).astype(np.float32) / 255.0
    return pixels, labels.astype(np.int64)


@dataclass
class SparseExamples:
    labels: list = field(default_factory=list)
    rows: list = field(default_factory=list)  # per example, its features' table rows
    values: list = field(default_factory=list)  # per example, its features' values


def read_libsvm(path, hash_buckets, limit=None):
    """Labels (0/1) and hashed rows of a libsvm file, as tfjob-runtime parses it."""
    rows_of_index = {}
    out = SparseExamples()
    with open(path) as f:
        for line in f:
            tokens = line.split("#", 1)[0].split()
            if not tokens:
                continue
            out.labels.append(1 if float(tokens[0]) == 1.0 else 0)
            rows, values = [], []
            for token in tokens[1:]:
                index, value = token.split(":")
                if index == "qid":
                    continue
                index = int(index)
                if index not in rows_of_index:
                    rows_of_index[index] = libsvm_feature_key(index) % hash_buckets
                rows.append(rows_of_index[index])
                values.append(float(value))
            out.rows.append(rows)
            out.values.append(values)
            if limit is not None and len(out.labels) >= limit:
                break
    return out


def worker_batches(num_examples, batch_size, worker_index, num_workers, wanted, seed):
    """Index arrays of this worker's batches: one shuffled epoch cut into
    full batches, dealt round-robin to the workers (together they cover the
    data once per epoch, as the runtime's shards do); at most `wanted` of
    them (the loop cycles through them); the shuffle drawn from `seed`."""
    order = np.random.RandomState(seed).permutation(num_examples)
    full_batches = num_examples // batch_size
    mine = range(worker_index, full_batches, num_workers)
    return [order[b * batch_size : (b + 1) * batch_size] for b in list(mine)[:wanted]]


# ---------------------------------------------------------------------------
# The workloads: each builds its graph (under the caller's device scope),
# gives the feed dicts of its training batches and of its evaluation, and
# turns the evaluation's results into figures.


def truncated_normal(stddev, seed):
    return tf1.truncated_normal_initializer(stddev=stddev, seed=seed)


class Linear:
    """y = 2x + 10 + noise on x = linspace(-1, 1, 101), as the runtime's
    synthetic_line (the noise drawn by numpy, not by the runtime's generator):
    pred = x*W + b, W and b from N(0, 1), loss mean((pred - y)^2), SGD."""

    learning_rate = 0.01

    def __init__(self, args):
        self.seed = args.seed
        self.batch_size = args.batch_size
        self.x = np.linspace(-1.0, 1.0, 101, dtype=np.float32).reshape(-1, 1)
        noise = np.random.RandomState(self.seed).standard_normal(101).astype(np.float32).reshape(-1, 1)
        self.y = 2.0 * self.x + 10.0 + 0.33 * noise

    def build(self, num_shards):
        self.inputs = tf1.placeholder(tf.float32, [None, 1], name="x")
        self.targets = tf1.placeholder(tf.float32, [None, 1], name="y")
        self.w = tf1.get_variable("dense/kernel", [1, 1], initializer=tf1.random_normal_initializer(seed=self.seed))
        self.b = tf1.get_variable("dense/bias", [1], initializer=tf1.random_normal_initializer(seed=self.seed + 1))
        prediction = tf.matmul(self.inputs, self.w) + self.b
        self.loss = tf.reduce_mean(tf.square(prediction - self.targets))
        return self.loss

    def optimizer(self):
        return tf1.train.GradientDescentOptimizer(self.learning_rate)

    def train_feeds(self, worker_index, num_workers, wanted):
        batches = worker_batches(len(self.x), self.batch_size, worker_index, num_workers, wanted, self.seed)
        return [{self.inputs: self.x[i], self.targets: self.y[i]} for i in batches]

    def evaluation(self):
        return [self.loss, self.w, self.b], {self.inputs: self.x, self.targets: self.y}

    def figures(self, results):
        loss, w, b = results
        return {"loss": float(loss), "W": float(w[0, 0]), "b": float(b[0])}


class Mlp:
    """784-100-10 on MNIST-format IDX files: sigmoid hidden layer (the
    runtime's default activation), softmax cross-entropy, weights from
    truncated_normal(1/sqrt(fan_in)), biases 0, pixels scaled to [0, 1], SGD."""

    learning_rate = 0.5
    hidden_units = 100

    def __init__(self, args):
        self.seed = args.seed
        self.batch_size = args.batch_size
        self.data_dir = args.data_dir
        self.eval_examples = args.eval_examples

    def build(self, num_shards):
        self.images = tf1.placeholder(tf.float32, [None, 784], name="images")
        self.labels = tf1.placeholder(tf.int64, [None], name="labels")
        hidden = tf.sigmoid(self.dense("dense", self.images, 784, self.hidden_units))
        logits = self.dense("dense_1", hidden, self.hidden_units, 10)
        self.loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=self.labels, logits=logits))
        self.accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), self.labels), tf.float32))
        return self.loss

    def dense(self, name, inputs, fan_in, units):
        with tf1.variable_scope(name):
            kernel = tf1.get_variable("kernel", [fan_in, units], initializer=truncated_normal(1.0 / np.sqrt(fan_in), self.seed))
            bias = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
        return tf.matmul(inputs, kernel) + bias

    def optimizer(self):
        return tf1.train.GradientDescentOptimizer(self.learning_rate)

    def train_feeds(self, worker_index, num_workers, wanted):
        pixels, labels = read_mnist(self.data_dir, "train")
        batches = worker_batches(len(pixels), self.batch_size, worker_index, num_workers, wanted, self.seed)
        return [{self.images: pixels[i], self.labels: labels[i]} for i in batches]

    def evaluation(self):
        pixels, labels = read_mnist(self.data_dir, "t10k")
        n = self.eval_examples
        return [self.loss, self.accuracy], {self.images: pixels[:n], self.labels: labels[:n]}

    def figures(self, results):
        loss, accuracy = results
        return {"loss": float(loss), "accuracy": float(accuracy)}


class ClickThrough:
    """sparse_lr, and wide_deep when `deep`: hashed libsvm features, the wide
    (linear) part `bias + sum(value * w[row])`, plus for wide_deep the deep
    part: embeddings of the same rows combined by mean, relu hidden layers,
    one logit; sigmoid cross-entropy; FTRL on every variable. The tables are
    partitioned over the ps tasks (fixed_size_partitioner)."""

    def __init__(self, args, deep):
        self.deep = deep
        self.seed = args.seed
        self.batch_size = args.batch_size
        self.learning_rate = args.learning_rate
        self.hash_buckets = args.hash_buckets
        self.hidden_units = [int(h) for h in args.hidden_units.split(",")] if deep else []
        self.embedding_dim = args.embedding_dim
        self.train_file = args.train_file
        self.eval_file = args.eval_file
        self.eval_examples = args.eval_examples

    def build(self, num_shards):
        self.ids = tf1.sparse_placeholder(tf.int64, name="ids")
        self.values = tf1.sparse_placeholder(tf.float32, name="values")
        self.labels = tf1.placeholder(tf.float32, [None], name="labels")
        partitioner = tf1.fixed_size_partitioner(num_shards)
        self.logits = self.wide_logits("wide" if self.deep else "linear", partitioner)
        if self.deep:
            self.logits += self.deep_logits(partitioner)
        self.loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=self.labels, logits=self.logits))
        return self.loss

    def wide_logits(self, scope, partitioner):
        with tf1.variable_scope(scope):
            weights = tf1.get_variable("weights", [self.hash_buckets, 1], initializer=tf1.zeros_initializer(), partitioner=partitioner)
            bias = tf1.get_variable("bias", [1], initializer=tf1.zeros_initializer())
        summed = tf1.nn.embedding_lookup_sparse(weights, self.ids, self.values, partition_strategy="div", combiner="sum")
        return summed[:, 0] + bias

    def deep_logits(self, partitioner):
        dim = self.embedding_dim
        with tf1.variable_scope("deep"):
            table = tf1.get_variable("embeddings", [self.hash_buckets, dim], initializer=truncated_normal(1.0 / np.sqrt(dim), self.seed), partitioner=partitioner)
            layer = tf1.nn.embedding_lookup_sparse(table, self.ids, self.values, partition_strategy="div", combiner="mean")
            fan_in = dim
            for k, units in enumerate(self.hidden_units):
                layer = tf.nn.relu(self.dense(f"hidden{k}", layer, fan_in, units, stddev=np.sqrt(2.0 / fan_in)))
                fan_in = units
            return self.dense("logits", layer, fan_in, 1, stddev=np.sqrt(1.0 / fan_in))[:, 0]

    def dense(self, name, inputs, fan_in, units, stddev):
        with tf1.variable_scope(name):
            kernel = tf1.get_variable("kernel", [fan_in, units], initializer=truncated_normal(stddev, self.seed))
            bias = tf1.get_variable("bias", [units], initializer=tf1.zeros_initializer())
        return tf.matmul(inputs, kernel) + bias

    def optimizer(self):
        return tf1.train.FtrlOptimizer(self.learning_rate, learning_rate_power=-0.5, initial_accumulator_value=0.1)

    def feed(self, examples, chosen):
        """The feed dict of examples `chosen` (indices) of `examples`."""
        indices, rows, values = [], [], []
        width = 1
        for position, e in enumerate(chosen):
            for j, (row, value) in enumerate(zip(examples.rows[e], examples.values[e])):
                indices.append((position, j))
                rows.append(row)
                values.append(value)
            width = max(width, len(examples.rows[e]))
        indices = np.array(indices, dtype=np.int64).reshape(-1, 2)
        shape = np.array([len(chosen), width], dtype=np.int64)
        return {
            self.ids: tf1.SparseTensorValue(indices, np.array(rows, dtype=np.int64), shape),
            self.values: tf1.SparseTensorValue(indices, np.array(values, dtype=np.float32), shape),
            self.labels: np.array([examples.labels[e] for e in chosen], dtype=np.float32),
        }

    def train_feeds(self, worker_index, num_workers, wanted):
        examples = read_libsvm(self.train_file, self.hash_buckets)
        batches = worker_batches(len(examples.labels), self.batch_size, worker_index, num_workers, wanted, self.seed)
        return [self.feed(examples, batch) for batch in batches]

    def evaluation(self):
        examples = read_libsvm(self.eval_file, self.hash_buckets, limit=self.eval_examples)
        self.eval_labels = np.array(examples.labels)
        return [self.loss, self.logits], self.feed(examples, range(len(examples.labels)))

    def figures(self, results):
        loss, logits = results
        accuracy = float(np.mean((logits > 0).astype(int) == self.eval_labels))
        return {"log_loss": float(loss), "accuracy": accuracy, "auc": exact_auc(logits, self.eval_labels)}


def exact_auc(scores, labels):
    """Area under the ROC curve by ranks, ties sharing their average rank (as the runtime computes it)."""
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores))
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    positives = float(np.sum(labels > 0))
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return None
    return float((np.sum(ranks[labels > 0]) - positives * (positives + 1) / 2) / (positives * negatives))


def make_workload(args):
    if args.workload == "linear":
        return Linear(args)
    if args.workload == "mlp":
        return Mlp(args)
    if args.workload in ("sparse_lr", "wide_deep"):
        return ClickThrough(args, deep=args.workload == "wide_deep")
    raise SystemExit(f"unknown workload {args.workload!r}")


# ---------------------------------------------------------------------------
# Tasks.


def cluster_spec(args):
    return tf1.train.ClusterSpec({"ps": args.ps_hosts.split(","), "worker": args.worker_hosts.split(",")})


def run_ps(args):
    server = tf1.train.Server(cluster_spec(args), job_name="ps", task_index=args.task_index)
    print(f"ps {args.task_index} serving on {server.target}", file=sys.stderr, flush=True)
    server.join()


def session_config(args):
    """Default thread pools (intra/inter op 0: TensorFlow picks one thread
    per core); a worker talks only to the ps tasks, not to the other workers."""
    if not args.ps_hosts:
        return tf1.ConfigProto()
    return tf1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{args.task_index}"])


@dataclass
class TrainingGraph:
    train_op: object
    global_step: object
    hooks: list


def build_training_graph(args, workload):
    """The workload's graph with its optimizer (sync: SyncReplicasOptimizer
    and its hook), placed by replica_device_setter in a cluster."""
    num_ps = len(args.ps_hosts.split(",")) if args.ps_hosts else 0
    device = None
    if num_ps:
        device = tf1.train.replica_device_setter(worker_device=f"/job:worker/task:{args.task_index}", cluster=cluster_spec(args))
    with tf1.device(device):
        global_step = tf1.train.get_or_create_global_step()
        loss = workload.build(max(1, num_ps))
        optimizer = workload.optimizer()
        hooks = []
        if args.mode == "sync":
            num_workers = len(args.worker_hosts.split(","))
            optimizer = tf1.train.SyncReplicasOptimizer(optimizer, replicas_to_aggregate=num_workers, total_num_replicas=num_workers)
            hooks.append(optimizer.make_session_run_hook(is_chief=args.task_index == 0))
        train_op = optimizer.minimize(loss, global_step=global_step)
    return TrainingGraph(train_op, global_step, hooks)


def wait_for_file(path, timeout_secs, what):
    deadline = time.monotonic() + timeout_secs
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} not ready within {timeout_secs} s ({path} missing)")
        time.sleep(0.02)


def mark_ready(ready_dir, name):
    open(os.path.join(ready_dir, name), "w").close()


def start_barrier(args, num_workers):
    """Every worker's session exists before anyone trains. A non-chief
    creates its session only once the chief has initialised the variables
    (MonitoredTrainingSession's worker would otherwise poll every 30 s); the
    chief starts training only once every worker has its session (so it
    does not train alone meanwhile). Returns what to call once this task's
    session exists."""
    if not args.ps_hosts:
        return lambda: None
    if args.task_index != 0:
        wait_for_file(os.path.join(args.ready_dir, "worker0"), CHIEF_READY_TIMEOUT_SECS, "the chief")
        return lambda: mark_ready(args.ready_dir, f"worker{args.task_index}")

    def chief_ready_then_wait_for_the_others():
        mark_ready(args.ready_dir, "worker0")
        for i in range(1, num_workers):
            wait_for_file(os.path.join(args.ready_dir, f"worker{i}"), CHIEF_READY_TIMEOUT_SECS, f"worker {i}")

    return chief_ready_then_wait_for_the_others


@dataclass
class LoopFigures:
    local_steps: int = 0
    timed_steps: int = 0
    loop_secs: float = 0.0
    global_step: int = 0
    step_timed_out: bool = False


def training_loop(sess, graph, feeds, train_steps):
    """Steps until the global step reaches `train_steps`, the way
    StopAtStepHook decides (the global step fetched with each step, read
    again alone near the end), without stopping the session: the chief
    evaluates with it afterwards. Times every step but the first."""
    figures = LoopFigures()
    timeout = tf1.RunOptions(timeout_in_ms=STEP_TIMEOUT_MS)
    first_done = None
    while True:
        feed = feeds[figures.local_steps % len(feeds)]
        try:
            _, step = sess.run([graph.train_op, graph.global_step], feed_dict=feed, options=timeout if figures.local_steps else None)
        except tf.errors.DeadlineExceededError:
            figures.step_timed_out = True
            break
        figures.local_steps += 1
        now = time.perf_counter()
        if first_done is None:
            first_done = now
        figures.loop_secs = now - first_done
        figures.timed_steps = figures.local_steps - 1
        if step + 1 >= train_steps:
            step = sess.run(graph.global_step)
            if step >= train_steps:
                break
    figures.global_step = int(sess.run(graph.global_step)) if not figures.step_timed_out else int(step)
    return figures


def run_worker(args, workload):
    clustered = bool(args.ps_hosts)
    is_chief = args.task_index == 0
    graph = build_training_graph(args, workload)
    num_workers = len(args.worker_hosts.split(",")) if clustered else 1
    feeds = workload.train_feeds(args.task_index, num_workers, wanted=args.train_steps + 2)
    eval_fetches, eval_feed = workload.evaluation() if is_chief else (None, None)
    master = ""
    if clustered:
        server = tf1.train.Server(cluster_spec(args), job_name="worker", task_index=args.task_index, config=session_config(args))
        master = server.target
    session_ready = start_barrier(args, num_workers)
    with tf1.train.MonitoredTrainingSession(master=master, is_chief=is_chief, hooks=graph.hooks, config=session_config(args), stop_grace_period_secs=2) as sess:
        session_ready()
        loop = training_loop(sess, graph, feeds, args.train_steps)
        report = {
            "task": f"worker:{args.task_index}" if clustered else "local",
            "chief": is_chief,
            "mode": args.mode,
            "batch_size": workload.batch_size,
            **loop.__dict__,
        }
        if is_chief:
            report.update(workload.figures(sess.run(eval_fetches, feed_dict=eval_feed)))
        print(json.dumps(report), flush=True)
        # Closing the session waits for the sync token queue's runner (up to
        # stop_grace_period_secs); the figures are out, so leave at once.
        sys.stderr.flush()
        os._exit(0)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="compare.py tf-task", description="One TensorFlow task of compare.py (internal).")
    p.add_argument("--workload", required=True, choices=["linear", "mlp", "sparse_lr", "wide_deep"])
    p.add_argument("--mode", required=True, choices=["single", "async", "sync"])
    p.add_argument("--job_name", default="worker", choices=["ps", "worker"])
    p.add_argument("--task_index", type=int, default=0)
    p.add_argument("--ps_hosts", default="")
    p.add_argument("--worker_hosts", default="")
    p.add_argument("--ready_dir", default="", help="where the workers mark their session ready (a cluster)")
    p.add_argument("--train_steps", type=int, default=1000)
    p.add_argument("--batch_size", type=int, required=True)
    p.add_argument("--learning_rate", type=float, default=0.1)
    p.add_argument("--eval_examples", type=int, default=500)
    p.add_argument("--data_dir", default="")
    p.add_argument("--train_file", default="")
    p.add_argument("--eval_file", default="")
    p.add_argument("--hash_buckets", type=int, default=1 << 20)
    p.add_argument("--hidden_units", default="64,32")
    p.add_argument("--embedding_dim", type=int, default=8)
    p.add_argument("--seed", type=int, default=1, help="of the initial values and the data's order")
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    check_hash_matches_runtime()
    tf1.disable_eager_execution()
    if args.job_name == "ps":
        run_ps(args)
    else:
        run_worker(args, make_workload(args))
