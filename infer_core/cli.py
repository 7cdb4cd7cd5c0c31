"""The ``infer`` command: serve, generate, chat, plugins, config, bench.

Every engine setting is also a flag (``--max-num-seqs 64``), and so is every setting the loaded
plugins declare (in a help group of their own); flags beat INFER_* variables.
"""

from __future__ import annotations

import argparse
import logging
import sys
import types
import typing
from typing import Any

from infer_core.cli_parser import SuggestingParser
from infer_core.errors import InferError, PluginError
from infer_core.plugin_settings import SettingsSection
from infer_core.settings import EngineSettings

SERVE_DESCRIPTION = """\
Serve the model over an OpenAI-compatible HTTP API: POST /v1/chat/completions, /v1/completions,
/tokenize, /detokenize; GET /v1/models, /health, /metrics, /v1/plugins; the schema at /openapi.json.

The server listens at once and loads the model in the engine-core process, a process of its own
that runs the step loop and owns the device; this process parses, tokenizes, detokenizes and
streams, so no request holds a step. /health answers 503 while the model loads and 200 after one
line:  ready: model NAME (served as 'NAME') on DEVICE at http://HOST:PORT
If the engine core dies, every stream ends with an error event, every later request is a 503 and
/health says "dead": restart the server. SIGTERM or Ctrl-C stops new requests, lets running ones
finish (--shutdown-timeout) and exits 0. More: docs/serving.md."""

SERVER_ONLY = {"host", "port", "served_model_name", "max_queued_requests", "api_key", "max_request_bytes",
                "shutdown_timeout"}


def _flag_type(annotation: Any):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union else annotation
    if typing.get_origin(base) is typing.Annotated:
        base = typing.get_args(base)[0]
    if typing.get_origin(base) is typing.Literal:
        return str, list(typing.get_args(base))
    if typing.get_origin(base) is list:
        return str, None
    return (base if base in (int, float, str, bool) else str), None


def add_settings_arguments(parser: argparse.ArgumentParser, include_server: bool = False,
                           sections: tuple[SettingsSection, ...] = ()) -> None:
    """One ``--flag`` per setting (the core's, then each plugin section's); unset flags do not override the
    environment. A plugin's flags get one short line of help each (``infer config`` shows their values)."""
    group = parser.add_argument_group("engine settings (also INFER_<NAME> variables)")
    names = [name for name in EngineSettings.model_fields if include_server or name not in SERVER_ONLY]
    for name in names:
        _add_flag(group, name, EngineSettings.model_fields[name], EngineSettings.model_fields[name].description)
    for section in sections:
        group = parser.add_argument_group(f"{section.title} (plugin {section.plugin}; also INFER_<NAME> variables)")
        for name, field in section.settings_class.model_fields.items():
            try:
                _add_flag(group, name, field, _one_line(field.title or field.description))
            except argparse.ArgumentError as e:
                raise PluginError(f"setting {name!r} of {section.describe()} cannot be a flag of "
                                  f"`{parser.prog}`: {e}; rename the setting") from None
            names.append(name)
    parser.set_defaults(setting_names=frozenset(names))


def _add_flag(group, name: str, field: Any, help_text: str | None) -> None:
    flag = "--" + name.replace("_", "-")
    kind, choices = _flag_type(field.annotation)
    if kind is bool:
        group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                           help=help_text or "")
    else:
        group.add_argument(flag, dest=name, type=kind, choices=choices, default=argparse.SUPPRESS,
                           metavar=name.upper(), help=help_text or "")


def _one_line(description: str | None) -> str:
    """A description's first clause (up to its first ';')."""
    return (description or "").split(";", 1)[0].strip()


def settings_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    names = getattr(args, "setting_names", frozenset())
    return {k: v for k, v in vars(args).items() if k in names}


def _sampling_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling")
    group.add_argument("--max-tokens", type=int, default=256)
    group.add_argument("--temperature", type=float, default=0.0)
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--top-k", type=int, default=0)
    group.add_argument("--sampling-seed", type=int, default=None, help="seed of this request's sampling")


def _sampling_params(args):
    from infer_core.sampling_params import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                          top_k=args.top_k, seed=args.sampling_seed)


def cmd_serve(args) -> int:
    from infer_core.server.serve import serve
    from infer_core.settings import load_settings

    return serve(load_settings(**settings_kwargs(args)))


def cmd_bench_serve(args) -> int:
    from infer_core.bench.serve import run

    return run(args)


def cmd_bench_throughput(args) -> int:
    from infer_core.bench.throughput import run

    return run(args)


