"""The operator dependency graph (networkx), derived from the tensor plan.

An edge u -> v means v must run after u: v reads a storage u wrote (read after
write), v writes a storage u read or wrote (write after read / write), which is what
stream and thread schedules must preserve. Requires the tensor pass to have run.
"""

from __future__ import annotations

import networkx as nx

from mystique_gen.ir import Op, Storage, iter_tensors
from mystique_gen.passes.tensors import output_paths


def _touched(op: Op) -> tuple[set[int], set[int]]:
    """(storages read, storages written) by one op, by storage index."""
    reads: set[int] = set()
    writes: set[int] = set()
    for arg in op.args:
        for tv in iter_tensors(arg.value):
            if tv.storage is None:
                continue
            (writes if arg.spec.writes else reads).add(tv.storage.index)
    for _path, tv in output_paths(op.outputs):
        if isinstance(tv.storage, Storage):
            writes.add(tv.storage.index)
    return reads, writes


def dependency_graph(ops: list[Op]) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(op.index for op in ops)
    last_writer: dict[int, int] = {}
    readers_since_write: dict[int, list[int]] = {}
    for op in ops:
        reads, writes = _touched(op)
        for s in reads | writes:
            if s in last_writer and last_writer[s] != op.index:
                graph.add_edge(last_writer[s], op.index, kind="raw" if s in reads else "waw")
        for s in writes:
            for reader in readers_since_write.get(s, ()):
                if reader != op.index:
                    graph.add_edge(reader, op.index, kind="war")
            last_writer[s] = op.index
            readers_since_write[s] = []
        for s in reads - writes:
            readers_since_write.setdefault(s, []).append(op.index)
    return graph


def critical_path_length(graph: nx.DiGraph) -> int:
    """Ops on the longest dependency chain (1 for independent ops, 0 for none)."""
    if graph.number_of_nodes() == 0:
        return 0
    return len(nx.dag_longest_path(graph))
