#!/bin/bash
# Megatron-LM launch for plan 'v-zero2-offload-fp8', written by trainplan.
# Options as spelt in NVIDIA/Megatron-LM megatron/training/arguments.py (commit d98e8a64, 2026; every option parsed by its own parser's definitions, simcore/plan/megatron_args.yaml).
# Add the data, tokenizer and learning-rate options of your run (--data-path,
# --tokenizer-type, --lr, --train-iters, ...). On several nodes run this on each node
# with --node-rank and --master-addr, or use `trainplan export PLAN --to slurm`.
# The block: rmsnorm, linear biases none, swiglu MLP, QK norm none, no attention sinks (the Plan's model fields);
# the Plan has no field for the residual layout: written pre-norm and sequential (not GPT-NeoX's parallel
# attention and MLP, nor Gemma's norms after attention and MLP).
torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py \
    --num-layers 32 \
    --hidden-size 4096 \
    --ffn-hidden-size 14336 \
    --num-attention-heads 32 \
    --group-query-attention \
    --num-query-groups 8 \
    --seq-length 8192 \
    --max-position-embeddings 8192 \
    --padded-vocab-size 128256 \
    --position-embedding-type rope \
    --rotary-base 500000 \
    --normalization RMSNorm \
    --disable-bias-linear \
    --hidden-dropout 0.0 \
    --attention-dropout 0.0 \
    --swiglu \
    --untie-embeddings-and-output-weights \
    --tensor-model-parallel-size 1 \
    --pipeline-model-parallel-size 1 \
    --use-megatron-fsdp \
    --data-parallel-sharding-strategy optim_grads \
    --no-gradient-accumulation-fusion \
    --use-distributed-optimizer \
    --ckpt-format fsdp_dtensor \
    --micro-batch-size 1 \
    --global-batch-size 64 \
    --bf16 \
    --fp8-format hybrid \
    --fp8-recipe delayed \
    --recompute-granularity selective \
    --optimizer-cpu-offload \
    --use-precision-aware-optimizer \
    --attention-backend flash \
    --optimizer adam
