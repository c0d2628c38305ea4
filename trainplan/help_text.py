"""What each command answers and one example of it: the ``--help`` of ``trainplan`` and of
every subcommand, so that a new user can start without the README (issue 57.10)."""
from __future__ import annotations

import argparse
import textwrap

#: Columns of the help's prose (argparse's own default wraps near 80).
WIDTH = 88

#: command -> (the question it answers, one command line that answers it, from the repository root)
COMMANDS = {
    "catalog": ("Which GPUs, nodes, fabrics, storage tiers, prices and models does trainplan know, and where "
                "does each figure come from?", "trainplan catalog --kind gpus"),
    "check": ("Is this Plan valid? Prints it resolved (catalog names filled in, derived figures), or one sentence "
              "naming the field and the rule it breaks.", "trainplan check plans/llama3-70b-h100.yaml"),
    "topology": ("What does the Plan's cluster look like: GPUs, NVSwitch, NICs, leaf/spine, bisection?",
                 "trainplan topology plans/llama3-70b-h100.yaml --draw topo.png"),
    "simulate": ("How long does one training step of this Plan take, where does the time go (compute, exposed "
                 "communication, bubble), what MFU, how much memory per GPU, and within what interval?",
                 "trainplan simulate plans/gpt3-175b-a100.yaml"),
    "schedule": ("In what order does each pipeline rank run its forwards, backwards, sends and receives?",
                 "trainplan schedule plans/llama3-70b-h100.yaml"),
    "compare": ("How does a real run's log (Megatron-LM/NeMo, torchtitan, DeepSpeed, HF Trainer, MLPerf) compare "
                "with the Plan's predicted step time, throughput, MFU and peak memory, and is its layout the Plan's? "
                "With --trace DIR (PyTorch profiler traces), which phase differs most, rank by rank?",
                "trainplan compare plans/llama3-8b-fsdp-h100.yaml --log tests/runlogs/fixtures/torchtitan_pr1287.log"),
    "collectives": ("Which collectives does each rank issue per step, how often and how many bytes (as trainplan's "
                    "executor issues them)?", "trainplan collectives plans/llama3-8b-fsdp-h100.yaml"),
    "memory": ("How many bytes does each GPU hold, term by term, and does the Plan fit?",
               "trainplan memory plans/llama3-70b-h100.yaml"),
    "serve": ("How fast does this serving plan answer its traffic: time to first token, time per output token and "
              "end-to-end latency percentiles, throughput, KV-cache occupancy (continuous batching, paged KV cache)? "
              "With --run (a localhost plan), what does this host's serving loop measure beside it?",
              "trainplan serve plans/serving/llama3-8b-h100-tp1.yaml"),
    "serve-plan": ("Which GPU kind, how many (TP degree x replicas) and which precision serve this traffic rate within "
                   "the TTFT and TPOT targets most cheaply, at what $ per million output tokens (rent on-demand, "
                   "reserved, buy) and energy, and how does each option's latency grow with the load?",
                   "trainplan serve-plan plans/serving/llama3-70b-slo.yaml --rate 20"),
    "import": ("What Plan is the team's Hugging Face config, Megatron command, ds_config or torchtitan job?",
               "trainplan import --hf examples/hf/llama3.1-8b/config.json --cluster dgx-h100 --nodes 8 > plan.yaml"),
    "export": ("What command line or config file runs this Plan on Megatron-LM, DeepSpeed, torchtitan or Slurm?",
               "trainplan export plans/llama3-70b-h100.yaml --to megatron"),
    "plan": ("Which parallel layout trains this model fastest (or cheapest) on this cluster, does it fit, and "
             "what do the runners-up lose? Writes the best Plan.",
             "trainplan plan --model llama3-70b --cluster dgx-h100 --nodes 32 --global-batch 1024 --seq-len 8192 "
             "--tokens 15e12"),
    "cost": ("How many days and dollars does a whole run of this Plan take, on-demand, reserved and spot, with "
             "checkpoints and failures?", "trainplan cost plans/llama3-70b-h100.yaml --tokens 2e12"),
    "whatif": ("With other GPUs, more nodes, another fabric or other prices, what is the best layout and what do "
               "days and dollars become, cell by cell?", "trainplan whatif sweeps/example.yaml --report out/whatif"),
    "procure": ("What should we buy or rent to train this model by a deadline for the least money, or fastest "
                "within a budget?", "trainplan procure sweeps/procure-llama3-70b.yaml --report out/procure"),
    "report": ("The planning, what-if or validation answer as a self-contained HTML + Markdown report.",
               "trainplan report plan --model llama3-70b --cluster dgx-h100 --nodes 32 --seq-len 8192 "
               "--tokens 15e12 --out out/plan"),
    "demo": ("The main job on an embedded default (Llama 3 70B on 32 DGX H100): plan, price, what-if and a real "
             "validation here; prints the answer and writes three reports.", "trainplan demo --out out/demo"),
    "run": ("How fast does this Plan really run here, measured phase by phase with torch.distributed?",
            "trainplan run plans/tiny-localhost.yaml --steps 20 --warmup 5"),
    "validate": ("How far is the prediction from a real run of the same Plan, field by field and phase by phase?",
                 "trainplan validate --matrix validation/local.yaml --only dp2"),
    "calibrate": ("How fast is this host (or GPU)? Microbenchmarks it into the profile the simulator reads for "
                  "cluster.node: localhost.", "trainplan calibrate"),
}

OVERVIEW = """\
Start here:
  trainplan check plans/llama3-70b-h100.yaml        is this Plan valid? (a Plan: model, cluster, layout, training)
  trainplan simulate plans/llama3-70b-h100.yaml     one step: time, MFU, memory, interval
  trainplan plan --model llama3-70b --cluster dgx-h100 --nodes 32 --global-batch 1024 --tokens 15e12
                                                    the best layout for a model on a cluster, priced
  trainplan procure sweeps/procure-llama3-70b.yaml  what to buy or rent by a deadline or within a budget
  trainplan demo                                    all of it on an embedded default, with reports

`trainplan COMMAND --help` says what the command answers and shows an example. Bad input is
one sentence naming the field and the rule, exit code 2."""


def describe(parser: argparse.ArgumentParser, sub) -> None:
    """The overview on ``trainplan --help``; each subcommand's question and example on its own."""
    parser.epilog = OVERVIEW
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for name, p in sub.choices.items():
        answers, example = COMMANDS[name]
        p.description = "\n\n".join(textwrap.fill(text, WIDTH) for text in (answers, p.description) if text)
        p.epilog = f"example:\n  {example}"
        p.formatter_class = argparse.RawDescriptionHelpFormatter
