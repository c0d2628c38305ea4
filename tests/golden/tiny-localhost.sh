#!/bin/bash
# Megatron-LM launch for plan 'tiny-localhost', written by trainplan.
# Options as spelt in NVIDIA/Megatron-LM megatron/training/arguments.py (commit d98e8a64, 2026; every option parsed by its own parser's definitions, simcore/plan/megatron_args.yaml).
# Add the data, tokenizer and learning-rate options of your run (--data-path,
# --tokenizer-type, --lr, --train-iters, ...). On several nodes run this on each node
# with --node-rank and --master-addr, or use `trainplan export PLAN --to slurm`.
# The block: layernorm, linear biases all, gelu MLP, QK norm none, no attention sinks (the Plan's model fields);
# the Plan has no field for the residual layout: written pre-norm and sequential (not GPT-NeoX's parallel
# attention and MLP, nor Gemma's norms after attention and MLP).
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
