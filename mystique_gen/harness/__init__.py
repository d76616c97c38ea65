"""The generated benchmark's runtime, as real Python: inlined into every generated file.

``runtime`` is the harness of every benchmark, ``dist`` what distributed ones add, and
``fills`` the fill kinds the IR names. Nothing here imports mystique_gen's other
packages: the code runs inside generated files, beside only the standard library and
torch.
"""
