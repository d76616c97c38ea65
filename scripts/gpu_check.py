"""GPU readiness check (issue 16): every CUDA path of a generated benchmark in one run.

A GPU is lent to this project only now and then, for about 15 minutes including
start-up, so everything that needs one runs here, in one process tree, within a time
budget (``--budget-s``, default 330 s), and ends in ONE table: one row per check
(name, status OK/FAIL/SKIP, key numbers, detail). The exit status is 1 if any row
FAILed, 3 without CUDA (unless ``--dry-run``), else 0.

Checks (rows):

* ``streams``        a two-stream model captured on cuda, generated with ``--kineto``,
                     replayed with a profile: kernels per stream, ``with _on(`` blocks
                     and events, eager vs original vs replay time;
* ``trace:<name>``   the real GPU traces in ../shared/traces, one iteration each
                     (``--warmup 0 --iters 1``); with a Kineto pair, recorded vs replayed
                     kernel time; ``skipped_at_runtime``;
* ``cuda-graph``     ``--cuda-graph`` on a captured training step, vs the eager replay;
* ``dtype-bf16``     ``--dtype bfloat16`` on a GPU trace, nothing skipped at run time;
* ``nccl-1rank``     the DDP collectives of the ResNet-50 trace on a one-rank nccl group;
* ``nccl-2rank``     a 2-rank DDP step captured and replayed under torchrun (>= 2 GPUs);
* ``device-map``     a trace recorded on ``cuda:7`` replayed with ``--device cuda:0``;
* ``memory-check``   a 1 TiB tensor: the benchmark must refuse with its message;
* ``cross-device``   a transformer, a CNN and an LSTM training step captured on cuda
                     replayed on cpu, and captured on cpu replayed on cuda: nothing
                     skipped at run time (backend kernels run their portable
                     equivalents);
* ``fidelity``       three zoo models (transformer, CNN, embeddings; on a dry run the
                     first) captured and replayed: median and worst time error, host
                     gaps off, recorded and scaled.

``--dry-run`` runs every step it can on CPU (smaller models, the small traces, a
quarter of the timed iterations; ``--big`` adds the costly traces and ranks) and
reports what needs CUDA as SKIP with the reason, so that this script is tested on
every commit (tests/test_gpu_check.py) and is not first run on the borrowed GPU.

Only the CLI (``python -m mystique_gen.cli``) and ``mystique_gen.tools.capture`` are used:
the package's internal modules move, those two stay.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The shared traces beside the checkout, else a copy inside it (a lent GPU machine gets
# the checkout alone: copy them into an ignored shared/ folder that travels with it).
SHARED = next((p for p in (ROOT.parent / "shared" / "traces", ROOT / "shared" / "traces")
               if p.is_dir()), ROOT.parent / "shared" / "traces")
EXIT_NO_CUDA = 3
OK, FAIL, SKIP = "OK", "FAIL", "SKIP"
# Every row the table holds, in order (tests/test_gpu_check.py asserts each is printed).
ROWS = ("streams", "trace:linear", "trace:simple_add", "trace:resnet50", "trace:gpt2",
        "cuda-graph", "dtype-bf16", "nccl-1rank", "nccl-2rank", "device-map", "memory-check",
        "cross-device", "fidelity")
FIDELITY_MODELS = ("transformer", "cnn", "embedding")
# Captured on the GPU and on the host, each replayed on the other device: autograd calls
# backend kernels directly (cuDNN's batch-norm backward, a fused attention's backward).
CROSS_MODELS = ("transformer", "cnn", "lstm")
# Real traces: (row, file, Kineto pair or None, cost on CPU that makes it opt-in there).
TRACES = (
    # PARAM's linear model runs 3.7 s an iteration on one CPU thread, and make test's
    # conformance tests replay it already: the dry run's real-trace row is simple_add's.
    ("trace:linear", "param/linear_et.json.gz", None, "~12 s"),
    ("trace:simple_add", "hta/simple_add_et.json.gz", "hta/simple_add_kineto.json.gz", None),
    ("trace:resnet50", "param/resnet50_1gpu_et.json.gz", None, "~30 s and 4 GB"),
    ("trace:gpt2", "param/hf_gpt2_et.json.gz", None, "~74 s and 14 GB"),
)
MEMORY_RE = re.compile(r"mystique: needs ([\d.]+) GiB on (\S+) but ([\d.]+) GiB are free")


class CheckFailed(Exception):
    """A check's assertion did not hold (the row FAILs with this message)."""


class BudgetSpent(Exception):
    """Too little of the time budget is left to start this step (the row is SKIPped)."""


@dataclass
class Row:
    name: str
    status: str
    numbers: str = ""
    detail: str = ""


@dataclass
class Config:
    work: Path
    dry_run: bool
    big: bool
    budget_s: float
    only: frozenset[str] | None
    python: str = sys.executable


# --------------------------------------------------------------------------- models
# Built inside the capture child (``--_capture``); ``small`` shrinks them for CPU.


def _two_streams(device: str, small: bool) -> Callable[[], object]:
    import torch

    n = 256 if small else 2048
    dev = torch.device(device)
    side = torch.cuda.Stream() if dev.type == "cuda" else None
    a, b, c, d = (torch.randn(n, n, device=dev) for _ in range(4))
    on_side = torch.cuda.stream(side) if side is not None else contextlib.nullcontext()

    def step() -> object:
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        x = a @ b
        with on_side:
            y = torch.relu(c @ d)  # independent work overlapping on the side stream
        x = torch.relu(x @ b)
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)
        return x + y  # joins the two streams' results

    return step


def _train(model: Any, opt: Any, loss_of: Callable[[], Any]) -> Callable[[], object]:
    def step() -> object:
        opt.zero_grad()
        loss_of().backward()
        opt.step()
        return None

    return step


