"""The range of seeds that give distinct random numbers on a CPU, shared by training (without
importing torch) and measurement."""

import operator
from typing import Any

#: a seed that becomes a CPU generator runs from 0 to this, exclusive: torch's CPU generator (a
#: Mersenne Twister) keeps only a seed's low 32 bits, so its seed 2**32 + s draws exactly the
#: numbers of seed s (CUDA's Philox generator uses all 64 bits)
CPU_SEED_END = 1 << 32


def check_cpu_seed(seed: Any, what: str, draws: str, *, numpy: bool = False) -> int:
    """``seed`` as an ``int`` in [0, :data:`CPU_SEED_END`), else a ``ValueError`` naming
    ``what`` (the option) and the ``draws`` it seeds: torch's CPU generator takes a negative
    seed as 2**64 + seed and keeps only a seed's low 32 bits, so such a seed draws another
    seed's numbers; a bool or a float failed inside ``manual_seed``, naming neither.
    ``numpy``: a NumPy integer is taken as the int it is (else refused: a config keeps it)."""
    value = None
    if not isinstance(seed, bool):
        if isinstance(seed, int):
            value = seed
        elif numpy:
            try:
                value = operator.index(seed)
            except TypeError:
                pass
    if value is None or not 0 <= value < CPU_SEED_END:
        raise ValueError(
            f"{what} must be an int in [0, 2**32), got {seed!r} ({type(seed).__name__}): "
            "torch's CPU generator takes a negative seed as 2**64 + seed and keeps only a "
            f"seed's low 32 bits, so such a seed draws another seed's {draws}. Pass an int from "
            f"0 to {CPU_SEED_END - 1}, e.g. seed=0" + ("" if numpy else
                                                       " (int(seed) for a NumPy integer)"))
    return value


def noise_seed(seed: int) -> int:
    """The seed of the measurement noise in a run of seed ``seed`` (its tracked sensitivity and
    sharpness, an experiment's final measurements, ``senslab measure --seed``): a stream of its
    own, never the model's. The models draw their initial weights from ``seed``, the first
    parameter first, so noise drawn from ``seed`` itself was that parameter: the text models'
    first standard-normal noise rows were their initial embedding table row for row (8,000 rows
    of 256), a vision model's first ones those of its patch projection (cosine −0.34), and
    sharpness's first weight perturbation the first parameter's initial values — directions a
    trained model reads (a memorised modular-addition model flipped on 10.0% of such copies and
    on 4.6% of copies with fresh noise). An odd multiplier and an odd offset keep it off
    ``seed`` for every seed, modulo the 2**32 a CPU generator keeps."""
    return (seed * 1_000_003 + 0x5E45) % CPU_SEED_END
