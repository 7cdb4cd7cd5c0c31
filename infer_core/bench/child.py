"""One system of an ``infer bench`` run, in a process of its own: ``python -m infer_core.bench.child SPEC OUT``.

SPEC is a JSON file written by :mod:`infer_core.bench.systems`; OUT receives ``{"row": ..., "device": ...}``.
A fresh process per system means every engine or peer starts on an empty device and gives all
its memory back on exit.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

from infer_core.bench.workload import OfflineWorkload, latency_prompt


def _device(spec: dict[str, Any]) -> str:
    import torch

    if spec["device"] == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return spec["device"]


def _workload(spec: dict[str, Any]) -> OfflineWorkload:
    """The run's workload (its token ids come in the spec), the first ``num_prompts`` requests of it."""
    return OfflineWorkload.from_json(spec["workload"]).head(spec["num_prompts"])


def _trace_path(spec: dict[str, Any], label: str) -> Path | None:
    return Path(spec["trace_dir"]) / f"{spec['benchmark']}-{label}.json" if spec.get("trace_dir") else None


def run_infer(spec: dict[str, Any]) -> dict[str, Any]:
    from infer_core.bench import engine_runs

    llm, row = engine_runs.start_engine(spec["folder"], spec["engine_settings"])
    try:
        if spec["benchmark"] == "offline-throughput":
            workload = _workload(spec)
            row.update(engine_runs.measure_throughput(llm, workload))
            if spec["profile"]:
                row["step_breakdown"] = engine_runs.profile_throughput(
                    llm, workload, spec["profile_skip"], spec["profile_steps"], _trace_path(spec, row["attention"]))
        else:
            row.update(engine_runs.measure_latency(llm, spec["prompt_len"], spec["new_tokens"], spec["repeats"]))
            if spec["profile"]:
                row["step_breakdown"] = engine_runs.profile_latency(
                    llm, spec["prompt_len"], spec["profile_skip"], spec["profile_steps"],
                    _trace_path(spec, row["attention"]))
        row.update(engine_runs.speculative_figures(llm))
    finally:
        llm.shutdown()
    return row


def run_floor(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from infer_core.bench import floor

    config = json.loads((Path(spec["folder"]) / "config.json").read_text())
    ceilings = floor.measure_ceilings(torch.device(_device(spec)), spec["dtype"])
    if spec["benchmark"] == "offline-throughput":
        workload = _workload(spec)
        return floor.throughput_floor_row(ceilings, config, spec["dtype"], [len(p) for p in workload.prompts],
                                          workload.output_lens, spec["max_num_seqs"])
    return floor.latency_floor_row(ceilings, config, spec["dtype"], spec["prompt_len"], spec["new_tokens"])


def run_hf(spec: dict[str, Any]) -> dict[str, Any]:
    from infer_core.bench import hf_peers

    device = _device(spec)
    if spec["system"] == "hf-generate-batch":
        workload = _workload(spec)
        return hf_peers.generate_batch_row(spec["folder"], workload, spec["dtype"], device,
                                           timeout_s=spec["timeout_s"])
    vocab = json.loads((Path(spec["folder"]) / "config.json").read_text())["vocab_size"]
    prompt = latency_prompt(spec["prompt_len"], vocab)
    return hf_peers.generate_static_row(spec["folder"], prompt, spec["new_tokens"], spec["repeats"], spec["dtype"],
                                        device)


def run_offline(spec: dict[str, Any]) -> dict[str, Any]:
    """``infer bench serve --offline-row``: LLM with the engine settings ``infer serve`` takes from the same flags."""
    from infer_core.bench import offline_row
    from infer_core.cli import SERVER_ONLY, build_parser, plugin_sections, settings_kwargs

    flags = spec["serve_flags"]
    args = build_parser(plugin_sections(flags)).parse_args(["serve", *flags])
    settings = {k: v for k, v in settings_kwargs(args).items() if k not in SERVER_ONLY}
    return offline_row.run_offline(spec, settings)


RUNNERS = {"infer": run_infer, "floor": run_floor, "hf-generate-batch": run_hf, "hf-generate-static": run_hf,
           "offline": run_offline}


def main(argv: list[str]) -> int:
    import logging

    from infer_core.bench.record import device_name

    spec_path, out_path = argv
    spec = json.loads(Path(spec_path).read_text())
    logging.basicConfig(level=spec.get("log_level", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        row = RUNNERS[spec["system"]](spec)
    except Exception as e:  # the parent records the error as this system's row and runs the next one
        traceback.print_exc()
        Path(out_path).write_text(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 1
    Path(out_path).write_text(json.dumps({"row": row, "device": device_name()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
