"""`make bench` section: do PyTorch's own OpInfo samples replay?

For each pass (dtype, forward or forward+backward) the OpInfos of ``op_db`` that support
the dtype on CPU are split into batches. Each batch is recorded with a plain
``ExecutionTraceObserver`` in a subprocess (every sample call inside
``record_function("probe:<op>#<k>")``; samples whose eager call raises are skipped), a
benchmark is generated (in-process, as the CLI does), replayed standalone
(``--warmup 0 --iters 3 --reset-inputs off --json --et replay.json``, mystique_gen
unimportable), and compared per probe scope:

* ``not replayed``: the program's not-replayed diagnostics, by their nodes' scope;
* ``run error``: the replay's traceback line in replay() -> the scope comment above it;
  the scope is dropped and the batch captured again, so one op hides nothing else;
* ``gen error``: the batch is halved until the op is found;
* ``mismatch``: top-level (overload, tensor shapes) sequences aligned by difflib; a
  scope whose original ops are not all matched one for one;
* ``nonfinite``: replay's ``nonfinite_inputs`` mapped to the scope that first reads
  them, where the original's sample tensors (and grads) were finite;
* ``pass``.

Usage: python scripts/bench_opinfo.py [OUTDIR] [--passes fwd,grad,float64,...] [--only a,b]
       [--batch 50]  (OPINFO_PASSES=... sets the passes where none are given; all eight,
       about 25 minutes on one core, by default). Needs ``expecttest`` (the bench extra),
which op_db imports. Writes OUTDIR/results.jsonl (one row per scope; a temporary folder
by default) and prints totals per pass.
"""

# ruff: noqa: E501 (the child processes' sources are strings of long lines)
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEPS = os.environ.get("PROBE_DEPS", "")  # a folder holding expecttest, if not installed

PASSES = {  # name: (dtype, backward, samples per op)
    "fwd": ("float32", False, 2),
    # in-place variants (op.inplace_variant on the sample's input), float32
    "inplace": ("float32", "inplace", 1),
    "grad": ("float32", True, 1),
    "float64": ("float64", False, 1),
    "bfloat16": ("bfloat16", False, 1),
    "int64": ("int64", False, 1),
    "bool": ("bool", False, 1),
    "complex64": ("complex64", False, 1),
}

NF_MODE = r'''
import torch as _t
from torch.utils._python_dispatch import TorchDispatchMode as _TDM
from torch.utils._pytree import tree_leaves as _leaves
_PROBE_AT = [None]
_PROBE_NF = set()

class _NonFinite(_TDM):
    """Marks the probe scope in force where an op returns NaN or inf."""
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        at = _PROBE_AT[0]
        # (uninitialised results, empty & co., may hold NaN bits: not a value's fault)
        if at is not None and at not in _PROBE_NF and "empty" not in str(func) \
                and "resize" not in str(func) and "set_" not in str(func):
            for t in _leaves(out):
                if (isinstance(t, _t.Tensor) and t.layout == _t.strided
                        and (t.is_floating_point() or t.is_complex())):
                    try:
                        if not bool(_t.isfinite(t).all()):
                            _PROBE_NF.add(at)
                            break
                    except Exception:
                        pass
        return out
'''

CAPTURE = NF_MODE + r'''
import itertools, json, sys, torch
from torch.profiler import ExecutionTraceObserver, record_function
from torch.testing._internal.common_methods_invocations import op_db
spec = json.load(open(sys.argv[1]))
dtype = getattr(torch, spec["dtype"]); grad = spec["grad"]; want = set(spec["ops"])
sample_grad = grad is True

def key(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")

def tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from tensors(y)

def loss_of(out):
    parts = [t.abs().sum() if t.is_complex() else t.sum() for t in tensors(out)
             if t.requires_grad and (t.is_floating_point() or t.is_complex())]
    return sum(parts) if parts else None

def call(op, s):
    fn = op.inplace_variant if grad == "inplace" else op
    out = fn(s.input, *s.args, **s.kwargs)
    if grad is True:
        loss = loss_of(out)
        if loss is None:
            raise RuntimeError("no differentiable output")
        loss.backward()
    return out

def finite(s):
    ok = True
    for t in tensors([s.input, list(s.args), s.kwargs]):
        for u in (t, t.grad if t.requires_grad and t.is_leaf else None):
            if u is not None and (u.is_floating_point() or u.is_complex()) and u.layout == torch.strided:
                ok = ok and bool(torch.isfinite(u).all())
    return ok

torch.manual_seed(0); torch.set_num_threads(1)
calls, skipped = [], {}
for op in op_db:
    k = key(op)
    if k not in want:
        continue
    try:
        samples = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=sample_grad), spec["samples"]))
    except Exception as e:
        skipped[k] = "samples: " + str(e).splitlines()[0][:100] if str(e) else type(e).__name__
        continue
    for i, s in enumerate(samples):
        try:
            _PROBE_AT[0] = f"{k}#{i}"
            with _NonFinite():
                call(op, s)
        except Exception as e:
            skipped[f"{k}#{i}"] = (type(e).__name__ + ": " + (str(e).splitlines() or [""])[0])[:120]
            continue
        # fresh sample for the recorded call (the check may have accumulated grads)
        torch.manual_seed(i)
        fresh = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=sample_grad), i + 1))[i]
        calls.append((f"{k}#{i}", op, fresh))
    _PROBE_AT[0] = None
meta = {"skipped": skipped, "scopes": {}, "order": []}
obs = ExecutionTraceObserver().register_callback(sys.argv[2])
obs.start()
for name, op, s in calls:
    try:
        with record_function("probe:" + name):
            call(op, s)
        meta["scopes"][name] = {"sample": s}
    except Exception as e:
        meta["scopes"][name] = {"error": str(e)[:120]}
    meta["order"].append(name)
obs.stop(); obs.unregister_callback()
for name, info in meta["scopes"].items():
    if "sample" in info:
        info["finite"] = finite(info.pop("sample"))
        info["out_nonfinite"] = name in _PROBE_NF
json.dump(meta, open(sys.argv[3], "w"))
'''

