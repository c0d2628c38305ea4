#!/bin/bash
# Megatron-LM launch for plan 'gpt3-175b-a100', written by trainplan.
# Options as spelt in NVIDIA/Megatron-LM megatron/training/arguments.py (commit d98e8a64, 2026; every option parsed by its own parser's definitions, simcore/plan/megatron_args.yaml).
# Add the data, tokenizer and learning-rate options of your run (--data-path,
# --tokenizer-type, --lr, --train-iters, ...). On several nodes run this on each node
# with --node-rank and --master-addr, or use `trainplan export PLAN --to slurm`.
# The block: layernorm, linear biases all, gelu MLP, QK norm none, no attention sinks (the Plan's model fields);
# the Plan has no field for the residual layout: written pre-norm and sequential (not GPT-NeoX's parallel
# attention and MLP, nor Gemma's norms after attention and MLP).
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nnodes 192 --nproc-per-node 8 pretrain_gpt.py \
    --num-layers 96 \
    --hidden-size 12288 \
    --ffn-hidden-size 49152 \
    --num-attention-heads 96 \
    --seq-length 2048 \
    --max-position-embeddings 2048 \
    --padded-vocab-size 51200 \
    --position-embedding-type learned_absolute \
    --tensor-model-parallel-size 8 \
    --pipeline-model-parallel-size 12 \
    --overlap-grad-reduce \
    --micro-batch-size 1 \
    --global-batch-size 1536 \
    --bf16 \
    --recompute-granularity full \
    --recompute-method uniform \
    --recompute-num-layers 1 \
    --attention-backend unfused \
    --optimizer adam
