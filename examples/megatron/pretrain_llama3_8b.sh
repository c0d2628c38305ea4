#!/bin/bash
# Llama 3 8B with Megatron-LM on two DGX H100 nodes: TP 2, PP 2, DP 4, distributed optimizer.
torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py \
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 \
    --num-attention-heads 32 --group-query-attention --num-query-groups 8 \
    --seq-length 8192 --max-position-embeddings 8192 \
    --position-embedding-type rope --rotary-base 500000 --swiglu \
    --untie-embeddings-and-output-weights --normalization RMSNorm --disable-bias-linear \
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B --vocab-size 128256 \
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --micro-batch-size 1 --global-batch-size 256 \
    --bf16 --recompute-granularity selective --attention-backend flash \
    --optimizer adam --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2000 \
    --train-iters 100000 --data-path /data/llama3/text_document --split 99,1,0
