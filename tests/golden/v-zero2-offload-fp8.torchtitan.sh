REFUSED: training.offload=optimizer has no torchtitan option: enable_cpu_offload moves parameters, gradients and optimizer states (optimizer+params)
