"""`make bench` section: step-time error of a replay with and without recorded host gaps.

For a few small torch.nn models (CPU, launch/host-bound on purpose) it captures an ET
and a Kineto trace of one step, generates with ``--kineto``, runs the benchmark with
``--host-gaps off`` and ``--host-gaps recorded``, and prints each replay's median step
time beside the eager step time measured without the profiler (the reference) and the
Kineto span of the captured step (``original_ms``, which includes profiler overhead).
Error = replay / eager - 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _models() -> dict[str, Callable[[], Callable[[], None]]]:
    import torch

    def deep_narrow_mlp() -> Callable[[], None]:
        torch.manual_seed(0)
        layers = [m for _ in range(12) for m in (torch.nn.Linear(16, 16), torch.nn.GELU())]
        model = torch.nn.Sequential(*layers)
        x = torch.randn(4, 16)

        def step() -> None:
            with torch.no_grad():
                model(x)

        return step

    def mlp_train() -> Callable[[], None]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

        def step() -> None:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        return step

    def conv_train() -> Callable[[], None]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                    torch.nn.Linear(8, 4))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = torch.randn(2, 3, 16, 16), torch.randint(0, 4, (2,))

        def step() -> None:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        return step

    return {"deep_narrow_mlp": deep_narrow_mlp, "mlp_train": mlp_train,
            "conv_train": conv_train}


def _run(bench: Path, gaps: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(bench), "--device", "cpu", "--warmup", "5", "--iters", "30",
         "--json", "--host-gaps", gaps],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    if proc.returncode:
        raise RuntimeError(f"{bench.name} --host-gaps {gaps} failed: {proc.stderr[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    import torch

    from mystique_gen.capture import capture
    from mystique_gen.generate import generate

    torch.set_num_threads(1)
    header = (f"{'model':<16} {'ops':>4} {'eager ms':>9} {'kineto ms':>9} {'off ms':>8} "
              f"{'gaps ms':>8} {'err off':>8} {'err gaps':>8}")
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in _models().items():
            out = Path(tmp) / name
            result = capture(make(), out, name=name, warmup=5, timing_iters=30)
            assert result.kineto_path is not None
            bench = out / "bench.py"
            generate(result.et_path, bench, kineto=result.kineto_path)
            off, gaps = _run(bench, "off"), _run(bench, "recorded")
            eager = result.step_ms_median
            print(f"{name:<16} {off['ops']:>4} {eager:>9.3f} {off['original_ms']:>9.3f} "
                  f"{off['iter_ms_median']:>8.3f} {gaps['iter_ms_median']:>8.3f} "
                  f"{off['iter_ms_median'] / eager - 1:>+8.0%} "
                  f"{gaps['iter_ms_median'] / eager - 1:>+8.0%}", flush=True)
    print("err = replay median / eager step median - 1 (eager timed without the profiler; "
          "recorded gaps include profiler overhead, so 'gaps' tends to overshoot on CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
