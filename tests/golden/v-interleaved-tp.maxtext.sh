REFUSED: parallel.pp=2 has no MaxText option: MaxText has it; trainplan does not write its options yet (ici_pipeline_parallelism, num_layers_per_pipeline_stage)