def _mlp(device: str, small: bool) -> Callable[[], object]:
    import torch

    width = 64 if small else 1024
    model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.ReLU(),
                                torch.nn.Linear(4 * width, 10)).to(device)
    # SGD with momentum: device-only ops, so the whole step can live in a CUDA graph.
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(32 if small else 256, width, device=device)
    y = torch.randint(0, 10, (x.shape[0],), device=device)
    return _train(model, opt, lambda: torch.nn.functional.cross_entropy(model(x), y))


def _transformer(device: str, small: bool) -> Callable[[], object]:
    import torch

    d = 32 if small else 512
    layer = torch.nn.TransformerEncoderLayer(d_model=d, nhead=4, dim_feedforward=2 * d,
                                             dropout=0.0, batch_first=True).to(device)
    head = torch.nn.Linear(d, d).to(device)
    opt = torch.optim.AdamW(list(layer.parameters()) + list(head.parameters()), lr=1e-3)
    x = torch.randn(2 if small else 8, 8 if small else 128, d, device=device)
    return _train(layer, opt, lambda: head(layer(x)).pow(2).mean())


def _cnn(device: str, small: bool) -> Callable[[], object]:
    import torch

    ch, size = (8, 16) if small else (64, 64)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, ch, 3, padding=1), torch.nn.BatchNorm2d(ch), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(ch, 2 * ch, 3, stride=2),
        torch.nn.BatchNorm2d(2 * ch), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(2 * ch, 5)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(4 if small else 32, 3, size, size, device=device)
    y = torch.randint(0, 5, (x.shape[0],), device=device)
    return _train(model, opt, lambda: torch.nn.functional.cross_entropy(model(x), y))


def _lstm(device: str, small: bool) -> Callable[[], object]:
    """A 2-layer bidirectional LSTM's training step (cuDNN's network on a GPU, oneDNN's
    layers on the host: autograd calls each one's backward by name)."""
    import torch

    width = 16 if small else 256
    net = torch.nn.LSTM(width, width, num_layers=2, bidirectional=True).to(device)
    head = torch.nn.Linear(2 * width, 1).to(device)
    opt = torch.optim.SGD(list(net.parameters()) + list(head.parameters()), lr=0.01)
    x = torch.randn(12 if small else 64, 4 if small else 32, width, device=device)
    return _train(net, opt, lambda: head(net(x)[0]).pow(2).mean())


def _embedding(device: str, small: bool) -> Callable[[], object]:
    import torch

    rows, dim, batch = (1000, 16, 8) if small else (100_000, 128, 512)
    bag = torch.nn.EmbeddingBag(rows, dim, mode="sum").to(device)
    emb = torch.nn.Embedding(rows // 2, dim).to(device)
    top = torch.nn.Linear(2 * dim, 1).to(device)
    opt = torch.optim.Adagrad(list(bag.parameters()) + list(emb.parameters())
                              + list(top.parameters()), lr=0.1)
    indices = torch.randint(0, rows, (batch * 5,), device=device)
    offsets = torch.arange(0, batch * 5, 5, device=device)
    ids = torch.randint(0, rows // 2, (batch,), device=device)
    y = torch.rand(batch, 1, device=device)

    def loss() -> Any:
        z = torch.cat([bag(indices, offsets), emb(ids)], dim=1)
        return torch.nn.functional.binary_cross_entropy_with_logits(top(z), y)

    return _train(top, opt, loss)


MODELS: dict[str, Callable[[str, bool], Callable[[], object]]] = {
    "two_streams": _two_streams, "mlp": _mlp, "transformer": _transformer, "cnn": _cnn,
    "embedding": _embedding, "lstm": _lstm,
}


def _capture_child(out: Path, device: str, small: bool, names: list[str]) -> int:
    """Capture each model into ``out`` and write ``out/captures.json``.

    Runs in a process of its own: a sticky CUDA error in a capture must not poison the
    driver, and the driver must not hold GPU memory that the replays then lack."""
    import torch

    sys.path.insert(0, str(ROOT))  # run as a script: the checkout, installed or not
    from mystique_gen.tools.capture import capture

    if os.environ.get("OMP_NUM_THREADS") == "1":
        torch.set_num_threads(1)
    results: dict[str, Any] = {}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        results["_device"] = {"name": props.name, "total_gib": props.total_memory / 2**30,
                              "count": torch.cuda.device_count()}
    for name in names:
        try:
            torch.manual_seed(0)
            step = MODELS[name](device, small)
            r = capture(step, out, name=name, warmup=10, timing_iters=20)
            results[name] = {"et": str(r.et_path), "kineto": str(r.kineto_path),
                             "step_ms_median": r.step_ms_median}
        except Exception as exc:  # one model's failure is that row's FAIL, not the run's
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:300],
                             "traceback": traceback.format_exc()[-2000:]}
    (out / "captures.json").write_text(json.dumps(results, indent=2))
    return 0


