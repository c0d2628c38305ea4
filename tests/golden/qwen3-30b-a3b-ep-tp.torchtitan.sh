#!/bin/bash
# torchtitan 0.3.x (tested: 0.3.0) launch for plan 'qwen3-30b-a3b-ep-tp', written by trainplan.
# Options as pytorch/torchtitan torchtitan/config (0.3.0: manager.py, configs.py; 0.2.2: job_config.py) parse them (tyro); on several nodes add --node-rank and --rdzv-endpoint.
# Add --dataloader.dataset, --training.steps and --optimizer.lr for your run.
# The Plan's training.flash_attention is false, but torchtitan's attention is always a fused kernel (SDPA with cuDNN's and flash's backends first, FlexAttention or varlen: 0.3's torchtitan/models/common/attention.py, 0.2's models/attention.py): this run is faster and lighter than the Plan predicts; set flash_attention: true to predict it.
torchrun --nnodes 2 --nproc-per-node 8 -m torchtitan.train \
    --module qwen3 \
    --config qwen3_30b_a3b \
    --training.local-batch-size 1 \
    --training.global-batch-size 64 \
    --training.seq-len 4096 \
    --training.mixed-precision-param bfloat16 \
    --training.no-enable-cpu-offload \
    --training.disable-cuda-graphs \
    --parallelism.data-parallel-replicate-degree 1 \
    --parallelism.data-parallel-shard-degree 8 \
    --parallelism.fsdp-reshard-after-forward always \
    --parallelism.tensor-parallel-degree 2 \
    --parallelism.context-parallel-degree 1 \
    --parallelism.expert-parallel-degree 8 \
    --parallelism.pipeline-parallel-degree 1 \
    --compile.enable \
    --debug.moe-force-load-balance \
    activation-checkpoint:none
