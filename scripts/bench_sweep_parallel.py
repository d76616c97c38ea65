"""`make bench` section: do transformers' LMs replay under their own parallel plans?

transformers loads a model with its own expert-, tensor-, FSDP2 and pipeline plans
(``from_pretrained(..., distributed_config=DistributedConfig(...))``), as a user
serving or fine-tuning a checkpoint on several ranks does. For every causal-LM
architecture whose config names the plan (``SWEEP_PLANS``, default ``ep``; ``ep,tp,
fsdp,pp`` for all four), the sweep's shrunk config and weights (scripts/bench_sweep.py
``build``, no download) are saved, and two gloo ranks under torchrun load them with it:
- ep (``base_model_ep_plan``): ``ep_size=2, tp_size=2, tp_plan={}``, tokens sent to
  their experts' ranks and back by all-to-all;
- tp (``base_model_tp_plan``): ``tp_size=2``, the layers' weights as DTensor shards;
- fsdp (``base_model_fsdp_plan``, which every config has by default): ``fsdp_size=2``,
  each rank training on a batch of its own;
- pp (``base_model_pp_plan``): ``pp_size=2``, the layers split in two stages, which
  transformers runs for generation only: the step is a 4-token greedy ``generate``.
The training plans capture one AdamW step on token ids as their own labels
(``mystique_gen.tools.capture.capture``, no Kineto). One benchmark is generated from
both ranks' ETs and replayed under torchrun (3 iterations without ``--reset-inputs``,
``--et``), and each rank's top-level ops are compared by overload.

Outcomes as the sweep's: skip (the model does not build, load with the plan or train
eagerly: not our failure), capture error, gen error, run error, op mismatch, nonfinite
(an input the replay writes ends NaN or inf), crash (a timeout or a rank's signal),
pass; ``comm``: the collectives rank 0 recorded (0: the plan sharded nothing at this
size, a single-process replay in all but name). Environment: SWEEP_PLANS=ep,tp,
SWEEP_ONLY=substr,... (=name: that name only), SWEEP_SAMPLE=K/N, SWEEP_TIMEOUT
(seconds per model and plan, default 600). Needs ``accelerate`` (a test extra):
transformers refuses a parallel plan without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import bench_sweep  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from bench_sweep import named, sampled  # noqa: E402

from mystique_gen.tools.capture import capture  # noqa: E402
from mystique_gen.tools.compare import op_multiset  # noqa: E402
from tests.launch import launch_env, torchrun  # noqa: E402

RANKS = 2
PLANS = {"ep": {"ep_size": RANKS, "tp_size": RANKS, "tp_plan": {}},
         "tp": {"tp_size": RANKS}, "fsdp": {"fsdp_size": RANKS}, "pp": {"pp_size": RANKS}}
PLAN_ATTRIBUTE = {"ep": "base_model_ep_plan", "tp": "base_model_tp_plan",
                  "fsdp": "base_model_fsdp_plan", "pp": "base_model_pp_plan"}
# transformers runs its pipeline stages for generation, not for training.
SERVED = frozenset({"pp"})
NEW_TOKENS = 4
OUTCOMES = ("skip", "capture error", "gen error", "run error", "op mismatch", "nonfinite",
            "crash", "pass")
REPLAY_ITERS = 3


def architectures(plan: str) -> list[str]:
    """The causal LMs whose config class names a ``plan`` plan, sorted."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto

    found = []
    for arch in sorted(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            config_class = CONFIG_MAPPING[arch]
        except KeyError:
            continue
        if getattr(config_class, PLAN_ATTRIBUTE[plan], None):
            found.append(arch)
    return found


def rank_main(arch: str, plan: str, out: Path) -> int:
    """One rank (under torchrun): rank 0 builds and saves the shrunk model, every rank
    loads it with ``plan`` and captures one training step (a ``generate`` call for a
    plan in SERVED). A failure before the capture is written to ``skip-<rank>`` (the
    model's or transformers', not ours)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    saved = out / "model"
    if rank == 0:
        try:
            model, _, _ = bench_sweep.build("causal", arch)
            model.save_pretrained(saved)
            del model
        except Exception as exc:  # noqa: BLE001 - bench_sweep.Skip or a save failure
            why = bench_sweep._first_line(exc)
            (out / "skip-0").write_text(why if why.startswith("build") else f"build: {why}")
    dist.barrier()
    if (out / "skip-0").exists():
        return 0
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, DistributedConfig

        config = AutoConfig.from_pretrained(saved)
        model = AutoModelForCausalLM.from_pretrained(
            saved, distributed_config=DistributedConfig(**PLANS[plan]), dtype=torch.float32)
        # (FSDP's ranks train on batches of their own; the others' ranks share one)
        seed = rank if plan == "fsdp" else 0
        ids = torch.randint(1, bench_sweep._vocab(config), (2, bench_sweep.SEQ),
                            generator=torch.Generator().manual_seed(seed))
        step = _served(model, ids) if plan in SERVED else _trained(model, ids)
        step()  # eagerly first: a model that cannot run with the plan is no failure of ours
    except Exception as exc:  # noqa: BLE001
        (out / f"skip-{rank}").write_text(
            f"eager: {type(exc).__name__}: {bench_sweep._first_line(exc)}")
        # The peer may wait in a collective this rank never issues: end the job.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    capture(step, out, name=f"step-rank-{rank}", warmup=1, timing_iters=1, kineto=False)
    dist.destroy_process_group()
    return 0


def _trained(model: torch.nn.Module, ids: torch.Tensor) -> Callable[[], None]:
    """One AdamW step of ``model`` on ``ids`` as their own labels."""
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _served(model: torch.nn.Module, ids: torch.Tensor) -> Callable[[], object]:
    """A greedy ``generate`` of NEW_TOKENS tokens after ``ids``."""
    model.eval()

    def step() -> object:
        with torch.no_grad():
            return model.generate(input_ids=ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                  pad_token_id=0)

    return step


def _torchrun(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return torchrun(RANKS, *args, cwd=cwd, timeout=timeout,
                    env=launch_env(keep_pythonpath=True, TRANSFORMERS_VERBOSITY="error"))


def _error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if "Error" in line
             and "ChildFailedError" not in line and "errors.html" not in line]
    return (lines[-1] if lines else (text.strip().splitlines() or [""])[-1])[:200]


def run_one(arch: str, plan: str, work: Path, timeout: float) -> dict[str, object]:
    """Capture, generate, replay and compare ``arch`` under ``plan``: one row."""
    try:
        cap = _torchrun([__file__, "--rank", arch, plan, str(work)], work, timeout)
    except subprocess.TimeoutExpired:
        return {"outcome": "crash", "error": f"capture: timeout after {timeout:.0f} s"}
    skips = [path.read_text() for path in sorted(work.glob("skip-*"))]
    if skips:
        # (the rank that failed first says why; its peers only that it went away)
        own = [why for why in skips if "Connection closed by peer" not in why]
        return {"outcome": "skip", "error": (own or skips)[0]}
    ets = [work / f"step-rank-{r}.et.json" for r in range(RANKS)]
    if cap.returncode != 0 or not all(et.exists() for et in ets):
        return {"outcome": "capture error", "error": _error_line(cap.stderr)}
    bench = work / "bench.py"
    gen = subprocess.run([sys.executable, "-m", "mystique_gen", *map(str, ets), "-o",
                          str(bench)], capture_output=True, text=True, check=False, cwd=ROOT)
    if gen.returncode != 0:
        return {"outcome": "gen error", "error": _error_line(gen.stderr)}
    try:
        run = _torchrun([str(bench), "--device", "cpu", "--warmup", "0", "--iters",
                         str(REPLAY_ITERS), "--reset-inputs", "off", "--json", "--et",
                         str(work / "replay.json")], work, timeout)
    except subprocess.TimeoutExpired:
        return {"outcome": "crash", "error": f"replay: timeout after {timeout:.0f} s"}
    if run.returncode != 0:
        return {"outcome": "run error", "error": _error_line(run.stderr)}
    out = json.loads(run.stdout.strip().splitlines()[-1])
    originals = [op_multiset(et, by_overload=True) for et in ets]
    row: dict[str, object] = {
        "ops": sum(originals[0].values()),
        "comm": sum(n for op, n in originals[0].items() if "c10d" in op)}
    for rank, original in enumerate(originals):
        replayed = op_multiset(work / f"replay.rank{rank}.json", by_overload=True)
        if original != replayed:
            missing, extra = original - replayed, replayed - original
            row.update(outcome="op mismatch", error=f"rank {rank}: missing "
                       f"{dict(missing.most_common(3))} extra {dict(extra.most_common(3))}")
            return row
    nonfinite = out.get("nonfinite_inputs")
    if nonfinite:
        row.update(outcome="nonfinite", error=f"NaN or inf in {', '.join(nonfinite[:3])}")
    else:
        row["outcome"] = "pass"
    return row


def main() -> int:
    try:
        import accelerate  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print("transformers and accelerate are needed: pip install -e '.[test,bench]'")
        return 1
    plans = [p for p in os.environ.get("SWEEP_PLANS", "ep").split(",") if p]
    only = [s for s in os.environ.get("SWEEP_ONLY", "").split(",") if s]
    timeout = float(os.environ.get("SWEEP_TIMEOUT", "600"))
    work = sampled([(plan, arch) for plan in plans for arch in architectures(plan)
                    if named(arch, only)])
    print(f"{len(work)} architecture x plan pairs on {RANKS} gloo ranks", flush=True)
    print(f"{'plan':<5} {'arch':<28} {'outcome':<13} {'ops':>5} {'comm':>5} {'s':>5}  error",
          flush=True)
    totals: Counter[str] = Counter()
    for plan, arch in work:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="sweep-parallel-") as tmp:
            try:
                row = run_one(arch, plan, Path(tmp), timeout)
            except Exception as exc:  # noqa: BLE001 - a crash of this script is a row
                row = {"outcome": "crash", "error": f"{type(exc).__name__}: {exc}"[:200]}
                traceback.print_exc()
        totals[str(row["outcome"])] += 1
        print(f"{plan:<5} {arch:<28} {row['outcome']:<13} {row.get('ops', ''):>5} "
              f"{row.get('comm', ''):>5} {time.perf_counter() - start:>5.0f}  "
              f"{row.get('error', '')}", flush=True)
    print(f"totals over {len(work)} pairs: "
          + ", ".join(f"{o} {totals[o]}" for o in OUTCOMES))
    ran = len(work) - totals["skip"]
    if ran:
        print(f"pass rate of the pairs that ran eagerly: {totals['pass']}/{ran}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--rank":
        code = rank_main(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # gloo's threads can abort the interpreter's teardown
    sys.exit(main())
