REFUSED: parallel.zero=1 has no torchtitan option: it has DDP (zero 0) and FSDP2 (zero 2, 3)
