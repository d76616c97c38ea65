"""Imported as every Python process starts whose PYTHONPATH ``mystique-gen capture`` set
(the processes a captured command or script starts: a launcher's workers, a script that
re-runs itself as ranks): once the process has imported torch, captures it as one rank
of the job (``mystique_gen.tools.capture._capture_this_process``). Then runs the
environment's own ``sitecustomize``, if any, which this module shadows.

The capture waits for torch: started with the interpreter, it imported torch and
mystique_gen into every Python process of the job, 1-2 s each, data-preparation and
tool processes that never train among them. A process can only step an optimizer
after torch's import, and the hooks go in as that import ends, before the script's
next statement, so nothing the script does with torch is missed."""

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys


def _start() -> None:
    settings = os.environ.get("MYSTIQUE_GEN_CAPTURE")
    if not settings:
        return
    capture = sys.modules.get("mystique_gen.tools.capture")
    if capture is not None and not hasattr(capture, "_capture_this_process"):
        # torch imported by mystique_gen's own capture module, mid-import: a rank that
        # torch.multiprocessing spawned, unpickling the function the capture gave it,
        # which captures the rank itself.
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
        print(f"mystique-gen: warning: process {os.getpid()} is not captured: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        if root and root in sys.path:
            sys.path.remove(root)


class _ThenStart(importlib.abc.Loader):
    """torch's own loader, which starts the capture once torch's module has run."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> object:
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> object:
        return self.loader.create_module(spec)

    def exec_module(self, module: object) -> None:
        self.loader.exec_module(module)
        # torch's module keeps its own loader, as if it had been imported plainly.
        module.__loader__ = module.__spec__.loader = self.loader
        _start()


class _AtTorchImport(importlib.abc.MetaPathFinder):
    """Finds torch as the finders after it would, with a loader that starts the
    capture after torch's import; then leaves ``sys.meta_path``."""

    def find_spec(self, name: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _ThenStart(spec.loader)
                return spec
        return None


def _watch() -> None:
    if not os.environ.get("MYSTIQUE_GEN_CAPTURE"):
        return
    if "torch" in sys.modules:  # (imported by a .pth file, say)
        _start()
    else:
        sys.meta_path.insert(0, _AtTorchImport())


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_watch()
_chain()