LIST = r'''
import json, sys, torch
from torch.testing._internal.common_methods_invocations import op_db
dtype = getattr(torch, sys.argv[1]); grad = sys.argv[2] == "1"; inplace = sys.argv[2] == "inplace"
out = []
for op in op_db:
    k = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
    try:
        ok = dtype in op.supported_dtypes("cpu")
    except Exception:
        ok = False
    if ok and (not grad or op.supports_autograd) and (not inplace or op.inplace_variant is not None):
        out.append(k)
print(json.dumps(out))
'''

RUNNER = ("import runpy, sys; sys.modules['mystique_gen'] = None; "
          "path = sys.argv[1]; sys.argv = sys.argv[1:]; runpy.run_path(path, run_name='__main__')")


def _env(deps: bool) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    if deps and DEPS:
        env["PYTHONPATH"] = DEPS
    return env


def list_ops(dtype: str, grad: bool) -> list[str]:
    mode = "inplace" if grad == "inplace" else "1" if grad else "0"
    proc = subprocess.run([sys.executable, "-c", LIST, dtype, mode],
                          capture_output=True, text=True, env=_env(True), timeout=600)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def capture(ops: list[str], dtype: str, grad: bool, samples: int, work: Path) -> dict:
    spec = work / "spec.json"
    spec.write_text(json.dumps({"ops": ops, "dtype": dtype, "grad": grad, "samples": samples}))
    et, meta = work / "step.et.json", work / "meta.json"
    for f in (et, meta):
        f.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-c", CAPTURE, str(spec), str(et), str(meta)],
                          capture_output=True, text=True, env=_env(True), timeout=900)
    if proc.returncode or not meta.exists():
        raise RuntimeError("capture failed: " + proc.stderr.strip()[-300:])
    return json.loads(meta.read_text())


def probe_scope(node, by_id) -> str | None:
    seen = 0
    while node is not None and seen < 200:
        if node.name.startswith("probe:"):
            return node.name[len("probe:"):]
        node = by_id.get(node.parent)
        seen += 1
    return None


def shaped(path: Path) -> list[tuple[tuple, str | None]]:
    from mystique_gen.constants import HARNESS_SCOPE
    from mystique_gen.passes.select import select_ops
    from mystique_gen.sources.et import load_trace
    from mystique_gen.tools.compare import overload_name
    out = []
    for sel in select_ops(load_trace(path)).ops:
        if HARNESS_SCOPE in sel.scope:
            continue
        node = sel.node
        shapes = tuple(json.dumps(a.shape) for a in node.inputs
                       if a.type.startswith("Tensor") and "nullptr" not in a.type)
        scope = next((s[len("probe:"):] for s in sel.scope if s.startswith("probe:")), None)
        out.append(((overload_name(node.name, node.op_schema), shapes), scope))
    return out


def generate(et: Path, bench: Path, extra: dict) -> dict[str, list[str]]:
    """Write the benchmark; the not-replayed reasons by scope."""
    from mystique_gen.driver import compile_paths, render, write_atomic
    from mystique_gen.sources.et import load_trace
    compiled = compile_paths([et])
    write_atomic(bench, render(compiled))
    trace = load_trace(et)
    by_id = {n.id: n for n in trace.nodes}
    found: dict[str, list[str]] = defaultdict(list)
    for d in compiled.programs[0].not_replayed:
        node = by_id.get(d.node_id)
        scope = probe_scope(node, by_id) if node is not None else None
        found[scope or "?"].append(f"{d.name}: {d.reason}"[:200])
    return found


