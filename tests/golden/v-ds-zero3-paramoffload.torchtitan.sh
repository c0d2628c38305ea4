REFUSED: parallel.zero_impl=deepspeed has no torchtitan option: it runs ZeRO as FSDP2 (zero_impl: fsdp2)
