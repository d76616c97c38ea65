"""What a distributed benchmark adds to the runtime: process groups and the torchrun job.

Inlined after ``runtime.py`` into files generated from traces with collectives. Under
torchrun each process replays its own rank; without a launcher, a one-rank trace runs
in a one-rank group, and a multi-rank trace replays its lowest rank's compute without
communication. ``_Ranks`` is the job ``runtime.main`` asks at every point where a
distributed run differs.

Each rank replays with its own recorded timing: ``RANKS`` holds every rank's linked
Kineto facts (``ORIGINAL_RANK<N>``), and ``--host-gaps recorded`` calibrates and waits
on each rank with that rank's gaps. The generator links a Kineto trace to every rank or
to none, so every rank calibrates, and runs the same collectives while it does.
"""

import os
import sys
import time

import torch

from mystique_gen.harness.runtime import (
    _RUNTIME,
    OPS,
    _harness,
    _Local,
    _summary,
    _usable_device,
    _waited_for_peers,
)

# <generated-file>
WORLD_SIZE = 1
PROCESS_GROUPS = []
RANKS = {}  # rank -> (make_inputs_rankN, replay_rankN, ops, ORIGINAL_RANKN or None)
# </generated-file>

_GROUPS = []
# Each rank's same-session calibration in its `per_rank` entry: JSON name -> _RUNTIME's.
_OBSERVER_FACTS = {
    "host_gap_observer_us": "gap_observer_us",
    "host_gap_wait_us": "gap_wait_us",
    "host_gap_observer_ratio": "gap_observer_ratio",
    "host_gap_doubt_us": "gap_doubt_us",
}
_RUNTIME["comm"] = False
_RUNTIME["rank"] = None


def _wait_work(work):
    """Wait for an async collective, as the original program did at this point."""
    if work is not None:
        started = time.perf_counter()
        work.wait()
        _waited_for_peers(started)


def _group_name(index):
    """The replay's name of recorded group `index` (functional collectives name it)."""
    if not _GROUPS:  # not launched: the collective fails inside _guarded, and stands in
        return "mystique: no process group (run under torchrun)"
    return _GROUPS[index].group_name


def _wait_tensor(tensor):
    """Wait for the functional collective that produces `tensor` (a coalesced one: each
    tensor of its list), where the original waited inside the op that first read it."""
    if _RUNTIME["comm"]:
        started = time.perf_counter()
        with _harness():
            for t in tensor if isinstance(tensor, (list, tuple)) else [tensor]:
                torch.ops._c10d_functional.wait_tensor(t)
        _waited_for_peers(started)


def _coalesced(collective, outputs, inputs, group, async_op, **options):
    """One coalesced collective: `collective` on each (output, input) pair (on each
    output alone where `inputs` is None: in place) inside a coalescing manager, which
    torch issues as one call of the backend's coalesced op. Returns what to wait on
    where the trace waited (None when synchronous)."""
    dist = torch.distributed
    calls = (
        [(output,) for output in outputs]
        if inputs is None
        else zip(outputs, inputs, strict=True)
    )
    with dist._coalescing_manager(group=group, async_ops=async_op) as manager:
        for args in calls:
            collective(*args, group=group, **options)
    return manager if async_op else None


# torch 2.13 renamed all_gather_into_tensor and reduce_scatter_tensor (all_gather_single,
# reduce_scatter_single) and deprecated all_reduce_coalesced: the old calls warn (a
# FutureWarning on every rank of every replay). The harness issues each op by the
# current name where torch has it, else by the old one (older torch).


def _all_gather_single(output, input_, **options):
    """c10d::_allgather_base_: every member's `input_` gathered into `output`."""
    dist = torch.distributed
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return all_gather(output, input_, **options)


def _reduce_scatter_single(output, input_, **options):
    """c10d::_reduce_scatter_base_: `input_` reduced over the members, each member's
    part into its `output`."""
    dist = torch.distributed
    reduce_scatter = (
        getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    )
    return reduce_scatter(output, input_, **options)


def _all_gather_into_tensor_coalesced(outputs, inputs, *, group, async_op=False):
    """c10d::allgather_into_tensor_coalesced_: every input gathered into its output."""
    return _coalesced(_all_gather_single, outputs, inputs, group, async_op)


def _reduce_scatter_tensor_coalesced(
    outputs, inputs, *, op=None, group, async_op=False
):
    """c10d::reduce_scatter_tensor_coalesced_: every input reduced and scattered."""
    options = {} if op is None else {"op": op}
    return _coalesced(
        _reduce_scatter_single, outputs, inputs, group, async_op, **options
    )