def _dist_child(out: Path, backend: str, device: str) -> int:
    """A DDP training step plus an all_reduce, one ET per rank (run under torchrun)."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ExecutionTraceObserver

    dist.init_process_group(backend)
    rank = dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local) if device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 8)).to(dev)
    model = torch.nn.parallel.DistributedDataParallel(
        net, device_ids=[local] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 64, device=dev)

    def step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        y = torch.full((32,), float(rank + 1), device=dev)
        dist.all_reduce(y)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    for _ in range(2):  # lazy initialisation (buckets, communicators) is not the step
        step()
    sync()
    observer = ExecutionTraceObserver()
    observer.register_callback(str(out / f"rank-{rank}.json"))
    observer.start()
    step()
    sync()
    observer.stop()
    observer.unregister_callback()
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------- synthetic traces


def _synthetic_trace(path: Path, ops: list[tuple[str, str, list[dict], list[dict]]]) -> Path:
    """A nested (1.1.1) ET: a process and a thread node, then ``ops`` (name, schema,
    input tensors, output tensors), in the observer's format (tests/tracebuilder.py
    builds the same; it is not imported, as it reaches into the package)."""
    nodes: list[dict[str, Any]] = []

    def args(tensors: list[dict]) -> dict[str, list]:
        return {"values": [t["value"] for t in tensors], "shapes": [t["shape"] for t in tensors],
                "strides": [t["strides"] for t in tensors],
                "types": ["Tensor(float)" for _ in tensors]}

    def node(node_id: int, name: str, parent: int, schema: str = "",
             inputs: list[dict] | None = None, outputs: list[dict] | None = None) -> None:
        nodes.append({"id": node_id, "name": name, "ctrl_deps": parent,
                      "inputs": args(inputs or []), "outputs": args(outputs or []),
                      "attrs": [{"name": "rf_id", "type": "uint64", "value": node_id},
                                {"name": "tid", "type": "uint64", "value": 1},
                                {"name": "op_schema", "type": "string", "value": schema}]})

    node(1, "[pytorch|profiler|execution_trace|process]", 1)
    node(2, "[pytorch|profiler|execution_trace|thread]", 1)
    for i, (name, schema, inputs, outputs) in enumerate(ops):
        node(1000 + i, name, 2, schema, inputs, outputs)
    doc = {"schema": "1.1.1-chakra.0.0.4", "pid": 1, "time": "2026-01-01 00:00:00",
           "start_ts": 0, "finish_ts": 1, "nodes": list(reversed(nodes))}
    path.write_text(json.dumps(doc))
    return path


def _tensor(tensor_id: int, storage_id: int, shape: tuple[int, ...], device: str) -> dict:
    numel, strides, acc = 1, [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
        numel *= n
    return {"value": [tensor_id, storage_id, 0, numel, 4, device], "shape": list(shape),
            "strides": strides[::-1]}


MM = "aten::mm(Tensor self, Tensor mat2) -> Tensor"
RELU = "aten::relu(Tensor self) -> Tensor"


# ------------------------------------------------------------------------- helpers


def _load_json(path: Path) -> Any:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _kernels(path: Path) -> list[dict]:
    """The GPU kernel events of a Kineto trace."""
    return [e for e in _load_json(path).get("traceEvents", [])
            if e.get("cat") == "kernel"]


def _profiler_steps(path: Path) -> int:
    """The ProfilerStep#N annotations on the host in a replay's --profile trace."""
    return sum(1 for e in _load_json(path).get("traceEvents", [])
               if e.get("cat") == "user_annotation"
               and str(e.get("name", "")).startswith("ProfilerStep#"))


def _peak(result: dict) -> str:
    """peak_bytes measured vs estimated, in MiB."""
    peak, est = result.get("peak_bytes"), result.get("estimated_peak_bytes")
    if not isinstance(peak, int) or not isinstance(est, int):
        return f"peak_bytes {peak}, estimated {est}"
    return f"peak {peak / 2**20:.2f} MiB measured, {est / 2**20:.2f} MiB estimated"


def _per_stream(kernels: list[dict], iters: int = 1) -> dict[int, float]:
    counts = Counter(e.get("args", {}).get("stream") for e in kernels)
    return {s: n / iters for s, n in sorted(counts.items(), key=lambda kv: str(kv[0]))}


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _skipped(result: dict) -> str:
    """What the benchmark skipped at run time, and what ran as an equivalent."""
    text = f"skipped_at_runtime: {_names(result.get('skipped_at_runtime'))}"
    ported = result.get("equivalents_at_runtime")
    return text + (f"; equivalents_at_runtime: {_names(ported)}" if ported else "")


def _names(names: list[str] | None) -> str:
    if not names:
        return "none"
    more = f" +{len(names) - 3} more" if len(names) > 3 else ""
    return f"{', '.join(names[:3])}{more}"


def _tail(text: str, n: int = 300) -> str:
    """The end of a child's stderr, on one line, without torch's NumPy warning noise."""
    lines = [ln for ln in text.strip().splitlines()
             if "NumPy" not in ln and "_conversion_method_template" not in ln]
    return " | ".join(lines)[-n:]


