"""Scale: generation time and peak memory against a bare ``json.load`` of the same trace,
and one CPU iteration of the biggest real trace's benchmark.

Targets (issue 7): generation at most 5x ``json.load`` of the trace (the GPT-2 trace of
../shared/traces, 27k nodes), linear in the trace size (synthetic traces of 10k, 100k
and 1M nodes), and peak memory at most 3x the JSON text's size.

Every measurement runs in a fresh process, so peak RSS is that run's own high-water
mark. "RSS growth" is the peak minus the RSS after the imports (Python, torch, the
generator, the template): what the trace itself costs. json.load gets the same
treatment, with its imports done first. Run alone: ``python scripts/bench_scale.py``
(``--sizes 10000,100000`` to skip the million-node trace).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.synthetic import write_synthetic  # noqa: E402

GPT2 = ROOT.parent / "shared" / "traces" / "param" / "hf_gpt2_et.json.gz"
SIZES = (10_000, 100_000, 1_000_000)

# Peak RSS of this process: VmHWM (Linux), which starts afresh at exec; ru_maxrss
# carries the parent's peak over fork and exec, so a big `make bench` parent would
# hide every measurement below its own size.
_RSS = """
import resource, sys, time, json
def rss_mb():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
"""

JSON_LOAD = _RSS + """
import gzip
path = sys.argv[1]
base = rss_mb()
start = time.perf_counter()
with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
    json.load(f)
elapsed = time.perf_counter() - start
print(json.dumps({"s": elapsed, "peak_mb": rss_mb(), "growth_mb": rss_mb() - base}))
"""

GENERATE = _RSS + """
import os
import torch  # noqa: F401  imports are not the trace's cost
from mystique_gen.cli import main
from mystique_gen.backends.single import reference_facts
reference_facts()
base = rss_mb()
start = time.perf_counter()
with open(os.devnull, "w") as null:
    sys.stderr, err = null, sys.stderr
    rc = main(sys.argv[1:])
    sys.stderr = err
elapsed = time.perf_counter() - start
print(json.dumps({"s": elapsed, "rc": rc, "peak_mb": rss_mb(), "growth_mb": rss_mb() - base}))
"""


def run(code: str, *args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def json_size(path: Path) -> int:
    if path.name.endswith(".gz"):
        import gzip

        with gzip.open(path, "rb") as f:
            return sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
    return path.stat().st_size


def measure(label: str, trace: Path, nodes: int, out_dir: Path, *flags: str) -> None:
    size = json_size(trace)
    base = run(JSON_LOAD, str(trace))
    gen = run(GENERATE, str(trace), "-o", str(out_dir / "bench.py"), *flags)
    if gen["rc"] != 0:
        print(f"{label:>12}  generation failed (exit {gen['rc']})")
        return
    print(f"{label:>12} {nodes:>9,} {size / 2**20:>8.1f} {base['s']:>8.2f} {gen['s']:>8.2f} "
          f"{gen['s'] / base['s']:>6.2f}x {nodes / gen['s']:>9,.0f} {gen['peak_mb']:>8.0f} "
          f"{gen['growth_mb']:>7.0f} {gen['growth_mb'] * 2**20 / size:>6.2f}x "
          f"{base['growth_mb'] * 2**20 / size:>6.2f}x", flush=True)


def replay_once(label: str, bench: Path) -> bool:
    """One CPU iteration of a generated benchmark, run standalone without input resets
    (as a user timing one step would): its time, ops, and any aten op skipped at run
    time or input left NaN or inf. The GPT-2 trace's step is 2.5 TFLOP of matmuls, a
    minute or two on one core, so this check lives here rather than in `make test`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, str(bench), "--device", "cpu", "--warmup", "0",
                           "--iters", "1", "--reset-inputs", "off", "--json"],
                          capture_output=True, text=True, env=env, cwd=bench.parent,
                          timeout=3600)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["?"]
        print(f"{label:>12}  replay failed (exit {proc.returncode}): {tail[0][:160]}")
        return False
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    skipped = [op for op in result["skipped_at_runtime"] if op.startswith("aten.")]
    nonfinite = result.get("nonfinite_inputs") or []
    print(f"{label:>12}  one CPU iteration {result['iter_ms_median'] / 1000:.1f} s, "
          f"{result['ops']} ops, aten ops skipped {skipped or 'none'}, inputs NaN or inf "
          f"after it: {len(nonfinite)}", flush=True)
    return not skipped and not nonfinite


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    args = parser.parse_args(argv)
    print("generation vs json.load; memory: peak RSS growth over the imports, / JSON size")
    print(f"{'trace':>12} {'nodes':>9} {'JSON MiB':>8} {'load s':>8} {'gen s':>8} {'ratio':>7} "
          f"{'nodes/s':>9} {'peak MiB':>8} {'+MiB':>7} {'mem':>7} {'load mem':>7}")
    with tempfile.TemporaryDirectory(prefix="mystique-scale-") as tmp:
        out_dir = Path(tmp)
        replayed = True
        if GPT2.is_file():
            measure("gpt2", GPT2, 27_156, out_dir)
            replayed = replay_once("gpt2", out_dir / "bench.py")
        else:
            print(f"{'gpt2':>12}  skipped: {GPT2} not found")
        for n in (int(s) for s in args.sizes.split(",") if s):
            trace = out_dir / f"synthetic_{n}.json"
            count = write_synthetic(trace, n)
            measure(f"synth {n // 1000}k", trace, count, out_dir, "--iteration", "all")
            trace.unlink()
    print("targets: ratio <= 5x json.load; nodes/s flat across sizes (linear); mem <= 3x; "
          "GPT-2's step replays on CPU whole and finite")
    return 0 if replayed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
