#!/bin/bash
# Megatron-LM launch for plan 'v-mixtral-ep', written by trainplan.
# Options as spelt in NVIDIA/Megatron-LM megatron/training/arguments.py (commit d98e8a64, 2026; every option parsed by its own parser's definitions, simcore/plan/megatron_args.yaml).
# Add the data, tokenizer and learning-rate options of your run (--data-path,
# --tokenizer-type, --lr, --train-iters, ...). On several nodes run this on each node
# with --node-rank and --master-addr, or use `trainplan export PLAN --to slurm`.
# The block: rmsnorm, linear biases none, swiglu MLP, QK norm none, no attention sinks (the Plan's model fields);
# the Plan has no field for the residual layout: written pre-norm and sequential (not GPT-NeoX's parallel
# attention and MLP, nor Gemma's norms after attention and MLP).
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nnodes 8 --nproc-per-node 8 pretrain_gpt.py \
    --num-layers 32 \
    --hidden-size 4096 \
    --ffn-hidden-size 14336 \
    --num-attention-heads 32 \
    --group-query-attention \
    --num-query-groups 8 \
    --seq-length 4096 \
    --max-position-embeddings 4096 \
    --padded-vocab-size 32000 \
    --position-embedding-type rope \
    --rotary-base 1000000 \
    --normalization RMSNorm \
    --disable-bias-linear \
    --hidden-dropout 0.0 \
    --attention-dropout 0.0 \
    --swiglu \
    --untie-embeddings-and-output-weights \
    --num-experts 8 \
    --moe-router-topk 2 \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 4 \
    --expert-model-parallel-size 4 \
    --moe-token-dispatcher-type alltoall \
    --sequence-parallel \
    --overlap-grad-reduce \
    --use-distributed-optimizer \
    --micro-batch-size 1 \
    --global-batch-size 256 \
    --bf16 \
    --recompute-granularity full \
    --recompute-method uniform \
    --recompute-num-layers 1 \
    --attention-backend flash \
    --optimizer adam