class Checker:
    def __init__(self, cfg: Config, cuda: bool, gpus: int):
        self.cfg = cfg
        self.cuda = cuda and not cfg.dry_run
        self.gpus = gpus if self.cuda else 0
        self.device = "cuda" if self.cuda else "cpu"
        # Files with collectives (the ResNet-50 DDP trace) crash on a bare `--device cuda`
        # outside torchrun (`torch.cuda.set_device` needs an index; the nccl-1rank row
        # reports that): the rows that test something else name the GPU.
        self.indexed = "cuda:0" if self.cuda else "cpu"
        self.start = time.monotonic()
        self.rows: list[Row] = []
        self.env = {**os.environ}
        self.env.pop("PYTHONPATH", None)  # the generated files must stand alone
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            self.env.pop(key, None)
        if cfg.dry_run:
            self.env["OMP_NUM_THREADS"] = "1"  # a shared CPU machine: one core per process
        # Two at least: a replay in the foreground often waits on the next file.
        workers = max(2, min(4, (os.cpu_count() or 2) // 4))
        # Generation is CPU work, independent of the GPU: it runs in the background while
        # captures and replays use the device.
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.gens: dict[str, Future[Path]] = {}
        self.captures: dict[str, Any] = {}
        self.host_captures: dict[str, Any] = {}  # CROSS_MODELS captured on the host

    # -- time budget
    def left(self) -> float:
        return self.cfg.budget_s - (time.monotonic() - self.start)

    def timeout(self, want: float) -> float:
        left = self.left()
        if left < 10:
            raise BudgetSpent(f"time budget spent ({self.cfg.budget_s:.0f} s)")
        return min(want, left)

    def log(self, msg: str) -> None:
        print(f"gpu_check [{time.monotonic() - self.start:6.1f}s] {msg}", file=sys.stderr,
              flush=True)

    # -- subprocesses
    def run(self, cmd: list[str], timeout: float, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
        limit = self.timeout(timeout)
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=limit,
                                  cwd=cwd or ROOT, env=self.env)
        except subprocess.TimeoutExpired as exc:
            raise CheckFailed(f"timed out after {limit:.0f} s: {' '.join(cmd)[:200]}"
                              ) from exc

    def _generate(self, out: Path, args: list[str]) -> Path:
        proc = self.run([self.cfg.python, "-m", "mystique_gen.cli", *args, "-o", str(out)],
                        timeout=300)
        if proc.returncode != 0:
            raise CheckFailed(f"generation failed (rc {proc.returncode}): "
                              f"{_tail(proc.stderr)}")
        return out

    def generate(self, key: str, args: list[str]) -> Future[Path]:
        """Start generating ``work/<key>.py`` in the background (once per key)."""
        if key not in self.gens:
            out = self.cfg.work / f"{key}.py"
            self.gens[key] = self.pool.submit(self._generate, out, args)
        return self.gens[key]

    def generated(self, key: str, args: list[str]) -> Path:
        future = self.generate(key, args)
        try:
            return future.result(timeout=self.timeout(600))
        except FutureTimeout as exc:
            raise BudgetSpent("time budget spent while generating") from exc

    def bench(self, path: Path, *args: str, timeout: float = 240,
              expect_ok: bool = True) -> tuple[dict | None, subprocess.CompletedProcess[str]]:
        proc = self.run([self.cfg.python, str(path), *args], timeout=timeout,
                        cwd=self.cfg.work)
        if proc.returncode != 0:
            if expect_ok:
                raise CheckFailed(f"{path.name} {' '.join(args)}: rc {proc.returncode}: "
                                  f"{_tail(proc.stderr)}")
            return None, proc
        lines = proc.stdout.strip().splitlines()
        try:
            return json.loads(lines[-1]), proc
        except (IndexError, json.JSONDecodeError) as exc:
            raise CheckFailed(f"{path.name}: no JSON line in its output") from exc

    def torchrun(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        # --standalone: a rendezvous on a free local port, so parallel runs never collide.
        return self.run([self.cfg.python, "-m", "torch.distributed.run", "--standalone",
                         "--nproc-per-node", "2", *args], timeout=timeout, cwd=self.cfg.work)

    def capture(self, name: str) -> dict:
        info = self.captures.get(name)
        if info is None:
            raise CheckFailed(f"no capture of {name} (the capture process failed)")
        if "error" in info:
            raise CheckFailed(f"capture of {name} failed: {info['error']}")
        return info

    # -- rows
    def want(self, name: str) -> bool:
        return self.cfg.only is None or name in self.cfg.only

    def check(self, name: str, fn: Callable[[], Row]) -> None:
        if not self.want(name):
            return
        self.log(f"{name} ...")
        try:
            row = fn()
        except CheckFailed as exc:
            row = Row(name, FAIL, detail=str(exc))
        except BudgetSpent as exc:
            row = Row(name, SKIP, detail=str(exc))
        except Exception as exc:  # a bug in a check is that row's FAIL, not a crash
            row = Row(name, FAIL, detail=f"{type(exc).__name__}: {exc}"[:400])
        self.log(f"{name}: {row.status} {row.numbers}")
        self.rows.append(row)

    def all(self) -> list[Row]:
        # Captures time the eager step: nothing else may run beside them, so background
        # generation starts only once they are done.
        if any(self.want(n) for n in ("streams", "cuda-graph", "cross-device", "fidelity")):
            self.capture_models()
        self.prefetch()
        self.check("streams", self.streams)
        for name, trace, kineto, cpu_cost in TRACES:
            self.check(name, lambda n=name, t=trace, k=kineto, c=cpu_cost:
                       self.real_trace(n, t, k, c))
        self.check("cuda-graph", self.cuda_graph)
        self.check("dtype-bf16", self.dtype_bf16)
        self.check("nccl-1rank", self.nccl_one_rank)
        self.check("nccl-2rank", self.nccl_two_ranks)
        self.check("device-map", self.device_map)
        self.check("memory-check", self.memory_check)
        self.check("cross-device", self.cross_device)
        self.check("fidelity", self.fidelity)
        self.pool.shutdown(wait=False, cancel_futures=True)
        return self.rows

    def reps(self, warmup: int, iters: int) -> list[str]:
        """``--warmup``/``--iters`` for a timed replay: a quarter of them on a dry run,
        whose numbers are no target (the host's fidelity is `make bench`'s) and whose
        time is `make test`'s."""
        if self.cfg.dry_run:
            warmup, iters = max(1, warmup // 4), max(3, iters // 4)
        return ["--warmup", str(warmup), "--iters", str(iters)]

    def cpu_skip(self, cpu_cost: str | None) -> bool:
        return not self.cuda and cpu_cost is not None and not self.cfg.big

    def prefetch(self) -> None:
        """Queue every generation, in the order the rows use them."""
        jobs: list[tuple[str, list[str]]] = []
        for name in ("two_streams", "mlp"):
            info = self.captures.get(name, {})
            if "et" in info:  # the streams row needs the Kineto link, the graph row not
                kineto = ["--kineto", info["kineto"]] if name == "two_streams" else []
                jobs.append((f"cap_{name}", [info["et"], *kineto]))
        if SHARED.is_dir():
            for name, trace, kineto, cpu_cost in TRACES:
                if self.want(name) and not self.cpu_skip(cpu_cost):
                    jobs.append((name.split(":")[1], self.trace_args(trace, kineto)))
            if self.want("dtype-bf16"):
                jobs.append(self.bf16_job())
            if self.want("nccl-1rank"):
                jobs.append(("resnet50_comm", [str(SHARED / "param/resnet50_1gpu_et.json.gz"),
                                               "--mode", "comm"]))
        if self.want("device-map"):
            jobs.append(self.device_map_job())
        if self.want("memory-check"):
            jobs.append(self.huge_job())
        for name in dict.fromkeys(self.fidelity_models() + self.cross_models()):
            info = self.captures.get(name, {})
            if "et" in info and (self.want("fidelity") or self.want("cross-device")):
                jobs.append((f"cap_{name}", [info["et"], "--kineto", info["kineto"]]))
        for name in CROSS_MODELS:
            info = self.host_captures.get(name, {})
            if "et" in info and self.want("cross-device"):
                jobs.append((f"host_{name}", [info["et"]]))
        for key, args in jobs:
            self.generate(key, args)

    @staticmethod
    def trace_args(trace: str, kineto: str | None) -> list[str]:
        args = [str(SHARED / trace)]
        return args + ["--kineto", str(SHARED / kineto)] if kineto else args

    def capture_models(self) -> None:
        names = ["two_streams", *dict.fromkeys(self.fidelity_models() + self.cross_models())]
        names += ["mlp"] if self.cuda else []
        size = "small" if not self.cuda else "full"
        self.captures = self.captured("captures", self.device, size, names, timeout=240)
        if self.captures and self.cuda and self.want("cross-device"):
            # The cross-device models captured on the host too (replayed on the GPU).
            self.host_captures = self.captured("captures_host", "cpu", "small",
                                               list(CROSS_MODELS), timeout=120)

    def captured(self, folder: str, device: str, size: str, names: list[str], *,
                 timeout: float) -> dict[str, Any]:
        """Capture ``names`` on ``device`` in a child process; their captures.json."""
        out = self.cfg.work / folder
        out.mkdir(parents=True, exist_ok=True)
        self.log(f"capturing {', '.join(names)} on {device}")
        cmd = [self.cfg.python, str(Path(__file__).resolve()), "--_capture", str(out),
               device, size, *names]
        try:
            proc = self.run(cmd, timeout=timeout)
        except (CheckFailed, BudgetSpent) as exc:
            self.log(f"capture on {device}: {exc}")
            return {}
        path = out / "captures.json"
        if proc.returncode != 0 or not path.exists():
            self.log(f"capture on {device} failed (rc {proc.returncode}): "
                     f"{_tail(proc.stderr, 1000)}")
            return {}
        return json.loads(path.read_text())

    # 1. streams
    def streams(self) -> Row:
        info = self.capture("two_streams")
        kineto = Path(info["kineto"])
        proc = self.run([self.cfg.python, "-m", "mystique_gen.cli", "inspect", info["et"],
                         "--kineto", str(kineto), "--json"], timeout=120)
        if proc.returncode != 0:
            raise CheckFailed(f"inspect --kineto failed: {_tail(proc.stderr)}")
        summary = json.loads(proc.stdout)
        recorded_streams = len(summary.get("streams", []))
        bench = self.generated("cap_two_streams", [])
        text = bench.read_text()
        # Calls only: the harness's own `def _record():` and `def _wait(` do not count.
        blocks, records, waits = (len(re.findall(rf"(?<!def ){re.escape(call)}", text))
                                  for call in ("with _on(", "_record()", "_wait("))
        prof = self.cfg.work / "prof_two_streams"
        result, _ = self.bench(bench, "--device", self.device, *self.reps(5, 20), "--json",
                               "--profile", str(prof))
        replayed = _per_stream(_kernels(prof / "kineto_trace.json"), result["iters"])
        recorded = _per_stream(_kernels(kineto))
        steps = _profiler_steps(prof / "kineto_trace.json")
        numbers = (f"eager {info['step_ms_median']:.3f} ms, original "
                   f"{result.get('original_ms', float('nan')):.3f} ms, replay "
                   f"{result['iter_ms_median']:.3f} ms")
        detail = (f"linked {summary.get('linked_ops')}/{summary.get('selected_ops')} ops; "
                  f"{blocks} `with _on(` blocks, {records} events, {waits} waits; kernels "
                  f"per stream recorded {recorded}, replayed per iter {replayed}; "
                  f"{steps} ProfilerStep#N in the profile; {_peak(result)}")
        if steps != result["iters"] or not result.get("peak_bytes"):
            return Row("streams", FAIL, numbers,
                       f"want {result['iters']} ProfilerStep#N and peak_bytes > 0; " + detail)
        if not self.cuda:
            return Row("streams", SKIP, numbers, "stream counts need CUDA; on cpu: " + detail)
        problems = []
        if recorded_streams < 2:
            problems.append(f"the capture shows {recorded_streams} stream(s)")
        if blocks < 1 or records < 1 or waits < 1:
            problems.append("no `with _on(` blocks/events in the benchmark")
        if len(replayed) < 2:
            problems.append(f"the replay ran kernels on {len(replayed)} stream(s)")
        if problems:
            return Row("streams", FAIL, numbers, "; ".join(problems) + "; " + detail)
        return Row("streams", OK, numbers, detail)

    # 2. real GPU traces
    def real_trace(self, name: str, trace: str, kineto: str | None,
                   cpu_cost: str | None) -> Row:
        if not SHARED.is_dir():
            return Row(name, SKIP, detail=f"shared traces not found at {SHARED}")
        if self.cpu_skip(cpu_cost):
            return Row(name, SKIP, detail=f"{cpu_cost} on cpu: runs on cuda, or pass --big")
        key = name.split(":")[1]
        bench = self.generated(key, self.trace_args(trace, kineto))
        args = ["--device", self.indexed, "--warmup", "0", "--iters", "1", "--json"]
        prof = self.cfg.work / f"prof_{key}"
        if kineto:
            args += ["--profile", str(prof)]
        t0 = time.monotonic()
        result, _ = self.bench(bench, *args, timeout=300)
        numbers = f"iter {result['iter_ms_median']:.2f} ms, {result['ops']} ops"
        detail = f"run {time.monotonic() - t0:.0f} s; {_skipped(result)}; {_peak(result)}"
        if result.get("distributed"):
            detail += (f"; {result.get('backend')} group of {result.get('world_size')}")
        if kineto:
            recorded = sum(e.get("dur", 0) for e in _kernels(SHARED / kineto))
            kernels = _kernels(prof / "kineto_trace.json")
            replayed = sum(e.get("dur", 0) for e in kernels) / max(1, result["iters"])
            numbers += f", kernels recorded {recorded:.1f} us vs replayed {replayed:.1f} us"
            if not self.cuda:
                return Row(name, SKIP, numbers,
                           f"kernel time needs CUDA (none on cpu); {detail}")
            if not kernels:
                return Row(name, FAIL, numbers, f"the replay launched no kernels; {detail}")
        return Row(name, OK, numbers, detail)

    # 3. CUDA graphs
    def cuda_graph(self) -> Row:
        if not self.cuda:
            return Row("cuda-graph", SKIP, detail="--cuda-graph needs CUDA")
        info = self.capture("mlp")
        bench = self.generated("cap_mlp", [])
        common = ["--device", "cuda", "--warmup", "5", "--iters", "50", "--json"]
        graph, _ = self.bench(bench, *common, "--cuda-graph")
        eager, _ = self.bench(bench, *common)
        numbers = (f"graph {graph['iter_ms_median']:.3f} ms, eager replay "
                   f"{eager['iter_ms_median']:.3f} ms, captured step "
                   f"{info['step_ms_median']:.3f} ms")
        if graph.get("cuda_graph") is not True:
            return Row("cuda-graph", FAIL, numbers, "the JSON does not report cuda_graph")
        return Row("cuda-graph", OK, numbers, f"{graph['ops']} ops in one graph; "
                   f"{_skipped(graph)}")

    # 4. retargeting
    def bf16_job(self) -> tuple[str, list[str]]:
        # On CPU a bfloat16 ResNet-50 takes minutes: the small PARAM add trace stands in.
        trace = "param/resnet50_1gpu_et.json.gz" if self.cuda else "hta/simple_add_et.json.gz"
        return "bf16", [str(SHARED / trace), "--dtype", "bfloat16"]

    def dtype_bf16(self) -> Row:
        if not SHARED.is_dir():
            return Row("dtype-bf16", SKIP, detail=f"shared traces not found at {SHARED}")
        key, args = self.bf16_job()
        bench = self.generated(key, args)
        result, _ = self.bench(bench, "--device", self.indexed, "--warmup", "0", "--iters",
                               "1", "--json", timeout=300)
        text = bench.read_text()
        if "torch.bfloat16" not in text:
            return Row("dtype-bf16", FAIL, detail="no torch.bfloat16 in the benchmark")
        # A recast trace runs whole: a kernel that refuses the dtype runs its portable
        # equivalent (cuDNN's batch-norm backward on bfloat16 ran none before).
        status = FAIL if result.get("skipped_at_runtime") else OK
        return Row("dtype-bf16", status, f"iter {result['iter_ms_median']:.2f} ms, "
                   f"{result['ops']} ops", f"{Path(args[0]).name} on {self.device}; "
                   f"{_skipped(result)}")

    # 5. nccl
    def nccl_one_rank(self) -> Row:
        if not SHARED.is_dir():
            return Row("nccl-1rank", SKIP, detail=f"shared traces not found at {SHARED}")
        bench = self.generated("resnet50_comm", [])
        backend = "nccl" if self.cuda else "gloo"
        args = ["--backend", backend, "--warmup", "1", "--iters", "3", "--json"]
        # `--device cuda` is what a vendor types; if it fails, `cuda:0` still tells
        # whether nccl itself works.
        result, proc = self.bench(bench, "--device", self.device, *args, expect_ok=False)
        bare = None
        if result is None:
            bare = f"--device {self.device} failed (rc {proc.returncode}): {_tail(proc.stderr)}"
            if not self.cuda:
                raise CheckFailed(bare)
            result, _ = self.bench(bench, "--device", self.indexed, *args)
        numbers = f"iter {result['iter_ms_median']:.3f} ms, {result['ops']} collectives"
        detail = (f"resnet50 DDP collectives (--mode comm): distributed="
                  f"{result.get('distributed')}, backend {result.get('backend')}, world size "
                  f"{result.get('world_size')}")
        if not (result.get("distributed") is True and result.get("world_size") == 1
                and result.get("backend") == backend and result["ops"] > 0):
            return Row("nccl-1rank", FAIL, numbers, "expected a one-rank group: " + detail)
        if bare is not None:
            return Row("nccl-1rank", FAIL, numbers, f"{bare}; with {self.indexed}: {detail}")
        if not self.cuda:
            return Row("nccl-1rank", SKIP, numbers, f"nccl needs CUDA; ran on gloo: {detail}")
        return Row("nccl-1rank", OK, numbers, detail)

    def nccl_two_ranks(self) -> Row:
        if self.cuda and self.gpus < 2:
            return Row("nccl-2rank", SKIP, detail=f"needs 2 GPUs, this machine has {self.gpus}")
        if not self.cuda and not self.cfg.big:
            return Row("nccl-2rank", SKIP,
                       detail="nccl needs 2 GPUs (--dry-run --big runs it on 2 gloo ranks)")
        backend = "nccl" if self.cuda else "gloo"
        out = self.cfg.work / "dist"
        out.mkdir(parents=True, exist_ok=True)
        proc = self.torchrun(str(Path(__file__).resolve()), "--_dist", str(out), backend,
                             self.device, timeout=240)
        if proc.returncode != 0:
            raise CheckFailed(f"2-rank capture failed: {_tail(proc.stderr)}")
        ranks = [str(out / "rank-0.json"), str(out / "rank-1.json")]
        bench = self.generated("dist2", ranks)
        proc = self.torchrun(str(bench), "--device", self.device, "--backend", backend,
                             "--warmup", "2", "--iters", "10", "--json", timeout=240)
        if proc.returncode != 0:
            raise CheckFailed(f"2-rank replay failed: {_tail(proc.stderr)}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        numbers = f"iter {result['iter_ms_median']:.3f} ms (slowest rank)"
        detail = (f"backend {result.get('backend')}, world size {result.get('world_size')}, "
                  f"{len(result.get('per_rank', []))} ranks reported")
        if result.get("world_size") != 2 or result.get("backend") != backend:
            return Row("nccl-2rank", FAIL, numbers, detail)
        if not self.cuda:
            return Row("nccl-2rank", SKIP, numbers, f"nccl needs CUDA; ran on gloo: {detail}")
        return Row("nccl-2rank", OK, numbers, detail)

    # 6. device mapping and memory
    RECORDED_ON = "cuda:7"  # a device index this machine most likely lacks

    def device_map_job(self) -> tuple[str, list[str]]:
        dev = self.RECORDED_ON
        a, b = _tensor(10, 11, (512, 256), dev), _tensor(12, 13, (256, 128), dev)
        c, d = _tensor(14, 15, (512, 128), dev), _tensor(16, 17, (512, 128), dev)
        trace = _synthetic_trace(self.cfg.work / "on_cuda7.et.json",
                                 [("aten::mm", MM, [a, b], [c]),
                                  ("aten::relu", RELU, [c], [d])])
        return "device_map", [str(trace)]

    def device_map(self) -> Row:
        dev = self.RECORDED_ON
        bench = self.generated("device_map", [])
        target = "cuda:0" if self.cuda else "cpu"
        prof = self.cfg.work / "prof_device_map"
        result, _ = self.bench(bench, "--device", target, "--warmup", "1", "--iters", "3",
                               "--json", "--profile", str(prof))
        kernels = _kernels(prof / "kineto_trace.json")
        devices = sorted({str(e.get("args", {}).get("device")) for e in kernels})
        numbers = f"iter {result['iter_ms_median']:.3f} ms, {len(kernels)} kernels"
        detail = f"recorded on {dev}, ran on {result['device']}, kernel devices {devices}"
        if result["device"] != target or result["ops"] != 2:
            return Row("device-map", FAIL, numbers, detail)
        if not self.cuda:
            return Row("device-map", SKIP, numbers, f"cuda:0 needs CUDA; on cpu: {detail}")
        if devices != ["0"]:
            return Row("device-map", FAIL, numbers, "kernels not all on device 0: " + detail)
        return Row("device-map", OK, numbers, detail)

    def huge_job(self) -> tuple[str, list[str]]:
        huge = _tensor(10, 11, (2**19, 2**19), "cuda:0")  # 1 TiB of float32: fits nowhere
        out = _tensor(12, 13, (2**19, 2**19), "cuda:0")
        trace = _synthetic_trace(self.cfg.work / "huge.et.json",
                                 [("aten::relu", RELU, [huge], [out])])
        return "huge", [str(trace)]

    def memory_check(self) -> Row:
        bench = self.generated("huge", [])
        result, proc = self.bench(bench, "--device", self.device, "--warmup", "0", "--iters",
                                  "1", "--json", timeout=120, expect_ok=False)
        if result is not None:
            return Row("memory-check", FAIL, detail="a 1 TiB trace ran instead of refusing")
        match = MEMORY_RE.search(proc.stderr)
        if match is None:
            return Row("memory-check", FAIL,
                       detail=f"rc {proc.returncode} without the memory message: "
                              f"{_tail(proc.stderr)}")
        numbers = f"needs {match[1]} GiB, {match[3]} GiB free on {match[2]}"
        detail = f"rc {proc.returncode}: {match[0]}"
        if not self.cuda:
            return Row("memory-check", SKIP, numbers, f"GPU memory needs CUDA; on cpu: {detail}")
        if not match[2].startswith("cuda"):
            return Row("memory-check", FAIL, numbers, detail)
        return Row("memory-check", OK, numbers, detail)

    # 7. cross-device
    def cross_models(self) -> tuple[str, ...]:
        """The models the row replays: on a dry run one (the host replays its own
        capture, which only exercises the row), on a GPU all."""
        return CROSS_MODELS if self.cuda else CROSS_MODELS[:1]

    def cross_device(self) -> Row:
        """Each capture replays whole on the other device: no op skipped at run time (a
        backend kernel that cannot run there runs its portable equivalent)."""
        replays = [(f"cap_{n}", n, self.device, "cpu") for n in self.cross_models()]
        if self.cuda:
            replays += [(f"host_{n}", n, "cpu", self.indexed) for n in CROSS_MODELS]
        parts, bad = [], []
        for key, name, recorded, target in replays:
            info = (self.captures if key.startswith("cap_") else self.host_captures).get(name)
            if not info or "et" not in info:
                bad.append(f"{name} on {recorded}: not captured")
                continue
            bench = self.generated(key, [])
            result, _ = self.bench(bench, "--device", target, "--warmup", "1", "--iters",
                                   "1", "--json", "--host-gaps", "off", timeout=300)
            if result.get("skipped_at_runtime"):
                bad.append(f"{name} {recorded}->{target}: {_skipped(result)}")
            parts.append(f"{name} {recorded}->{target} {result['iter_ms_median']:.2f} ms, "
                         f"{result['ops']} ops, equivalents "
                         f"{_names(result.get('equivalents_at_runtime'))}")
        numbers = f"{len(parts)} replays, {len(bad)} with ops skipped or not captured"
        detail = "; ".join(bad + parts)
        if bad:
            return Row("cross-device", FAIL, numbers, detail)
        if not self.cuda:
            return Row("cross-device", SKIP, numbers, f"the other device needs CUDA; {detail}")
        return Row("cross-device", OK, numbers, detail)

    # 8. fidelity
    def fidelity_models(self) -> tuple[str, ...]:
        """On a dry run one model (it exercises the row; the host's fidelity is
        `make bench`'s), on a GPU all."""
        return FIDELITY_MODELS if self.cuda else FIDELITY_MODELS[:1]

    def fidelity(self) -> Row:
        errors: dict[str, list[float]] = {"off": [], "recorded": [], "scaled": []}
        parts, failures = [], []
        for name in self.fidelity_models():
            try:
                info = self.capture(name)
                bench = self.generated(f"cap_{name}", [])
                eager = info["step_ms_median"]
                mine = []
                for gaps in errors:
                    result, _ = self.bench(bench, "--device", self.device, *self.reps(5, 30),
                                           "--json", "--host-gaps", gaps)
                    err = result["iter_ms_median"] / eager - 1
                    errors[gaps].append(err)
                    mine.append(_pct(err))
                parts.append(f"{name} {eager:.2f} ms: " + ", ".join(
                    f"{gaps} {err}" for gaps, err in zip(errors, mine, strict=True)))
            except CheckFailed as exc:
                failures.append(f"{name}: {exc}")

        def summary(errs: list[float]) -> str:
            if not errs:
                return "n/a"
            return (f"median {statistics.median(abs(e) for e in errs) * 100:.1f}% worst "
                    f"{max(abs(e) for e in errs) * 100:.1f}%")

        numbers = "; ".join(f"{'gaps off' if gaps == 'off' else gaps} {summary(errs)}"
                            for gaps, errs in errors.items())
        detail = "; ".join(parts + failures)
        return Row("fidelity", FAIL if failures else OK, numbers,
                   f"|replay/eager - 1| on {self.device}: {detail}")


def format_table(rows: list[Row]) -> str:
    head = Row("check", "status", "numbers", "detail")
    w = [max(len(getattr(r, f)) for r in [head, *rows]) for f in ("name", "status", "numbers")]
    lines = []
    for r in [head, *rows]:
        lines.append(f"{r.name:<{w[0]}}  {r.status:<{w[1]}}  {r.numbers:<{w[2]}}  {r.detail}"
                     .rstrip())
        if r is head:
            lines.append("  ".join("-" * n for n in w) + "  " + "-" * 6)
    return "\n".join(lines)


def _cuda() -> tuple[bool, int]:
    try:
        import torch
    except ImportError:
        return False, 0
    # Neither call creates a CUDA context in this process: the GPU stays free for replays.
    return torch.cuda.is_available(), torch.cuda.device_count()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--_capture"]:
        return _capture_child(Path(argv[1]), argv[2], argv[3] == "small", argv[4:])
    if argv[:1] == ["--_dist"]:
        return _dist_child(Path(argv[1]), argv[2], argv[3])
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("workdir", nargs="?", help="where to write (default: a temporary folder, "
                   "removed afterwards)")
    p.add_argument("--dry-run", action="store_true",
                   help="run what can run on CPU (small sizes); CUDA-only checks SKIP")
    p.add_argument("--big", action="store_true",
                   help="with --dry-run: also the ResNet-50 and GPT-2 traces and 2 gloo ranks")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop starting steps after this many seconds (default: 330, "
                   "dry run 300; --big: 900)")
    p.add_argument("--only", default=None, help=f"comma-separated rows of: {', '.join(ROWS)}")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = p.parse_args(argv)
    only = frozenset(args.only.split(",")) if args.only else None
    if only and only - set(ROWS):
        p.error(f"unknown rows: {', '.join(sorted(only - set(ROWS)))}")
    cuda, gpus = _cuda()
    if not cuda and not args.dry_run:
        print("gpu_check: FAILED: CUDA is not available here (torch.cuda.is_available() is "
              "False)\ngpu_check: run this on a machine with an NVIDIA GPU and a CUDA build "
              "of torch, or pass --dry-run to run the CPU parts", file=sys.stderr)
        return EXIT_NO_CUDA
    budget = args.budget_s or (900 if args.big else 300 if args.dry_run else 330)
    temp = None if args.workdir else tempfile.mkdtemp(prefix="gpu_check_")
    work = Path(args.workdir or temp).resolve()  # type: ignore[arg-type]
    work.mkdir(parents=True, exist_ok=True)
    cfg = Config(work=work, dry_run=args.dry_run, big=args.big, budget_s=budget, only=only)
    checker = Checker(cfg, cuda, gpus)
    try:
        rows = checker.all()
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    where = (f"cuda ({checker.captures.get('_device', {}).get('name', f'{gpus} GPU(s)')})"
             if checker.cuda else "cpu (dry run)")
    failed = [r.name for r in rows if r.status == FAIL]
    print(f"gpu_check on {where}, {time.monotonic() - checker.start:.0f} s "
          f"(budget {budget:.0f} s)")
    print(format_table(rows))
    print(f"gpu_check: {'FAILED: ' + ', '.join(failed) if failed else 'OK'}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
