#!/bin/bash
# Import fixture in the form of Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh
# (NVIDIA/Megatron-LM commit 157006d6d9bf4f55c0d4d7dacbd2b65e7bd84dc9), written from its
# published options: GPT-3 175B, TP 8 x PP 16, fp16, bash arrays expanded into the command.
# It launches one node (NUM_NODES=1, "change for multinode config"): import it with --nodes 16.

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
MASTER_ADDR=localhost
MASTER_PORT=6000
NUM_NODES=1
NODE_RANK=0
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))

CHECKPOINT_PATH=$1
VOCAB_FILE=$3 #<path to>/gpt2-vocab.json
MERGE_FILE=$4 #<path to>/gpt2-merges.txt
DATA_PATH=$5

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

GPT_MODEL_ARGS=(
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --seq-length 2048
    --max-position-embeddings 2048
    --attention-backend auto # flash, fused, unfused, local
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 1536
    --train-iters 500000
    --weight-decay 0.1
    --clip-grad 1.0
    --fp16
    --lr 6.0e-5
    --lr-decay-style cosine
)

MODEL_PARALLEL_ARGS=(
	--tensor-model-parallel-size 8
	--pipeline-model-parallel-size 16
)

DATA_ARGS=(
    --data-path $DATA_PATH
    --vocab-file ${VOCAB_FILE:-gpt2-vocab.json}
    --merge-file ${MERGE_FILE:-gpt2-merges.txt}
    --split 949,50,1
)

torchrun ${DISTRIBUTED_ARGS[@]} examples/classes/pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS[@]}