def scope_lines(bench: Path) -> tuple[dict[int, str], dict[str, str]]:
    """bench.py line -> probe scope in force there (inside replay()), and each input
    name -> the scope that first reads it."""
    lines = bench.read_text().splitlines()
    at, first_read = {}, {}
    in_replay, scope = False, None
    for no, line in enumerate(lines, 1):
        if line.startswith("def replay("):
            in_replay = True
            continue
        if in_replay and line and not line.startswith(" "):
            break
        if not in_replay:
            continue
        m = re.match(r"\s*# probe:(\S+)", line)
        if m:
            scope = m.group(1)
        at[no] = scope or "?"
        if scope and not re.match(r"\s*\w+ = inputs\[", line):
            for name in re.findall(r"[A-Za-z_]\w*", line):
                first_read.setdefault(name, scope)
    return at, first_read


def replay(bench: Path, work: Path) -> tuple[dict | None, str]:
    rep = work / "replay.json"
    rep.unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(bench), "--device", "cpu",
                           "--warmup", "0", "--iters", "3", "--reset-inputs", "off", "--json",
                           "--et", str(rep)], capture_output=True, text=True, timeout=900,
                          env=_env(False), cwd=work)
    if proc.returncode:
        return None, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def replay_nonfinite(bench: Path, work: Path) -> set[str] | None:
    """Scopes where some replayed op returned NaN or inf (one iteration, under a
    dispatch mode); None where the instrumented run failed."""
    lines, out = bench.read_text().splitlines(), []
    dump = work / "nf.json"
    dump.unlink(missing_ok=True)
    in_replay = False
    for line in lines:
        if line.startswith("def replay("):
            in_replay = True
        elif in_replay and line and not line.startswith(" "):
            in_replay = False
        m = re.match(r"(\s*)# probe:(\S+)", line) if in_replay else None
        if in_replay and line.strip() == "return None":
            out.append(line.replace("return None", "_PROBE_AT[0] = None"))
        out.append(line)
        if m:
            out.append(f"{m.group(1)}_PROBE_AT[0] = {m.group(2)!r}")
        if line == "import torch":
            out += NF_MODE.splitlines()
            out += ["import atexit as _ax, json as _js", "_NF_ON = _NonFinite()",
                    "_NF_ON.__enter__()",
                    f"_ax.register(lambda: open({str(dump)!r}, 'w')"
                    ".write(_js.dumps(sorted(_PROBE_NF))))"]
    inst = work / "bench_nf.py"
    inst.write_text("\n".join(out) + "\n")
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(inst), "--device", "cpu",
                           "--warmup", "0", "--iters", "1", "--reset-inputs", "on"],
                          capture_output=True, text=True, timeout=900, env=_env(False), cwd=work)
    if proc.returncode or not dump.exists():
        return None
    return set(json.loads(dump.read_text()))


def error_scope(stderr: str, bench: Path) -> tuple[str | None, str]:
    at, _ = scope_lines(bench)
    lines = [int(m) for m in re.findall(rf'File "{re.escape(str(bench))}", line (\d+)', stderr)]
    tail = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    msg = (tail[-1] if tail else "?")[:220]
    for no in reversed(lines):
        if no in at:
            return at[no], msg
    return None, msg


def compare(et: Path, rep: Path) -> dict[str, str]:
    """Scopes whose recorded top-level ops the replay did not run one for one."""
    orig, again = shaped(et), [k for k, _ in shaped(rep)]
    sm = difflib.SequenceMatcher(None, [k for k, _ in orig], again, autojunk=False)
    bad: dict[str, list[str]] = defaultdict(list)
    last_scope = None
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            last_scope = orig[i2 - 1][1]
            continue
        for k, scope in orig[i1:i2]:
            bad[scope or "?"].append(f"-{k[0]}{list(k[1])}")
        scope = orig[i1][1] if i2 > i1 else last_scope
        for k in again[j1:j2]:
            bad[scope or "?"].append(f"+{k[0]}{list(k[1])}")
        if i2 > i1:
            last_scope = orig[i2 - 1][1]
    return {s: " ".join(v)[:300] for s, v in bad.items()}


