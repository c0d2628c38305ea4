REFUSED: parallel.sequence_parallel=false has no torchtitan option: its tensor parallel plan always shards the sequence
