REFUSED: parallel.schedule=zero-bubble has no Megatron-LM option: it runs 1F1B or interleaved 1F1B
