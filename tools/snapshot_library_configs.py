"""Write ``src/attnid/library_configs.json``: what attnid needs of ``transformers``' config classes, as data, so that
reading a ``config.json`` (:mod:`attnid.library_configs`) needs neither transformers nor torch. For each model type
attnid reads: the class's name, each declared field's default and the JSON kinds its annotation accepts, its
``attribute_map``, its default RoPE base, whether it requires the heads to divide the width, the layer types the
library allows, and the ``to_dict()`` of its default instance (the values the family's
audits were verified at). Run it when the supported transformers version changes; ``tests/test_library_configs.py``
checks that the file equals what the installed transformers gives.

    .venv/bin/python tools/snapshot_library_configs.py            # rewrite the file
    .venv/bin/python tools/snapshot_library_configs.py --check    # exit 1 if it differs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "attnid" / "library_configs.json"
sys.path.insert(0, str(ROOT / "src"))

SIMPLE = {"int": "int", "float": "float", "bool": "bool", "str": "str", "None": "null", "NoneType": "null"}


def kinds(annotation) -> list[str]:
    """The JSON kinds (int, float, bool, str, null, list, dict; ``any``) a field's annotation accepts, as
    huggingface_hub's strict dataclasses check them (an exact type: an int is not a float, a bool not an int)."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    if text.startswith("typing."):
        text = text[len("typing.") :]
    out: set[str] = set()
    depth, start = 0, 0
    parts = []
    for i, ch in enumerate(text):  # split on the top-level "|"
        depth += ch == "["
        depth -= ch == "]"
        if ch == "|" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    for part in (p.strip() for p in parts):
        head = re.match(r"[\w.]+", part)
        name = head.group(0) if head else part
        if name in SIMPLE:
            out.add(SIMPLE[name])
        elif name in ("list", "tuple", "List", "Tuple", "Sequence"):
            out.add("list")
        elif name in ("dict", "Dict", "RopeParameters", "Mapping") or name.endswith("Parameters"):
            out.add("dict")
        elif name in ("Literal",):
            for v in re.findall(r"'[^']*'|\"[^\"]*\"|-?\d+\.\d*|-?\d+|True|False|None", part):
                out.add("str" if v[0] in "'\"" else "null" if v == "None" else "bool" if v in ("True", "False")
                        else "float" if "." in v else "int")  # fmt: skip
        elif name == "torch.dtype":
            continue  # a dtype object: never in a JSON file
        else:
            return ["any"]  # a type not understood here: not checked
    return sorted(out)


def jsonable(v):
    """A default as JSON holds it (tuples as lists; a dtype object as its name)."""
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def snapshot() -> dict:
    """The snapshot of every model type attnid reads, from the installed transformers."""
    import inspect

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import transformers
        from transformers import CONFIG_MAPPING
        from transformers.configuration_utils import ALLOWED_ATTN_LAYER_TYPES, PreTrainedConfig

    logging.getLogger("transformers").setLevel(logging.ERROR)
    from attnid.configs import CONFIG_TYPES, TEXT_MODELS

    types = sorted({TEXT_MODELS[t][0] if t in TEXT_MODELS else t for t in CONFIG_TYPES} | {"gemma3_text"})
    out: dict = {"transformers": transformers.__version__, "layer_types": list(ALLOWED_ATTN_LAYER_TYPES), "types": {}}
    for model_type in types:
        cls = CONFIG_MAPPING[model_type]
        fields = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = None
            fields[f.name] = {"default": jsonable(default), "kinds": kinds(f.type)}
        default_instance = cls().to_dict()
        default_instance.pop("transformers_version", None)
        theta = cls.default_theta
        own = cls.validate_architecture is not PreTrainedConfig.validate_architecture
        check = own and "self.hidden_size % self.num_attention_heads" in inspect.getsource(cls.validate_architecture)
        out["types"][model_type] = {
            "class": cls.__name__,
            "fields": fields,
            "attribute_map": dict(getattr(cls, "attribute_map", {})),
            "default_theta": jsonable(theta),
            "default_rope_type": cls.default_rope_type,
            "defaults": jsonable(default_instance),
            "heads_divide_width": check,  # its validate_architecture: hidden_size a multiple of the heads
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the file differs from the installed transformers")
    a = ap.parse_args(argv)
    text = json.dumps(snapshot(), indent=1, sort_keys=True) + "\n"
    if a.check:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT.relative_to(ROOT)}: {'up to date' if same else 'differs from the installed transformers'}")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)} ({len(text):,} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
