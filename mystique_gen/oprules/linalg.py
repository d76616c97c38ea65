"""Linear algebra: matrices a factorisation or an inverse needs to exist, and the
pivots a factorisation's solve reads."""

from __future__ import annotations

from typing import Any

from mystique_gen.harness.fills import FillKind
from mystique_gen.oprules.base import Facts, Fill, OpFamily, OutShapes


class PositiveDefinite(Fill):
    """Square matrices (a batch of them) that are symmetric positive-definite, so that
    a Cholesky factorisation exists and every inverse or solve is well conditioned:
    random ones fail ("the input is not positive-definite") or return inf."""

    def __init__(self, arg: str):
        self.arg = arg

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        shape = args.get(self.arg)
        if not isinstance(shape, tuple) or len(shape) < 2 or shape[-1] != shape[-2] \
                or not shape[-1]:
            return None
        return (FillKind.SPD, shape[-1], 0)


class Pivots(Fill):
    """LAPACK pivots of an LU factorisation of ``lu``: 1-based row swaps, each in
    [1, n]. A factorisation computed once and passed to the step (a cached ``lu_factor``
    solved against in each step) is an input the replay fills; zero or out-of-range
    pivots raise ("Pivots given to lu_solve must all be greater or equal to 1"), and
    any sequence of swaps in range is a valid one."""

    def __init__(self, lu: str):
        self.lu = lu

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        shape = args.get(self.lu)
        if not isinstance(shape, tuple) or len(shape) < 2 or not shape[-2]:
            return None
        # A row swap names a row: [1, m] for an m x n factorisation (lu_unpack of a
        # wide 3 x 5 LU refused pivots up to 5: "must be between 1 and LU.size(-2)").
        return (FillKind.RANDINT, 1, shape[-2] + 1)


class GroupEnds(Fill):
    """``_grouped_mm``'s ``offs``: where each group's rows end along the dimension the
    groups split (a mixture of experts' tokens per expert, cumulated). Made outside the
    step (a Triton kernel that permutes tokens, a cached routing), random values cut the
    groups short or past the end: the replay multiplied 8 of 64 rows. Each group is
    filled 16 rows or a multiple where the total allows (the alignment CUDA's grouped
    kernels want), as even as a balanced router makes them."""

    ALIGNMENT = 16

    def init(self, args: Facts, outputs: OutShapes) -> tuple[FillKind, int, int] | None:
        a, b, offs = args.get("self"), args.get("mat2"), args.get("offs")
        if not all(isinstance(x, tuple) for x in (a, b, offs)) or len(offs) != 1:
            return None
        # 2-D x 3-D: the rows of self; 2-D x 2-D: the inner dimension (a weight's grad
        # per group); 3-D x 2-D: the columns of mat2; 3-D x 3-D takes no offs.
        total = {(2, 3): a[0], (2, 2): a[-1], (3, 2): b[-1]}.get((len(a), len(b)))
        if not isinstance(total, int):
            return None
        groups = offs[0]
        aligned = total % self.ALIGNMENT == 0 and total >= self.ALIGNMENT * groups
        return (FillKind.ENDS, self.ALIGNMENT if aligned else 1, total)


_SELF, _A = {"self": PositiveDefinite("self")}, {"A": PositiveDefinite("A")}
_GROUPS = {"offs": GroupEnds()}

def matmul_grad_operand(a_shape: Any, a_strides: Any, b_shape: Any, b_strides: Any
                        ) -> int | None:
    """For a recorded ``aten::matmul`` of operands of these shapes and strides that
    folded its batched operand into one ``mm``: the position (0 or 1) of the operand
    that required grad, where the strides alone would not let it fold (at::native's
    ``should_fold``: a batched operand whose leading dimensions are not contiguous, or
    a matrix times a batch); else None. Grad mode on or off, a parameter requires grad
    (an inference step under ``no_grad``); replayed without, matmul runs an expanded
    ``bmm`` instead, twice as slow on Mamba's projections of transposed states and a
    language model's head on the last position in ``generate``."""
    if not all(isinstance(x, list) for x in (a_shape, a_strides, b_shape, b_strides)):
        return None
    first_larger = len(a_shape) >= len(b_shape)
    shape, strides = list(a_shape if first_larger else b_shape), \
        list(a_strides if first_larger else b_strides)
    small = b_shape if first_larger else a_shape
    if not first_larger:  # tensor2.mT
        if len(shape) < 2:
            return None
        shape[-2:], strides[-2:] = shape[:-3:-1], strides[:-3:-1]
    if len(shape) < 3 or len(small) > 2 or len(strides) != len(shape) \
            or not all(isinstance(n, int) for n in shape + strides):
        return None
    foldable = len(a_shape) != 2 and (0 in shape or all(
        strides[i] == strides[i + 1] * shape[i + 1] for i in range(len(shape) - 2)))
    return None if foldable else (1 if first_larger else 0)


FAMILY = OpFamily(
    name="linear algebra",
    # Products of non-negative matrices are non-negative: log(mel_filters @ power) needs
    # the filter bank filled non-negative, as the original's was.
    keeps_sign={
        "aten::mm": ("self", "mat2"),
        "aten::bmm": ("self", "mat2"),
        "aten::matmul": ("self", "other"),
        "aten::mv": ("self", "vec"),
        "aten::dot": ("self", "tensor"),
        "aten::addmm": ("self", "mat1", "mat2"),
        "aten::baddbmm": ("self", "batch1", "batch2"),
        "aten::linear": ("input", "weight", "bias"),
        "aten::einsum": ("operands",),
    },
    # The positive-definite fill a factorisation wants on a matrix the step computes,
    # carried back to the inputs it is computed from: ``cholesky(K * s + n * I)`` of a
    # Gram buffer K and ``cholesky(H @ P @ H.T + R)`` of covariance buffers failed ("not
    # positive-definite") with K, P and R filled at random.
    positive_definite={
        **{op: "sum" for op in ("aten::add", "aten::add_")},
        **{op: "scale" for op in ("aten::mul", "aten::mul_", "aten::div", "aten::div_")},
        **{op: "congruence" for op in ("aten::matmul", "aten::mm")},
    },
    shape_rules={
        "aten::linalg_cholesky": _SELF,
        "aten::linalg_cholesky_ex": _SELF,
        "aten::cholesky": _SELF,
        "aten::inverse": _SELF,
        "aten::linalg_inv": _A,
        "aten::linalg_inv_ex": _A,
        "aten::linalg_solve": _A,
        "aten::linalg_solve_ex": _A,
        "aten::_linalg_solve_ex": _A,
        "aten::linalg_lu_factor_ex": _A,
        "aten::linalg_lu_solve": {"pivots": Pivots("LU")},
        "aten::lu_solve": {"LU_pivots": Pivots("LU_data")},
        "aten::lu_unpack": {"LU_pivots": Pivots("LU_data")},
        "aten::linalg_ldl_solve": {"pivots": Pivots("LD")},
        # A covariance's spectrum and determinant: whitening takes rsqrt of eigh's
        # eigenvalues and a Gaussian's density logdet, NaN on a matrix of both signs.
        "aten::linalg_eigh": _SELF,
        "aten::_linalg_eigh": _A,
        "aten::linalg_eigvalsh": _SELF,
        "aten::logdet": _SELF,
        "aten::det": _SELF,
        "aten::linalg_det": _A,
        "aten::_linalg_det": _A,
        "aten::_grouped_mm": _GROUPS,
        "aten::_scaled_grouped_mm": _GROUPS,
        "aten::_scaled_grouped_mm_v2": _GROUPS,
    },
)
