"""Imported as every Python process starts whose PYTHONPATH ``mystique-gen capture`` set
(the processes a captured command or script starts: a launcher's workers, a script that
re-runs itself as ranks): captures that process as one rank of the job
(``mystique_gen.tools.capture._capture_this_process``), then runs the environment's own
``sitecustomize``, if any, which this module shadows."""

import importlib.machinery
import importlib.util
import json
import os
import sys


def _start() -> None:
    settings = os.environ.get("MYSTIQUE_GEN_CAPTURE")
    if not settings:
        return
    # The capture's own mystique_gen, first (not another installed copy), for this
    # import only: its folder holds other names (tests/) the script must not see.
    root = json.loads(settings).get("root")
    if root:
        sys.path.insert(0, root)
    try:
        from mystique_gen.tools.capture import _capture_this_process

        _capture_this_process()
    except Exception as exc:  # noqa: BLE001 (the process runs on, uncaptured)
        if isinstance(exc, ImportError) and importlib.util.find_spec("torch") is None:
            return  # a Python without torch (a helper tool the script runs): nothing to say
        print(f"mystique-gen: warning: process {os.getpid()} is not captured: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        if root and root in sys.path:
            sys.path.remove(root)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_start()
_chain()
