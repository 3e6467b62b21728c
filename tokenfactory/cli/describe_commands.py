"""``tokenfactory describe``: a model's, an accelerator's or a worker's figures, the registered
kinds, the schema.
"""

from __future__ import annotations

import json
import sys

from tokenfactory.core.validation import ConfigError
from tokenfactory.cli.console import print_table

__all__ = ["cmd_describe"]


def cmd_describe(args) -> int:
    from tokenfactory.studies.report import to_jsonable

    if args.what == "schema":
        from tokenfactory.reference import render_schema

        sys.stdout.write(render_schema(args.name, "json" if args.json else args.format))
        return 0
    if args.what == "kinds":
        from tokenfactory.registry import ADMISSION_KINDS, AUTOSCALER_KINDS

        rows = [{"layer": k.layer, "kind": k.name, "baseline": k.baseline, "parameters": list(k.keys),
                 "summary": k.summary} for k in (*ADMISSION_KINDS.values(), *AUTOSCALER_KINDS.values())]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            width = max(len(r["kind"]) for r in rows)
            for r in rows:
                tag = "baseline" if r["baseline"] else "tokenfactory"
                print(f"{r['layer']:<15} {r['kind']:<{width}}  [{tag}] {r['summary']}")
        return 0
    if args.name is None:
        raise ConfigError("name", f"describe {args.what} needs a preset name or a TOML file")
    if args.what == "model":
        from tokenfactory.plant_models import load_model

        d = load_model(args.name).summary()
    elif args.what == "hardware":
        from tokenfactory.plant_models import load_accelerator

        d = load_accelerator(args.name).to_dict()
    else:
        from tokenfactory.plant_models import RequestShape, ServiceModel, Worker

        w = Worker.from_dict({
            "model": args.name, "hardware": args.hardware,
            "parallelism": {"tp": args.tp, "pp": args.pp, "ep": args.ep}})
        service = ServiceModel(w, w, RequestShape(args.prompt_tokens, args.output_tokens))
        rates = service.summary(args.context_tokens)
        d = {"model": w.model.name, "hardware": w.accelerator.name, "num_gpus": w.num_gpus,
             "weight_bytes_per_gpu": w.weight_bytes_per_gpu, "kv_bytes_per_gpu": w.kv_bytes_per_gpu,
             "kv_capacity_bytes": w.kv_capacity_bytes, **rates,
             "decode_tokens_per_s_per_gpu": rates["decode_tokens_per_s"] / w.num_gpus,
             "fill_tokens_per_s_per_gpu": rates["fill_tokens_per_s"] / w.num_gpus}
    if args.json:
        print(json.dumps(to_jsonable(d), indent=2))
    else:
        print_table(d)
    return 0
