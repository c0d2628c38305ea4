REFUSED: training.precision=fp16 has no MaxText option: bf16 or fp32 are written
