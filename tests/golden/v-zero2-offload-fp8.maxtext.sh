REFUSED: parallel.zero=2 has no MaxText option: its fsdp axis shards parameters too (ZeRO-3) and shard_optimizer_over_data the optimizer states only (ZeRO-1)
