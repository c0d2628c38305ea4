REFUSED: model.gated_mlp=false has no torchtitan option: its llama3 model is dense, SwiGLU, RoPE, untied
