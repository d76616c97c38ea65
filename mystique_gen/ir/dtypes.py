"""Decoding of the dtype, layout and memory-format encodings found in traces.

Traces name tensor dtypes with c10 type-meta names (``Tensor(float)``) and pass
``ScalarType`` / ``Layout`` / ``MemoryFormat`` arguments as integers (their c10 enum
values). Both are stable parts of PyTorch's ABI, so they are tables here.
"""

from __future__ import annotations

# c10::ScalarType enum order (c10/core/ScalarType.h) -> torch attribute name.
SCALAR_TYPE_CODES: dict[int, str] = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    8: "complex32",
    9: "complex64",
    10: "complex128",
    11: "bool",
    12: "qint8",
    13: "quint8",
    14: "qint32",
    15: "bfloat16",
    16: "quint4x2",
    17: "quint2x4",
    23: "float8_e5m2",
    24: "float8_e4m3fn",
    25: "float8_e5m2fnuz",
    26: "float8_e4m3fnuz",
    27: "uint16",
    28: "uint32",
    29: "uint64",
    44: "float8_e8m0fnu",  # (30-43: sub-byte integers, no tensor dtype in torch)
    45: "float4_e2m1fn_x2",
}

# c10 type-meta names as written in ``Tensor(<name>)`` -> torch attribute name.
TYPE_META_NAMES: dict[str, str] = {
    "unsigned char": "uint8",
    "signed char": "int8",
    "short": "int16",
    "short int": "int16",
    "int": "int32",
    "long": "int64",
    "long int": "int64",
    "long long": "int64",
    "c10::Half": "float16",
    "float": "float32",
    "double": "float64",
    "c10::complex<c10::Half>": "complex32",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
    "bool": "bool",
    "c10::BFloat16": "bfloat16",
    "c10::Float8_e5m2": "float8_e5m2",
    "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2fnuz": "float8_e5m2fnuz",
    "c10::Float8_e4m3fnuz": "float8_e4m3fnuz",
    "c10::Float8_e8m0fnu": "float8_e8m0fnu",
    "c10::Float4_e2m1fn_x2": "float4_e2m1fn_x2",
    "unsigned short": "uint16",
    "unsigned int": "uint32",
    "unsigned long": "uint64",
    # GCC's spelling, which torch's Linux builds write (hash_tensor's uint64 result)
    "short unsigned int": "uint16",
    "long unsigned int": "uint64",
    "long long unsigned int": "uint64",
    "c10::qint8": "qint8",
    "c10::quint8": "quint8",
    "c10::qint32": "qint32",
}

ITEM_SIZES: dict[str, int] = {
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "complex32": 4,
    "complex64": 8,
    "complex128": 16,
    "bool": 1,
    "bfloat16": 2,
    "float8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2fnuz": 1,
    "float8_e4m3fnuz": 1,
    "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,  # two 4-bit values a byte
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "qint8": 1,
    "quint8": 1,
    "qint32": 4,
}

FLOATING = {"float16", "float32", "float64", "bfloat16"} | {
    n for n in ITEM_SIZES if n.startswith("float8")
}
COMPLEX = {"complex32", "complex64", "complex128"}
INTEGRAL = {"uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64"}

# Quantized dtypes -> the integer dtype of their representation, and its range, which
# a replay fills (the trace records no scale or zero point).
QUANTIZED: dict[str, tuple[str, int, int]] = {
    "quint8": ("uint8", 0, 256),
    "qint8": ("int8", -128, 128),
    "qint32": ("int32", -(2**16), 2**16),
}

# c10::Layout enum order (c10/core/Layout.h: Mkldnn comes before the compressed sparse
# layouts, which were added after it).
LAYOUT_CODES: dict[int, str] = {
    0: "strided",
    1: "sparse_coo",
    2: "sparse_csr",
    3: "_mkldnn",
    4: "sparse_csc",
    5: "sparse_bsr",
    6: "sparse_bsc",
    7: "jagged",
}

# c10::MemoryFormat enum order.
MEMORY_FORMAT_CODES: dict[int, str] = {
    0: "contiguous_format",
    1: "preserve_format",
    2: "channels_last",
    3: "channels_last_3d",
}


def dtype_from_type_string(type_str: str) -> str | None:
    """``'Tensor(float)'`` -> ``'float32'``; ``None`` for an undefined tensor or unknown name."""
    if not (type_str.startswith("Tensor(") and type_str.endswith(")")):
        return None
    return TYPE_META_NAMES.get(type_str[len("Tensor(") : -1])
