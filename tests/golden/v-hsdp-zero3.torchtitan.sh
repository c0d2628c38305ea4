#!/bin/bash
# torchtitan 0.3.x (tested: 0.3.0) launch for plan 'v-hsdp-zero3', written by trainplan.
# Options as pytorch/torchtitan torchtitan/config (0.3.0: manager.py, configs.py; 0.2.2: job_config.py) parse them (tyro); on several nodes add --node-rank and --rdzv-endpoint.
# Add --dataloader.dataset, --training.steps and --optimizer.lr for your run.
torchrun --nnodes 1 --nproc-per-node 8 -m torchtitan.train \
    --module llama3 \
    --config llama3_8b \
    --training.local-batch-size 1 \
    --training.global-batch-size 64 \
    --training.seq-len 8192 \
    --training.mixed-precision-param bfloat16 \
    --training.no-enable-cpu-offload \
    --parallelism.data-parallel-replicate-degree 2 \
    --parallelism.data-parallel-shard-degree 4 \
    --parallelism.fsdp-reshard-after-forward always \
    --parallelism.tensor-parallel-degree 1 \
    --parallelism.context-parallel-degree 1 \
    --parallelism.expert-parallel-degree 1 \
    --parallelism.pipeline-parallel-degree 1 \
    --compile.enable \
    activation-checkpoint:selective
