REFUSED: training.kernels=eager has no Megatron-LM option: its layers run fused kernels
