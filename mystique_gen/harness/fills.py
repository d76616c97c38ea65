"""The fill kinds: how the generated file fills a materialised input buffer.

Each kind names a filler in ``runtime._FILLS`` (``_fill_<kind>``), except ``DATA``,
``VALUES`` and ``NORMS``, which ``runtime._data``, ``runtime._values`` and
``runtime._norms`` write from recorded values (``DATA`` packed, ``VALUES`` as a list
the reader sees, ``NORMS`` rows' norms); tests/test_harness.py checks
that the two lists agree. The IR's ``Init.kind`` is a FillKind, so a kind no filler knows
is an error when the IR is built, never a buffer of zeros at run time.
"""

from enum import Enum


class FillKind(str, Enum):
    RANDINT = "randint"  # integers in [low, high)
    OFFSETS = "offsets"  # sorted integers in [0, high], the first 0 (bag offsets)
    CUTS = "cuts"  # sorted, first 0, last high (jagged offsets)
    SPANS = "spans"  # packed sequences' cumulative lengths: the first 0, the last high,
    # numel - 1 spans as even as can be, none longer than low (cu_seqlens)
    ENDS = "ends"  # group ends: rising, the last high, each group a multiple of low
    # and as even as can be (a grouped matmul's offs: tokens per expert, summed)
    BAGS = "bags"  # bag offsets: sorted, first 0, exactly low bags empty, high indices
    BAG_CUTS = "bag_cuts"  # the same and one offset more, high (include_last_offset)
    SPAN = "span"  # integers in [low, high], both ends present
    MASK = "mask"  # booleans, exactly low of them true
    RUNS = "runs"  # low distinct values in sorted runs (unique_consecutive)
    DISTINCT = "distinct"  # low distinct values, shuffled (unique)
    SUM = "sum"  # parts adding up to low, each >= 1 where low allows (repeats, lengths)
    DESCENDING = "descending"  # parts in [1, high], non-increasing, the first high,
    # adding up to low (a padded batch's sequence lengths)
    SPD = "spd"  # low x low symmetric positive-definite matrices, one after another
    BOOL = "bool"  # booleans, half true
    UNIFORM = "uniform"  # floats uniform in [low, high)
    RISING = "rising"  # floats rising within each run of low elements, in (0, 1.5]
    ONES = "ones"
    ZEROS = "zeros"
    DATA = "data"  # recorded integral values (runtime._data)
    VALUES = "values"  # a literal's recorded values, as a list (runtime._values)
    NORMS = "norms"  # a table of rows of low elements, some rows' norms above high
    # (runtime._norms: embedding_renorm_ scales the rows it records)