def _all_reduce_coalesced(tensors, *, op=None, group, async_op=False):
    """c10d::allreduce_coalesced_: every tensor reduced in place, in one call of the
    backend's coalesced op (a coalescing manager of all_reduce calls issues it)."""
    options = {} if op is None else {"op": op}
    all_reduce = torch.distributed.all_reduce
    return _coalesced(all_reduce, tensors, None, group, async_op, **options)


def _bytewise(collective):
    """A collective that only moves data, for tensors of a dtype gloo cannot send
    (float8, int16, uint16, uint32: a trace recorded on NCCL, replayed on CPU): on gloo
    each tensor goes as its bytes, in a last dimension of itemsize bytes, so that sizes
    and splits along its other dimensions stay as recorded; elsewhere, as it is."""

    def call(*args, **kwargs):
        if torch.distributed.get_backend(kwargs.get("group")) != "gloo":
            return collective(*args, **kwargs)
        return collective(*[_as_bytes(a) for a in args], **kwargs)

    return call


def _as_bytes(value):
    if isinstance(value, torch.Tensor):
        return value.unsqueeze(-1).view(torch.uint8)
    if isinstance(value, (list, tuple)):
        return [_as_bytes(v) for v in value]
    return value


def _widened(collective):
    """A reduction of tensors of a dtype gloo cannot reduce (float8, int16, uint16,
    uint32: a trace recorded on NCCL, replayed on CPU): on gloo each tensor is reduced
    as a wider copy (float32, complex64, int64) that is copied back, so the call
    finishes before it returns (there is nothing to wait on); elsewhere, as it is."""

    def call(*args, **kwargs):
        if torch.distributed.get_backend(kwargs.get("group")) != "gloo":
            return collective(*args, **kwargs)
        copies = []
        work = collective(*[_wide(a, copies) for a in args], **kwargs)
        if work is not None:
            work.wait()
        for narrow, wide in copies:
            narrow.copy_(wide)
        return None

    return call


def _wide(value, copies):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            wide = value.float()
        else:
            wide = value.to(torch.complex64 if value.is_complex() else torch.int64)
        copies.append((value, wide))
        return wide
    if isinstance(value, (list, tuple)):
        return [_wide(v, copies) for v in value]
    return value


class _OnWire:
    """A functional collective (torch.ops._c10d_functional) of tensors of a dtype gloo
    cannot send (float8, int16, uint16, uint32: a trace recorded on NCCL, replayed on
    CPU). On CPU tensors (gloo's), one that only moves data ("bytes") moves each
    tensor's bytes, as `_bytewise` does, and returns its results viewed as the dtype
    again (waiting on a view waits on its collective); a reduction ("reduce") reduces
    wider copies, waits for them and returns them narrowed again (an in-place one, its
    inputs, the copies copied back). Elsewhere the op runs as it is. Named as the op, so
    that `_guarded` treats it as one."""

    def __init__(self, op, how):
        self.op, self.how = op, how

    def __str__(self):
        return str(self.op)

    def __call__(self, *args, **kwargs):
        first = next(iter(_flat_tensors([*args, *kwargs.values()])), None)
        if first is None or first.device.type != "cpu":
            return self.op(*args, **kwargs)
        dtype = first.dtype
        if self.how == "bytes":
            with _harness():
                args = [_as_bytes(a) for a in args]
                kwargs = {k: _as_bytes(v) for k, v in kwargs.items()}
            result = self.op(*args, **kwargs)
            with _harness():
                return _from_bytes(result, dtype)
        copies = []
        with _harness():
            args = [_wide(a, copies) for a in args]
            kwargs = {k: _wide(v, copies) for k, v in kwargs.items()}
        result = self.op(*args, **kwargs)
        with _harness():
            return _narrowed(result, dtype, copies)


def _on_wire(op, how):
    """What the file calls around a functional collective's handle (see `_OnWire`)."""
    return _OnWire(op, how)


def _flat_tensors(values):
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _flat_tensors(value)