def cmd_bench_latency(args) -> int:
    from infer_core.bench.latency import run

    return run(args)


def cmd_generate(args) -> int:
    from infer_core.llm import LLM

    params = _sampling_params(args)  # bad values fail before the model loads
    llm = LLM(**settings_kwargs(args))
    for prompt in args.prompt:
        if args.chat:
            output = llm.chat([{"role": "user", "content": prompt}], params, use_tqdm=False)[0]
        else:
            output = llm.generate(prompt, params, use_tqdm=False)[0]
        print(output.outputs[0].text)
    llm.shutdown()
    return 0


def cmd_chat(args) -> int:
    """An interactive conversation on the terminal; an empty line or EOF ends it."""
    from infer_core.llm import LLM

    params = _sampling_params(args)
    llm = LLM(**settings_kwargs(args))
    messages: list[dict[str, str]] = []
    while True:
        try:
            line = input("> ").strip()
        except EOFError:
            break
        if not line:
            break
        messages.append({"role": "user", "content": line})
        answer = llm.chat(messages, params, use_tqdm=False)[0].outputs[0].text
        messages.append({"role": "assistant", "content": answer})
        print(answer)
    llm.shutdown()
    return 0


def cmd_plugins(args) -> int:
    from infer_core.plugins_report import plugins_report

    print(plugins_report(settings_kwargs(args)))
    return 0


def cmd_config(args) -> int:
    from infer_core.config_report import config_report

    print(config_report(settings_kwargs(args)))
    return 0


def plugin_sections(argv: list[str]) -> tuple[SettingsSection, ...]:
    """The settings sections of the plugins the command line's ``--plugins`` (else INFER_PLUGINS) allows."""
    from infer_core.plugin_settings import declare_settings
    from infer_core.settings import allowed_plugins

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--plugins")
    given = pre.parse_known_args(argv)[0].plugins
    return declare_settings(allowed_plugins(given), EngineSettings.model_fields)


def build_parser(sections: tuple[SettingsSection, ...] = ()) -> argparse.ArgumentParser:
    parser = SuggestingParser(prog="infer", description="A plugin-based LLM inference engine.")
    parser.add_argument("--log-level", default="INFO", help="logging level (DEBUG, INFO, WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API",
                       description=SERVE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_settings_arguments(p, include_server=True, sections=sections)
    p.set_defaults(handler=cmd_serve)

    p = sub.add_parser("generate", help="complete prompts with the model and print the text")
    p.add_argument("prompt", nargs="+")
    p.add_argument("--chat", action="store_true", help="send each prompt as a user message through the chat template")
    _sampling_arguments(p)
    add_settings_arguments(p, sections=sections)
    p.set_defaults(handler=cmd_generate)

    p = sub.add_parser("chat", help="talk to the model on the terminal")
    _sampling_arguments(p)
    add_settings_arguments(p, sections=sections)
    p.set_defaults(handler=cmd_chat)

    p = sub.add_parser("plugins", help="list every implementation of every kind and whether it can run here")
    add_settings_arguments(p, sections=sections)
    p.set_defaults(handler=cmd_plugins)

    p = sub.add_parser("config", help="print the effective settings and where each came from")
    add_settings_arguments(p, include_server=True, sections=sections)
    p.set_defaults(handler=cmd_config)

    p = sub.add_parser("bench", help="benchmarks")
    bench = p.add_subparsers(dest="bench", required=True)
    from infer_core.bench.serve_flags import DESCRIPTION as BENCH_SERVE_DESCRIPTION
    from infer_core.bench.serve_flags import add_arguments as add_bench_serve_arguments

    b = bench.add_parser("serve", help="load-test any OpenAI-compatible endpoint (TTFT, TPOT, ITL, throughput)",
                         description=BENCH_SERVE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_serve_arguments(b)
    b.set_defaults(handler=cmd_bench_serve)
    b = bench.add_parser("throughput", help="offline throughput (the nano-vllm workload): infer, peers and the floor")
    from infer_core.bench.throughput import add_arguments as add_bench_throughput_arguments

    add_bench_throughput_arguments(b)
    b.set_defaults(handler=cmd_bench_throughput)
    b = bench.add_parser("latency", help="batch-1 decode latency: infer, peers and the floor")
    from infer_core.bench.latency import add_arguments as add_bench_latency_arguments

    add_bench_latency_arguments(b)
    b.set_defaults(handler=cmd_bench_latency)

    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(plugin_sections(argv))
    except InferError as e:  # INFER_PLUGINS names a missing plugin, a plugin fails to load, two declare a name
        print(f"error: {e}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except (InferError, ValueError) as e:  # a user's mistake: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
