REFUSED: training.optimizer_in_backward=True has no MaxText option: its optimizer steps after the backward
