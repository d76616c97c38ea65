"""Host overhead per op: the generated benchmark against the same ops called eagerly.

A trace of 10,000 small ops (``h = relu((h + y) * y)`` on 16-element tensors, so that
the host side dominates) is compiled; the generated file runs with ``--json`` and
its median iteration time per op is compared with two eager loops over the same op
sequence in one process: the public API (``torch.add`` ...), which the generated file
calls where it dispatches the recorded overload (passes/bindings.py), and the
``torch.ops.aten`` overloads (what ``--dispatcher-calls`` makes it call). Target
(issue 7): generated within 1.3x of eager.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OPS = 10_000
ELEMENTS = 16
ITERS = 30

ADD = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
MUL = "aten::mul.Tensor(Tensor self, Tensor other) -> Tensor"
RELU = "aten::relu(Tensor self) -> Tensor"

EAGER = """
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
ops, elements, iters = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
x, y = torch.rand(elements), torch.rand(elements)
add, mul, relu = torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor, torch.ops.aten.relu.default

def public():
    h = x
    for _ in range(ops // 3):
        h = torch.add(h, y, alpha=1)
        h = torch.mul(h, y)
        h = torch.relu(h)

def handles():
    h = x
    for _ in range(ops // 3):
        h = add(h, y, alpha=1)
        h = mul(h, y)
        h = relu(h)

result = {}
for name, fn in (("public", public), ("handles", handles)):
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000.0)
    result[name] = statistics.median(times)
print(json.dumps(result))
"""


def build_trace(path: Path) -> None:
    from tests.tracebuilder import TraceBuilder

    b = TraceBuilder()
    x, y = b.tensor((ELEMENTS,)), b.tensor((ELEMENTS,))
    h = x
    for _ in range(OPS // 3):
        a = b.tensor((ELEMENTS,))
        b.op(ADD, [h, y, 1], [a])
        m = b.tensor((ELEMENTS,))
        b.op(MUL, [a, y], [m])
        r = b.tensor((ELEMENTS,))
        b.op(RELU, [m], [r])
        h = r
    b.write(path)


def main() -> int:
    from mystique_gen.cli import main as generate

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory(prefix="mystique-overhead-") as tmp:
        trace, bench = Path(tmp) / "small_ops.json", Path(tmp) / "small_ops.py"
        build_trace(trace)
        if generate([str(trace), "-o", str(bench)]) != 0:
            print("generation failed")
            return 1
        # Interleave the runs so machine noise hits both alike; keep the best of each.
        generated, public, handles = [], [], []
        for _ in range(3):
            proc = subprocess.run(
                [sys.executable, str(bench), "--device", "cpu", "--warmup", "3", "--iters",
                 str(ITERS), "--json"], capture_output=True, text=True, env=env, timeout=600)
            if proc.returncode != 0:
                print(proc.stderr.strip().splitlines()[-1])
                return 1
            out = json.loads(proc.stdout.strip().splitlines()[-1])
            generated.append(out["iter_ms_median"] / out["ops"])
            eager = json.loads(subprocess.run(
                [sys.executable, "-c", EAGER, str(OPS // 3 * 3), str(ELEMENTS), str(ITERS)],
                capture_output=True, text=True, env=env, timeout=600, check=True).stdout)
            public.append(eager["public"] / (OPS // 3 * 3))
            handles.append(eager["handles"] / (OPS // 3 * 3))
    g, p, h = min(generated), min(public), min(handles)
    print(f"{OPS // 3 * 3:,} ops on {ELEMENTS}-element CPU tensors, median of {ITERS} iterations"
          f" (best of 3 runs; spread {statistics.pstdev(generated) * 1e3:.2f} us)")
    print(f"{'':<34} {'us/op':>8} {'ratio':>7}")
    print(f"{'generated benchmark (replay)':<34} {g * 1e3:>8.2f} {'':>7}")
    print(f"{'eager loop, public API (torch.add)':<34} {p * 1e3:>8.2f} {g / p:>6.2f}x")
    print(f"{'eager loop, torch.ops handles':<34} {h * 1e3:>8.2f} {g / h:>6.2f}x")
    print("target: generated within 1.3x of eager (the public API)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