def run_batch(ops: list[str], pname: str, work: Path, log) -> None:
    dtype, grad, samples = PASSES[pname]
    work.mkdir(parents=True, exist_ok=True)
    todo = list(ops)
    for _round in range(12):
        if not todo:
            return
        try:
            meta = capture(todo, dtype, grad, samples, work)
        except RuntimeError as exc:  # the observer itself aborted: halve
            if len(todo) == 1:
                log({"pass": pname, "scope": todo[0], "outcome": "capture error",
                     "detail": str(exc)[-200:]})
                return
            half = len(todo) // 2
            run_batch(todo[:half], pname, work / "a", log)
            run_batch(todo[half:], pname, work / "b", log)
            return
        for k, why in meta["skipped"].items():
            log({"pass": pname, "scope": k, "outcome": "eager error", "detail": why})
        et, bench = work / "step.et.json", work / "bench.py"
        try:
            not_rep = generate(et, bench, {})
        except Exception as exc:  # gen error: halve
            if len(todo) == 1:
                log({"pass": pname, "scope": todo[0], "outcome": "gen error",
                     "detail": f"{type(exc).__name__}: {exc}"[:300]})
                return
            half = len(todo) // 2
            run_batch(todo[:half], pname, work / "a", log)
            run_batch(todo[half:], pname, work / "b", log)
            return
        result, stderr = replay(bench, work)
        if result is None:
            scope, msg = error_scope(stderr, bench)
            if scope is None or scope == "?":
                if len(todo) == 1:
                    log({"pass": pname, "scope": todo[0], "outcome": "run error",
                         "detail": "(outside replay) " + msg})
                    return
                half = len(todo) // 2
                run_batch(todo[:half], pname, work / "a", log)
                run_batch(todo[half:], pname, work / "b", log)
                return
            op = scope.rsplit("#", 1)[0]
            log({"pass": pname, "scope": scope, "outcome": "run error", "detail": msg})
            todo.remove(op)
            (work / f"crash_{op}.py").write_text(bench.read_text())
            continue
        mism = compare(et, work / "replay.json")
        _, first_read = scope_lines(bench)
        nonfin: dict[str, list[str]] = defaultdict(list)
        for name in result.get("nonfinite_inputs") or []:
            nonfin[first_read.get(name, "?")].append(name)
        replay_nf = replay_nonfinite(bench, work)
        if replay_nf is None:
            log({"pass": pname, "scope": f"{work.name}", "outcome": "nf-probe failed",
                 "detail": ""})
            replay_nf = set()
        for scope in meta["order"]:
            info = meta["scopes"][scope]
            if "error" in info:
                log({"pass": pname, "scope": scope, "outcome": "eager error",
                     "detail": "recorded call: " + info["error"]})
                continue
            if scope in not_rep:
                outcome, detail = "not replayed", "; ".join(sorted(set(not_rep[scope])))
            elif scope in mism:
                outcome, detail = "mismatch", mism[scope]
            elif scope in nonfin and info.get("finite", True):
                outcome, detail = "nonfinite", ",".join(nonfin[scope])
            elif scope in replay_nf and not info.get("out_nonfinite"):
                outcome, detail = "nonfinite", "an op's result (original's finite)"
            else:
                outcome, detail = "pass", ""
            log({"pass": pname, "scope": scope, "outcome": outcome, "detail": detail})
        for scope in set(not_rep) | set(mism) | set(nonfin):
            if scope not in meta["scopes"]:
                why = not_rep.get(scope) or mism.get(scope) or nonfin.get(scope)
                log({"pass": pname, "scope": scope, "outcome": "unattributed",
                     "detail": str(why)[:300]})
        return


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", help="results folder (default: a temporary one)")
    ap.add_argument("--passes", default=os.environ.get("OPINFO_PASSES", ",".join(PASSES)))
    ap.add_argument("--only", default="")
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--limit", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="opinfo-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    fh = results.open("a")

    def log(row: dict) -> None:
        fh.write(json.dumps(row) + "\n")
        fh.flush()
        if row["outcome"] != "pass":
            print(f"  {row['pass']:9s} {row['scope']:40s} {row['outcome']:13s} "
                  f"{row['detail'][:150]}", flush=True)

    only = [s for s in args.only.split(",") if s]
    for pname in args.passes.split(","):
        dtype, grad, _ = PASSES[pname]
        ops = list_ops(dtype, grad)
        if only:
            ops = [o for o in ops if any(s == o or s == o.split(".")[0] for s in only)]
        if args.limit:
            ops = ops[:args.limit]
        print(f"pass {pname}: {len(ops)} ops", flush=True)
        for b in range(0, len(ops), args.batch):
            start = time.time()
            try:
                run_batch(ops[b:b + args.batch], pname, out / pname / f"b{b:04d}", log)
            except Exception as exc:  # a batch the probe itself could not run
                print(f"  batch {b}: probe failure {type(exc).__name__}: {str(exc)[:200]}")
                log({"pass": pname, "scope": f"batch{b}", "outcome": "probe failure",
                     "detail": str(exc)[:300]})
            print(f" batch {b}-{b + args.batch}: {time.time() - start:.0f} s", flush=True)
    fh.close()
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    final = {}
    for r in rows:
        final[(r["pass"], r["scope"])] = r
    for pname in sorted({p for p, _ in final}):
        c = Counter(r["outcome"] for (p, _), r in final.items() if p == pname)
        print(pname, dict(c))
    return 0


if __name__ == "__main__":
    sys.exit(main())
