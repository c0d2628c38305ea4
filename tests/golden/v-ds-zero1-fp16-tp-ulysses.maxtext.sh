REFUSED: parallel.cp=2 has no MaxText option: MaxText has it; trainplan does not write its options yet (ici_context_parallelism and its strategy)
