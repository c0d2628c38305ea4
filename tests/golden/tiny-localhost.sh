#!/bin/bash
# Megatron-LM launch for plan 'tiny-localhost', written by trainplan.
# Options as spelt in NVIDIA/Megatron-LM megatron/training/arguments.py (commit d98e8a64, 2026; every option parsed by its own parser's definitions, simcore/plan/megatron_args.yaml).
# Add the data, tokenizer and learning-rate options of your run (--data-path,
# --tokenizer-type, --lr, --train-iters, ...). On several nodes run this on each node
# with --node-rank and --master-addr, or use `trainplan export PLAN --to slurm`.
# The Plan has no field for the norm, linear biases, the MLP's activation, QK norm or
# attention sinks; written as GPT's (Megatron's defaults): LayerNorm, linear biases, GeLU MLP, no QK norm, no sinks.
# A model that differs needs its own options (Qwen3: --qk-layernorm; Qwen2: --add-qkv-bias;
# GPT-OSS: biases, --quick-geglu --glu-linear-offset 1.0 --activation-func-clamp-value 7.0
# --softmax-type learnable); Gemma's tanh-GeLU GLU has none (--quick-geglu is x*sigmoid(1.702x)).
torchrun --nnodes 1 --nproc-per-node 4 pretrain_gpt.py \
    --num-layers 4 \
    --hidden-size 64 \
    --ffn-hidden-size 256 \
    --num-attention-heads 4 \
    --seq-length 32 \
    --max-position-embeddings 32 \
    --padded-vocab-size 256 \
    --position-embedding-type learned_absolute \
    --untie-embeddings-and-output-weights \
    --tensor-model-parallel-size 1 \
    --pipeline-model-parallel-size 2 \
    --overlap-grad-reduce \
    --micro-batch-size 1 \
    --global-batch-size 8 \
    --attention-backend unfused \
    --optimizer adam
