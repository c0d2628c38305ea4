#!/bin/bash
# Megatron-LM launch for plan 'v-qwen2-moe', written by trainplan.
# Options as spelt in NVIDIA/Megatron-LM megatron/training/arguments.py (commit d98e8a64, 2026; every option parsed by its own parser's definitions, simcore/plan/megatron_args.yaml).
# Add the data, tokenizer and learning-rate options of your run (--data-path,
# --tokenizer-type, --lr, --train-iters, ...). On several nodes run this on each node
# with --node-rank and --master-addr, or use `trainplan export PLAN --to slurm`.
# The block: rmsnorm, linear biases qkv, swiglu MLP, QK norm none, no attention sinks (the Plan's model fields);
# the Plan has no field for the residual layout: written pre-norm and sequential (not GPT-NeoX's parallel
# attention and MLP, nor Gemma's norms after attention and MLP).
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py \
    --num-layers 28 \
    --hidden-size 3584 \
    --ffn-hidden-size 18944 \
    --num-attention-heads 28 \
    --group-query-attention \
    --num-query-groups 4 \
    --seq-length 4096 \
    --max-position-embeddings 4096 \
    --padded-vocab-size 151936 \
    --position-embedding-type rope \
    --rotary-base 1000000 \
    --normalization RMSNorm \
    --disable-bias-linear \
    --add-qkv-bias \
    --hidden-dropout 0.0 \
    --attention-dropout 0.0 \
    --swiglu \
    --untie-embeddings-and-output-weights \
    --moe-ffn-hidden-size 2560 \
    --num-experts 64 \
    --moe-router-topk 8 \
    --moe-shared-expert-intermediate-size 20480 \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 2 \
    --expert-model-parallel-size 8 \
    --moe-token-dispatcher-type alltoall \
    --sequence-parallel \
    --overlap-grad-reduce \
    --use-distributed-optimizer \
    --micro-batch-size 1 \
    --global-batch-size 128 \
    --bf16 \
    --recompute-granularity selective \
    --attention-backend flash \
    --optimizer adam
