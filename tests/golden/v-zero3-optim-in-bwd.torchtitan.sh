REFUSED: training.optimizer_in_backward=true has no torchtitan option: in 0.3 (0.2.2 had optimizer.early_step_in_backward)
