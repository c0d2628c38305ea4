#!/bin/bash
# In the form of NVIDIA/Megatron-LM examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh
# (commit d98e8a64ddf34856e74b24714e3bedb2f5a39553): a `uv run` prefix in a variable, an
# empty profiler array in the default branch, Megatron-FSDP with --overlap-param-gather.
# The published recipe also gives --fp8-param-gather, which the Plan holds only with the
# distributed optimizer (parallel.zero=1): with it the import is refused in one sentence.
GPUS_PER_NODE=8
NUM_NODES=1
PRETRAIN_SCRIPT_PATH="pretrain_gpt.py"
NSYS_PROFILE=${NSYS_PROFILE:-0}
USE_UV=${USE_UV:-1}
if [ "${USE_UV}" = 1 ]; then
    VENV_PREFIX="uv run"
else
    VENV_PREFIX=""
fi
USE_MEGATRON_FSDP=${USE_MEGATRON_FSDP:-1}
SHARDING_STRATEGY=${SHARDING_STRATEGY:-"optim_grads_params"}
SEQ_LENGTH=8192

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
)
MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336
    --num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128
    --seq-length $SEQ_LENGTH --max-position-embeddings $SEQ_LENGTH
    --position-embedding-type rope --rotary-base 1000000
    --attention-dropout 0.0 --hidden-dropout 0.0
    --swiglu --normalization RMSNorm --attention-backend fused
    --untie-embeddings-and-output-weights --disable-bias-linear
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128
    --bf16
)
if [ "${USE_MEGATRON_FSDP}" = 1 ]; then
    unset CUDA_DEVICE_MAX_CONNECTIONS
    TRAINING_ARGS=(
        "${TRAINING_ARGS[@]}"
        --use-megatron-fsdp
        --data-parallel-sharding-strategy ${SHARDING_STRATEGY}
        --no-gradient-accumulation-fusion
        # a comment inside the array: it isn't an option
        --ckpt-format fsdp_dtensor
    )
fi
DTYPE_ARGS=()
DTYPE_ARGS+=(
    "--fp8-format hybrid"
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --sequence-parallel
)
DDP_ARGS=(
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)
TRAINING_ARGS+=("${DDP_ARGS[@]}")
DATA_ARGS_LIST=(--mock-data --tokenizer-type NullTokenizer --vocab-size 128256 "--split '99,1,0'")
if [ "${NSYS_PROFILE}" = 1 ]; then
    PROFILE_CMD=(nsys profile --trace=cuda,nvtx -o profile)
else
    PROFILE_CMD=()
fi
EXTRA_ARGS=()

$VENV_PREFIX "${PROFILE_CMD[@]}" python -m torch.distributed.run ${DISTRIBUTED_ARGS[@]} \
    "$PRETRAIN_SCRIPT_PATH" \
    ${MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${DTYPE_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS_LIST[@]} \
    ${EXTRA_ARGS[@]}
