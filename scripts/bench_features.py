"""`make bench` section: do steps that use torch's less common features replay?

The architecture sweep (bench_sweep.py) covers transformers' models; users' own code
reaches for features no model zoo shows. ``scripts/features_train.py``,
``scripts/features_infer.py`` and ``scripts/features_more.py`` (a second batch) hold one
small step per feature (activation checkpointing, autocast, FFTs, sparse gradients,
torch.compile, nested tensors, quantized RNNs, custom autograd Functions, ...).
Each step runs twice warm, then one step is recorded with a plain
``ExecutionTraceObserver`` (as users record, with none of the capture helper's extras),
in a process of its own; the CLI generates a benchmark, which replays standalone
(``--warmup 0 --iters 3 --reset-inputs off --json --et replay.json``, with
``mystique_gen`` unimportable). Compared: the top-level ops by overload with their
tensor arguments' shapes (the op multiset alone hid SparseAdam running on the wrong
number of entries) and strides (a layout is a kernel: a transposed operand is another
GEMM, a channels-last input another convolution); no input the replay writes may end
NaN or inf, and no op of its first iteration may compute NaN from tensors without any
where the eager step's ops did not (``nan_births.py``: an inference step's NaN
activations reach no input). ``scripts/features_random.py`` adds programs nobody wrote,
drawn from seeds.

Outcomes: ``capture error`` (the step cannot be recorded here: not our failure),
``gen error``, ``run error``, ``op mismatch``, ``shape mismatch``, ``layout mismatch``,
``nonfinite``, ``pass``; ``known`` marks a failure README's Known limits explains
(``KNOWN``).

Environment: FEATURES_ONLY=substr,... (workload names containing any),
FEATURES_MODULES=features_train,... (those batches only: two runs split the batches
over two cores), FEATURES_TIMEOUT=seconds per step (default 300).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mystique_gen.constants import HARNESS_SCOPE, equivalent_of  # noqa: E402
from mystique_gen.passes.select import select_ops  # noqa: E402
from mystique_gen.sources.et import load_trace  # noqa: E402
from mystique_gen.tools.compare import overload_name  # noqa: E402

MODULES = ("features_train", "features_infer", "features_more", "features_recent",
           "features_backends", "features_recipes", "features_frontier", "features_domains",
           "features_compiled", "features_diffusers", "features_random")
# Failures that README's Known limits explains: the observer does not record the
# arguments (nested tensors, CSR tensors, packed quantized RNN weights), or a sparse
# tensor autograd unpacked from a saved variable landed on a freed tensor's id, or
# the autograd engine batched gradients through vmap's own ops (is_grads_batched), or
# TorchScript ran fused ops the observer does not record (a frozen model's convolutions),
# or a plain ET's Python float replays near 1.
KNOWN = {
    "encoder_nested": "nested tensors: arguments not recorded",
    "encoder_nested_min": "nested tensors: arguments not recorded",
    "quant_dynamic": "quantized_lstm's packed weights are opaque objects",
    "quant_dynamic_min": "quantized_lstm's packed weights are opaque objects",
    "sparse_mm": "CSR tensors: arguments not recorded (the observer may abort)",
    "sparse_mm_min": "CSR tensors: arguments not recorded",
    "csr_build_min": "CSR tensors: arguments not recorded",
    "grads_batched": "vmap's own _add_batch_dim/_remove_batch_dim are not replayed",
    # Inductor's C++ kernels (bf16 casts of the weights, norms) are not recorded: the
    # GEMMs between them share its reused buffers, and without input resets their
    # outputs, never normalised, overflow over iterations (the default resets them).
    "autocast_nograd": "Inductor's C++ kernels are not replayed (its reused buffers grow)",
    "mkldnn_frozen": "TorchScript's fused oneDNN convolutions are not recorded",
    # (its positive-definite fill is right: ``s.sub_(1e-3 * s.grad)``'s 1e-3, a wrapped
    # number a plain ET holds no value of, replays near 1, and s turns negative)
    "cholesky_computed_min": "a plain ET's learning rate 1e-3 replays near 1: s < 0",
    "index_from_float_buffer_min": "(u * n).long() of a buffer: u's [0, 1) is not in the trace",
    "repeats_bounded_index_min": "a SUM fill (repeats) overrides an index bound",
    "narrow_start_min": "narrow.Tensor's start has no bound",
    "ddim_falling_schedule_min": "no order between two elements of one buffer (a[t] < a[prev])",
    # (the same class in diffusers' own schedulers: DDIM's last step divides by its
    # final_alpha_cumprod, torch.tensor(1.0), whose 1.0 no op records; ancestral
    # Euler's sigmas come from numpy and fall in the model only)
    "df_sample_ddim": "no order between values the trace lacks (a[t] / a_final <= 1)",
    "df_sample_eulerancestraldiscrete": "no order between a numpy buffer's elements (sigmas)",
    # (amax's backward divides by each row's count of maxima: a row the filled index
    # never names counts 0, and 0 * inf is NaN in a gradient nothing reads)
    "index_reduce_family": "a discarded NaN: the filled index names not every row",
}
OUTCOMES = ("capture error", "gen error", "run error", "op mismatch", "shape mismatch",
            "layout mismatch", "nonfinite", "pass")
RUNNER = ("import runpy, sys; sys.modules['mystique_gen'] = None; "
          "path = sys.argv[1]; sys.argv = sys.argv[1:]; runpy.run_path(path, run_name='__main__')")
# A workload's step (script argv: its module's path, its name), built and run twice.
WARM_STEP = """
import importlib.util, json, os, sys, torch
sys.path.insert(0, os.path.dirname(sys.argv[1]))  # (the batches' features_steps)
spec = importlib.util.spec_from_file_location("workloads", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["workloads"] = module  # Dynamo looks a compiled frame's module up by name
spec.loader.exec_module(module)
torch.manual_seed(0)
torch.set_num_threads(1)
step = module.WORKLOADS[sys.argv[2]]()
for _ in range(2):
    step()
"""
# The NaN-birth check (nan_births.py), each side in a process of its own: a dispatch
# mode around functorch's levels can crash the process (a segmentation fault, torch
# 2.13), and then that side is not checked. The eager step is the recorded one (the
# third); the replay's, its first iteration, run standalone. Each prints its births as
# one JSON line (null where the step would not run under the mode).
EAGER_BIRTHS = WARM_STEP + """
from nan_births import NanBirths
try:
    with NanBirths() as mode:
        step()
    births = mode.births
except Exception:  # (a compiled step, say)
    births = None
print(json.dumps({"nan_births": births}))
"""
REPLAY_BIRTHS = """
import json, runpy, sys
sys.path.insert(0, sys.argv[1])
from nan_births import NanBirths
sys.modules["mystique_gen"] = None
names = runpy.run_path(sys.argv[2], run_name="bench")["main"].__globals__
plain, found = names["replay"], {}
def replay(inputs, device, host):
    if "births" in found:
        return plain(inputs, device, host)
    try:
        with NanBirths() as mode:
            plain(inputs, device, host)
        found["births"] = mode.births
    except Exception:
        found["births"] = None
names["replay"] = replay
names["main"](["--device", "cpu", "--warmup", "0", "--iters", "1", "--reset-inputs", "off"])
print(json.dumps({"nan_births": found.get("births")}))
"""
CAPTURE = WARM_STEP + """
from torch.profiler import ExecutionTraceObserver
observer = ExecutionTraceObserver().register_callback(sys.argv[3])
observer.start()
step()
observer.stop()
observer.unregister_callback()
"""


def _workloads() -> list[tuple[Path, str]]:
    found = []
    chosen = [m for m in os.environ.get("FEATURES_MODULES", "").split(",") if m]
    unknown = sorted(set(chosen) - set(MODULES))
    if unknown:
        raise SystemExit(f"FEATURES_MODULES: no batch {', '.join(unknown)} (batches: "
                         f"{', '.join(MODULES)})")
    for module in chosen or MODULES:
        path = Path(__file__).resolve().parent / f"{module}.py"
        spec = importlib.util.spec_from_file_location(module, path)
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[module] = loaded  # (as WARM_STEP does: dataclasses look it up)
        spec.loader.exec_module(loaded)
        found += [(path, name) for name in loaded.WORKLOADS]
    return found


def shaped_ops(path: Path) -> Counter:
    """Top-level ops by overload, each with its tensor arguments' shapes and strides
    (the file's own harness work left out)."""
    found: Counter = Counter()
    raw = load_trace(path)
    for sel in select_ops(raw).ops:
        if HARNESS_SCOPE in sel.scope or any(equivalent_of(scope) for scope in sel.scope):
            continue
        node = sel.node
        tensors = [arg for arg in node.inputs
                   if arg.type.startswith("Tensor") and "nullptr" not in arg.type]
        shapes = tuple(json.dumps(arg.shape) for arg in tensors)
        strides = tuple(json.dumps(arg.strides) for arg in tensors)
        found[(overload_name(node.name, node.op_schema), shapes, strides)] += 1
    # A replay ran an op it could not call as its portable equivalent, in a scope that
    # names it (as ``mystique-gen compare`` counts it): the op once, its shapes unknown.
    for key in filter(None, map(equivalent_of, (node.name for node in raw.nodes))):
        found[(key, PORTED, PORTED)] += 1
    return found


PORTED = ("(ported)",)  # the shapes of an op its portable equivalent ran: not recorded


def same_shapes(original: Counter, replayed: Counter) -> tuple[Counter, Counter]:
    """Both multisets with the shapes and strides of the ops the replay ran as
    equivalents dropped (their scope records none)."""
    ported = {key[0] for key in replayed if key[1] == PORTED}
    both = []
    for counter in (original, replayed):
        merged: Counter = Counter()
        for (op, shapes, strides), n in counter.items():
            if op in ported:
                shapes = strides = PORTED
            merged[(op, shapes, strides)] += n
        both.append(merged)
    return both[0], both[1]


def _keep(shaped: Counter, parts: int) -> Counter:
    """:func:`shaped_ops`' counts keyed by their first ``parts`` parts (1: the op
    multiset; 2: with shapes)."""
    kept: Counter = Counter()
    for key, n in shaped.items():
        kept[key[:parts]] += n
    return kept


def mismatch(original_et: Path, replay_et: Path) -> tuple[str, str] | None:
    """How the replay's top-level ops differ from the original's, first by overload,
    then by their tensors' shapes, then by their strides (the kernel a layout picks is
    the time it takes: a transposed operand is another GEMM, a channels-last input
    another convolution): an outcome and its detail, or None where they agree."""
    original, replayed = same_shapes(shaped_ops(original_et), shaped_ops(replay_et))
    ops = [_keep(original, 1), _keep(replayed, 1)]
    if ops[0] != ops[1]:
        missing = {k[0]: n for k, n in (ops[0] - ops[1]).items()}
        extra = {k[0]: n for k, n in (ops[1] - ops[0]).items()}
        return "op mismatch", f"missing {missing} extra {extra}"
    shaped = [_keep(original, 2), _keep(replayed, 2)]
    if shaped[0] != shaped[1]:
        missing = next(iter(shaped[0] - shaped[1]))
        return "shape mismatch", f"{missing[0]} {' '.join(missing[1])} not replayed at that shape"
    if original != replayed:
        missing = next(iter(original - replayed))
        got = [key[2] for key in replayed - original if key[:2] == missing[:2]]
        return "layout mismatch", (f"{missing[0]} strides {' '.join(missing[2])} replayed as "
                                   f"{' '.join(got[0]) if got else '?'}")
    return None


def last_error_line(text: str) -> str:
    """The last line of ``text`` that names an error (else its last line), cut short."""
    lines = [line for line in text.strip().splitlines() if "Error" in line or "error" in line]
    return (lines or text.strip().splitlines() or ["?"])[-1][:160]


def run_one(path: Path, name: str, work: Path, timeout: float) -> tuple[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    et = work / "step.et.json"
    proc = subprocess.run([sys.executable, "-c", CAPTURE, str(path), name, str(et)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode or not et.exists():
        return "capture error", last_error_line(proc.stderr)
    bench = work / "bench.py"
    # The recorded step is the unit compared: a step of two optimizer steps (two
    # batches) is two iterations to the generator, which replays one by default.
    proc = subprocess.run([sys.executable, "-m", "mystique_gen", str(et), "-o", str(bench),
                           "--iteration", "all"],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if proc.returncode:
        return "gen error", last_error_line(proc.stderr)
    replay = work / "replay.json"
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(bench), "--device", "cpu",
                           "--warmup", "0", "--iters", "3", "--reset-inputs", "off", "--json",
                           "--et", str(replay)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=work)
    if proc.returncode:
        return "run error", last_error_line(proc.stderr)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    found = mismatch(et, replay)
    if found is not None:
        return found
    if result.get("nonfinite_inputs"):
        return "nonfinite", str(result["nonfinite_inputs"])[:160]
    born = new_births(path, name, bench, timeout, env)
    if born:
        return "nonfinite", f"NaN computed by {', '.join(born[:3])} (not in the eager step)"
    return "pass", ""


def _births(script: str, args: list[str], timeout: float,
            env: dict[str, str]) -> list[str] | None:
    """The births a NaN-birth script printed; None where it did not run to the end."""
    try:
        proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None
    found = [line for line in proc.stdout.splitlines() if line.startswith('{"nan_births"')]
    return json.loads(found[-1])["nan_births"] if proc.returncode == 0 and found else None


def new_births(path: Path, name: str, bench: Path, timeout: float,
               env: dict[str, str]) -> list[str]:
    """Ops that computed NaN from tensors without any in the replay's first iteration
    and in no op of that name in the eager step (nan_births.py); none where either
    side could not be checked."""
    scripts = str(Path(__file__).resolve().parent)
    replayed = _births(REPLAY_BIRTHS, [scripts, str(bench)], timeout, env)
    if not replayed:
        return []
    eager = _births(EAGER_BIRTHS, [str(path), name], timeout, env)
    return [] if eager is None else [op for op in replayed if op not in eager]


def main() -> int:
    only = [s for s in os.environ.get("FEATURES_ONLY", "").split(",") if s]
    timeout = float(os.environ.get("FEATURES_TIMEOUT", "300"))
    rows = [(path, name) for path, name in _workloads()
            if not only or any(s in name for s in only)]
    totals: Counter = Counter()
    print(f"{'workload':28s} {'outcome':21s} {'s':>5s}  detail")
    with tempfile.TemporaryDirectory() as tmp:
        for path, name in rows:
            work = Path(tmp) / name
            work.mkdir()
            start = time.perf_counter()
            try:
                outcome, detail = run_one(path, name, work, timeout)
            except subprocess.TimeoutExpired:
                outcome, detail = "run error", f"timed out after {timeout:.0f} s"
            known = outcome != "pass" and name in KNOWN
            totals["known" if known else outcome] += 1
            label = f"{outcome} (known)" if known else outcome
            shown = KNOWN[name] if known else detail
            print(f"{name:28s} {label:21s} {time.perf_counter() - start:5.0f}  {shown}",
                  flush=True)
    counted = ", ".join(f"{o} {totals[o]}" for o in (*OUTCOMES, "known"))
    print(f"totals over {len(rows)} steps: {counted}")
    unexpected = sum(totals[o] for o in OUTCOMES if o not in ("pass", "capture error"))
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
