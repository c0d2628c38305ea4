REFUSED: parallel.dp_replicate=4 has no MaxText option: shard_optimizer_over_data shards the optimizer states over the whole data axis
