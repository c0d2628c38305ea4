REFUSED: training.optimizer_in_backward=true has no Megatron-LM option
