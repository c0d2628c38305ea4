#!/bin/bash
# In the form of NVIDIA/Megatron-LM examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh
# (commit d98e8a64ddf34856e74b24714e3bedb2f5a39553): DeepSeek-V3 with multi-latent attention
# and expert parallel under Megatron-FSDP, the command in a multi-line string that an sbatch
# here-document runs with `bash -c`. Import it with --hf examples/hf/deepseek-v3/config.json
# (the tokenizer gives the vocabulary) and --nodes 16.
export NCCL_IB_SL=1
MEGATRON_PATH=${MEGATRON_PATH:-"/opt/megatron-lm"}
OUTPUT_PATH=${OUTPUT_PATH:-"/tmp/out"}
USE_MEGATRON_FSDP=${USE_MEGATRON_FSDP:-1}
SHARDING_STRATEGY=${SHARDING_STRATEGY:-"optim_grads_params"}
PROFILE=${PROFILE:-0}
TP=${TP:-1}
EP=${EP:-8}
MBS=${MBS:-4}
GBS=${GBS:-2048}

PRETRAIN_ARGS=(
    --tensor-model-parallel-size ${TP}
    --expert-model-parallel-size ${EP}
    --expert-tensor-parallel-size 1
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --sequence-parallel
    --use-flash-attn
    --disable-bias-linear
    --micro-batch-size ${MBS}
    --global-batch-size ${GBS}
    --recompute-granularity selective
    --seq-length 4096
    --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model deepseek-ai/DeepSeek-V3
    --num-layers 61
    --hidden-size 7168
    --ffn-hidden-size 18432
    --num-attention-heads 128
    --kv-channels 128
    --max-position-embeddings 4096
    --position-embedding-type rope
    --rotary-base 10000
    --normalization RMSNorm
    --swiglu
    --untie-embeddings-and-output-weights
    --multi-latent-attention
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --num-experts 256
    --moe-layer-freq [0]*3+[1]*58
    --moe-ffn-hidden-size 2048
    --moe-shared-expert-intermediate-size 2048
    --moe-router-topk 8
    --moe-token-dispatcher-type flex
    --q-lora-rank 1536
    --kv-lora-rank 512
    --qk-head-dim 128
    --qk-pos-emb-head-dim 64
    --v-head-dim 128
    --bf16
)
if [ "${USE_MEGATRON_FSDP}" = 1 ]; then
    unset CUDA_DEVICE_MAX_CONNECTIONS
    PRETRAIN_ARGS=(
        "${PRETRAIN_ARGS[@]}"
        --use-megatron-fsdp
        --data-parallel-sharding-strategy ${SHARDING_STRATEGY}
        --no-gradient-accumulation-fusion
        --ckpt-format fsdp_dtensor
    )
fi
if [ "${PROFILE}" = 1 ]; then
    PROFILE_CMD="nsys profile --trace=cuda,nvtx \
        -o ${OUTPUT_PATH}/nsys/deepseek-v3"
else
    PROFILE_CMD=""
fi

TRAINING_CMD="
cd ${MEGATRON_PATH};
git rev-parse HEAD;
export PYTHONPATH=${MEGATRON_PATH}:${PYTHONPATH};
${PROFILE_CMD} python ${MEGATRON_PATH}/pretrain_gpt.py ${PRETRAIN_ARGS[@]}"

set +e
sbatch <<EOF
#!/bin/bash
#SBATCH --job-name=deepseek-v3
#SBATCH --nodes=16
#SBATCH --exclusive

srun \
    --mpi=pmix -l \
    --container-workdir=${MEGATRON_PATH} \
    bash -x -c "${TRAINING_CMD}" 2>&1 | tee ${OUTPUT_PATH}/\${SLURM_JOB_ID}.log

EOF
set -e
