"""The range of seeds that give distinct random numbers on a CPU, shared by training (without
importing torch) and measurement."""

#: a seed that becomes a CPU generator runs from 0 to this, exclusive: torch's CPU generator (a
#: Mersenne Twister) keeps only a seed's low 32 bits, so its seed 2**32 + s draws exactly the
#: numbers of seed s (CUDA's Philox generator uses all 64 bits)
CPU_SEED_END = 1 << 32
