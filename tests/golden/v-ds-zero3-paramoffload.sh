REFUSED: parallel.zero_impl=deepspeed has no Megatron-LM option: export it with --to deepspeed
