"""Read what training stacks print per iteration (Megatron-LM/NeMo/Megatron-Bridge, torchtitan,
DeepSpeed, Composer/llm-foundry, Hugging Face Trainer, MLPerf ``:::MLLOG``) into one shape, ``RunLog``, and its
steady-state summary (``summarize``). Pure text parsing: no torch, no Plan."""
from simcore.runlogs.base import LogError, RunLog, Sample, summarize
from simcore.runlogs.dispatch import parse_path

__all__ = ["LogError", "RunLog", "Sample", "parse_path", "summarize"]
