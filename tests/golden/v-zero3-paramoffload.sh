REFUSED: training.offload=optimizer+params has no Megatron-LM option: it offloads optimizer states only