def _from_bytes(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.view(dtype).squeeze(-1)
    if isinstance(value, (list, tuple)):
        return [_from_bytes(v, dtype) for v in value]
    return value


def _narrowed(value, dtype, copies):
    """A reduction's wide results, waited for and narrowed to `dtype`; a result that
    is one of the wide copies (an in-place op's) is copied back into its input."""
    if isinstance(value, (list, tuple)):
        return [_narrowed(v, dtype, copies) for v in value]
    if not isinstance(value, torch.Tensor):
        return value
    value = torch.ops._c10d_functional.wait_tensor(value)
    for narrow, wide in copies:
        if value.data_ptr() == wide.data_ptr() and value.shape == wide.shape:
            return narrow.copy_(value)
    return value.to(dtype)


def _monitored_barrier(*, wait_all_ranks=False, group):
    """c10d::monitored_barrier_: gloo implements it; other backends (nccl) hold the
    same ranks with a plain barrier."""
    if torch.distributed.get_backend(group) == "gloo":
        torch.distributed.monitored_barrier(group, wait_all_ranks=wait_all_ranks)
    else:
        torch.distributed.barrier(group=group)


def make_inputs(device, host, gens):
    return RANKS[_RUNTIME["rank"]][0](device, host, gens)


def replay(inputs, device, host):
    return RANKS[_RUNTIME["rank"]][1](inputs, device, host)


def _launched():
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _rank_path(path, rank):
    """PATH stem + .rank{N} + suffix: one replay trace per rank, next to PATH."""
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.json'}"


class _Ranks(_Local):
    def __init__(self):
        self.rank = None
        self.backend = None
        self.comm = False
        self.per_rank = []
        self.peaks = []
        self.per_rank_gaps = []
        self.et_paths = None
        self.profile_paths = None
        self.gather_device = None

    def add_arguments(self, parser):
        parser.add_argument(
            "--backend",
            help="torch.distributed backend (default: nccl on cuda, else gloo)",
        )

    def device(self, args):
        """Under torchrun, "cuda" means this process's local GPU."""
        device = _usable_device(args.device)
        if device.type == "cuda" and device.index is None and _launched():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return super().device(args)

    def start(self, args, device):
        """Join the process group and create the recorded groups."""
        self.backend = args.backend or ("nccl" if device.type == "cuda" else "gloo")
        self.gather_device = device if self.backend == "nccl" else torch.device("cpu")
        if _launched():
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            if world != WORLD_SIZE:
                sys.exit(
                    f"mystique: recorded on {WORLD_SIZE} ranks, launched on {world}"
                )
            if rank not in RANKS:
                sys.exit(f"mystique: this file holds ranks {sorted(RANKS)}, not {rank}")
            torch.distributed.init_process_group(
                self.backend, rank=rank, world_size=world
            )
        elif WORLD_SIZE == 1:
            rank = 0
            store = torch.distributed.HashStore()
            torch.distributed.init_process_group(
                self.backend, store=store, rank=0, world_size=1
            )
        else:
            rank = min(RANKS)
            print(
                f"mystique: recorded on {WORLD_SIZE} ranks but not launched by torchrun: "
                f"replaying rank {rank}'s compute only, without communication",
                file=sys.stderr,
            )
            self.rank = _RUNTIME["rank"] = rank
            return
        # Every rank creates every group, in the recorded order, as new_group requires.
        for spec in PROCESS_GROUPS:
            if (
                spec["name"] == "0"
                or spec["desc"] == "default_pg"
                or not spec["create"]
            ):
                _GROUPS.append(torch.distributed.group.WORLD)
            else:
                _GROUPS.append(torch.distributed.new_group(ranks=spec["ranks"]))
        self.rank = _RUNTIME["rank"] = rank
        self.comm = _RUNTIME["comm"] = True

    def before_iteration(self):
        if self.comm:
            torch.distributed.barrier()  # every rank starts the iteration together

    def original(self):
        """This rank's linked Kineto facts."""
        return RANKS[self.rank][3] if self.rank in RANKS else None

    def _ran(self):
        """The ranks this job replays, in rank order (as all_gather lists them)."""
        return list(range(WORLD_SIZE)) if self.comm else [self.rank]

    def original_ms(self):
        """The job's original step time, as iterations are timed: its slowest rank's.
        A step of 0 is none known (a Kineto trace that linked no op), as for one
        process (`_Local.original_ms`): it was reported as the job's step, 0.0 ms."""
        steps = [
            RANKS[r][3]["step_ms"]
            for r in self._ran()
            if r in RANKS and RANKS[r][3] is not None
        ]
        return max(steps) or None if steps else None

    def iteration_times(self, times):
        """Every rank's times (and host-gap calibration), gathered on each rank; an
        iteration of the job ends when its slowest rank does."""
        gaps = [
            _RUNTIME["gap_own_us"],
            _RUNTIME["gap_event_us"],
            1.0 if _RUNTIME["host_gaps"] else 0.0,
            _RUNTIME["gap_call_us"],
            _RUNTIME["gap_annotation_us"],
            # Same-session gaps' calibration, -1 on the wire where there is none
            # (each is 0 or more).
            *(
                -1.0 if _RUNTIME[key] is None else _RUNTIME[key]
                for key in _OBSERVER_FACTS.values()
            ),
        ]
        self.per_rank, self.per_rank_gaps = [times], [gaps]
        if self.comm:
            self.per_rank = self._gather(times)
            self.per_rank_gaps = self._gather(gaps)
        return [max(column) for column in zip(*self.per_rank, strict=True)]

    def peak_bytes(self, nbytes):
        """Every rank's peak memory, gathered on each rank; the job reports the
        largest (-1 on the wire: a device whose peak is not measured)."""
        self.peaks = [nbytes]
        if self.comm:
            value = -1 if nbytes is None else nbytes
            mine = torch.tensor([value], dtype=torch.int64, device=self.gather_device)
            every = [torch.empty_like(mine) for _ in range(WORLD_SIZE)]
            torch.distributed.all_gather(every, mine)
            self.peaks = [None if int(t) < 0 else int(t) for t in every]
        known = [p for p in self.peaks if p is not None]
        return max(known) if known else None

    def any_rank(self, flag):
        """Whether `flag` holds on any rank: a decision every rank must take alike
        (how many passes each replays)."""
        if not self.comm:
            return bool(flag)
        mine = torch.tensor(
            [1 if flag else 0], dtype=torch.int64, device=self.gather_device
        )
        torch.distributed.all_reduce(mine, op=torch.distributed.ReduceOp.MAX)
        return bool(int(mine))

    def most_on_any_rank(self, count):
        """The largest of each rank's `count`: a number every rank must take alike
        (how many iterations each calibration pass replays)."""
        if not self.comm:
            return int(count)
        mine = torch.tensor([int(count)], dtype=torch.int64, device=self.gather_device)
        torch.distributed.all_reduce(mine, op=torch.distributed.ReduceOp.MAX)
        return int(mine)

    def _gather(self, values):
        mine = torch.tensor(values, dtype=torch.float64, device=self.gather_device)
        every = [torch.empty_like(mine) for _ in range(WORLD_SIZE)]
        torch.distributed.all_gather(every, mine)
        return [t.tolist() for t in every]

    def _rank_facts(self, rank, times, gaps):
        """One rank's entry of `per_rank`: its times, host gaps and original step."""
        facts = _summary(times)
        facts["host_gaps_replayed"] = bool(gaps[2])
        facts["host_gap_own_us"], facts["host_gap_event_us"] = gaps[0], gaps[1]
        facts["host_gap_call_us"], facts["host_gap_annotation_us"] = gaps[3], gaps[4]
        for name, value in zip(_OBSERVER_FACTS, gaps[5:], strict=True):
            facts[name] = None if value < 0 else value
        original = RANKS[rank][3] if rank in RANKS else None
        if original is not None:
            facts["original_ms"] = original["step_ms"] or None
        return facts

    def world(self):
        return WORLD_SIZE if self.comm else 1

    def facts(self):
        peaks = self.peaks or [None] * len(self.per_rank)
        facts = {
            "ops": RANKS[self.rank][2] if self.rank in RANKS else OPS,
            "distributed": self.comm,
            "backend": self.backend if self.comm else None,
            "world_size": self.world(),
            "recorded_world_size": WORLD_SIZE,
            "rank": self.rank,
            "per_rank": [
                dict(self._rank_facts(rank, times, gaps), peak_bytes=peak)
                for rank, times, gaps, peak in zip(
                    self._ran(), self.per_rank, self.per_rank_gaps, peaks, strict=True
                )
            ],
        }
        if self.et_paths is not None:
            facts["et_per_rank"] = self.et_paths
        if self.profile_paths is not None:
            facts["profile_per_rank"] = self.profile_paths
        if not self.comm and WORLD_SIZE > 1:
            facts["note"] = (
                f"rank {self.rank} compute only: run under torchrun for collectives"
            )
        return facts

    def et_path(self, path):
        self.et_paths = [_rank_path(path, r) for r in range(self.world())]
        return _rank_path(path, self.rank)

    def profile_path(self, path):
        """One Kineto trace per rank, side by side (DIR/kineto_trace.rankN.json), as
        HolisticTraceAnalysis reads a job: one folder, a file per rank."""
        self.profile_paths = [_rank_path(path, r) for r in range(self.world())]
        return _rank_path(path, self.rank)

    def finish(self):
        if self.comm:
            torch.distributed.barrier()
            # Drop our group handles first: a gloo group freed at interpreter exit aborts.
            _GROUPS.clear()
            torch.distributed.destroy_process_group()

    def reports(self):
        return self.rank == 0 or not self.comm  # rank 0 reports for the job

    def leave(self, code):
        """End a rank that communicated without Python's interpreter teardown. A
        profile taken while a process group lives keeps the group alive after
        destroy_process_group (torch 2.13: its gloo threads stay up), so a worker
        thread can still be freeing a finished collective's tensors when the
        interpreter finalises; it cannot take the GIL then, and the process aborts
        ("terminate called without an active exception": 3 runs in 16 of a 2-rank
        replay with host gaps on a loaded machine). Output is flushed first."""
        if not self.comm:
            return code
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def where(self, device):
        return f"on {self.world()} rank(s)"
