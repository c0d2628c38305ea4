# trainplan export (maxtext): v-zero3-paramoffload on 8 x h100-sxm; keys as base.yml defines them at AI-Hypercomputer/maxtext @e591f30cbbf2
# add run_name, base_output_directory and the dataset (dataset_type, ...) of your run
# training.recompute=selective (the attention core alone) has no MaxText policy: written as its nearest, remat_policy=minimal, which keeps the projections' outputs only and re-runs the norms and the attention (recompute: dots prices what it runs; the import reads it so)
python3 -m maxtext.trainers.pre_train.train src/maxtext/configs/base.yml \
    decoder_block=llama2 \
    base_emb_dim=4096 \
    base_num_query_heads=32 \
    base_num_kv_heads=8 \
    head_dim=128 \
    base_mlp_dim=14336 \
    base_num_decoder_layers=32 \
    vocab_size=128256 \
    mlp_activations=[silu,linear] \
    logits_via_embedding=false \
    max_target_length=8192 \
    rope_max_timescale=500000 \
    enable_dropout=false \
    dropout_rate=0 \
    ici_tensor_parallelism=1 \
    ici_fsdp_parallelism=8 \
    ici_data_parallelism=1 \
    dcn_data_parallelism=1 \
    shard_optimizer_over_data=false \
    per_device_batch_size=1 \
    gradient_accumulation_steps=8 \
    dtype=bfloat16 \
    weight_dtype=float32 \
    opt_type=adamw \
    remat_policy=minimal \
    attention=cudnn_flash_te \
    hardware=gpu \
    optimizer_memory_host_offload=true \
    parameter_memory_host_offload=true
