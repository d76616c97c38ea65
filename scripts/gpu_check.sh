#!/usr/bin/env bash
# GPU check of issue 4 (streams from Kineto), for a machine with CUDA:
#   1. capture ET + Kineto of a model that runs work on two streams;
#   2. generate with --kineto and show what was linked (inspect --kineto --json);
#   3. run the benchmark on cuda, with a profile of the replay;
#   4. print original vs benchmark step time and kernels per stream, recorded vs replayed.
# Usage: scripts/gpu_check.sh [WORKDIR]   (default: a fresh temporary folder)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
WORK=${1:-$(mktemp -d)}
mkdir -p "$WORK"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: FAILED: CUDA is not available here (torch.cuda.is_available() is False)" >&2
    echo "gpu_check: run this script on a machine with an NVIDIA GPU and a CUDA build of torch" >&2
    exit 3
fi

echo "== capture (two streams) into $WORK"
"$PY" - "$WORK" <<'EOF'
import sys

import torch

from mystique_gen.tools.capture import capture

work = sys.argv[1]
torch.manual_seed(0)
dev = torch.device("cuda")
side = torch.cuda.Stream()
a, b = torch.randn(2048, 2048, device=dev), torch.randn(2048, 2048, device=dev)
c, d = torch.randn(2048, 2048, device=dev), torch.randn(2048, 2048, device=dev)


def step():
    side.wait_stream(torch.cuda.current_stream())
    x = a @ b
    with torch.cuda.stream(side):
        y = c @ d  # independent work overlapping on the side stream
        y = torch.relu(y)
    x = torch.relu(x @ b)
    torch.cuda.current_stream().wait_stream(side)
    return x + y  # joins the two streams' results


r = capture(step, work, name="two_streams", warmup=3, timing_iters=10)
print(f"eager step: median {r.step_ms_median:.3f} ms")
EOF

ET=$WORK/two_streams.et.json
KINETO=$WORK/two_streams.kineto.json
echo "== inspect --kineto"
"$PY" -m mystique_gen.cli inspect "$ET" --kineto "$KINETO" --json > "$WORK/inspect.json"
"$PY" - "$WORK/inspect.json" <<'EOF'
import json
import sys

s = json.load(open(sys.argv[1]))
print(f"selected {s['selected_ops']}, linked {s['linked_ops']} {s['link_methods']}, "
      f"stream waits {s['stream_waits']}")
for st in s["streams"]:
    print(f"recorded stream {st['stream']}: {st['ops']} ops, {st['kernels']} kernels"
          f"{' (main)' if st['main'] else ''}")
if len(s["streams"]) < 2:
    sys.exit("gpu_check: FAILED: the capture shows fewer than two streams")
EOF

echo "== generate --kineto and run on cuda"
"$PY" -m mystique_gen.cli "$ET" --kineto "$KINETO" -o "$WORK/bench.py"
grep -c "with _on(" "$WORK/bench.py" | sed 's/^/stream blocks in the replay: /'
"$PY" "$WORK/bench.py" --device cuda --warmup 5 --iters 20 --json \
    --profile "$WORK/replay_profile" | tail -1 > "$WORK/result.json"
"$PY" - "$WORK/result.json" "$WORK/replay_profile/kineto_trace.json" "$KINETO" <<'EOF'
import json
import sys
from collections import Counter

result = json.load(open(sys.argv[1]))
print(f"original {result['original_ms']:.3f} ms, benchmark median "
      f"{result['iter_ms_median']:.3f} ms, ratio {result['original_ratio']:.2f}")


def per_stream(path, iters):
    events = json.load(open(path))["traceEvents"]
    kernels = Counter(e["args"]["stream"] for e in events
                      if e.get("cat") == "kernel" and "stream" in e.get("args", {}))
    return {s: n / iters for s, n in sorted(kernels.items())}


print(f"kernels per stream, recorded step: {per_stream(sys.argv[3], 1)}")
replayed = per_stream(sys.argv[2], result["iters"])
print(f"kernels per stream, per replayed iteration: {replayed}")
if len(replayed) < 2:
    sys.exit("gpu_check: FAILED: the replay ran its kernels on fewer than two streams")
print("gpu_check: OK")
EOF
