"""Write ``src/attnid/library_configs.json``: what attnid needs of ``transformers``' config classes, as data, so that
reading a ``config.json`` (:mod:`attnid.library_configs`) needs neither transformers nor torch. For each model type
attnid reads: the class's name, each declared field's default and the JSON kinds its annotation accepts, its
``attribute_map``, its default RoPE base, whether it requires the heads to divide the width, the layer types the
library allows, the fields its code reads (its modeling module, its config class and the shared modules it calls,
:data:`SHARED_MODULES`), and the ``to_dict()`` of its default instance (the values the family's
audits were verified at). Run it when the supported transformers version changes; ``tests/test_library_configs.py``
checks that the file equals what the installed transformers gives.

    .venv/bin/python tools/snapshot_library_configs.py            # rewrite the file
    .venv/bin/python tools/snapshot_library_configs.py --check    # exit 1 if it differs
"""

from __future__ import annotations

import argparse
import ast
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


# the library's modules beside a family's own that read its config: the base model class, the layers' base, the
# rotary initialisers, the attention masks (the attention kernels read no config field)
SHARED_MODULES = ("modeling_utils", "modeling_layers", "modeling_rope_utils", "masking_utils")


def _names_config(node) -> bool:
    """Whether an expression is a config object by its name (``config``, ``self.config``, ``text_config``)."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "config" in name.lower()


def code_reads(source: str, config_module: bool = False) -> set[str]:
    """The config fields a module's source reads: ``config.X`` (on any object named like a config), ``getattr`` and
    ``hasattr`` of a config with a literal name, ``config.get("X")``; in a config class's own module also
    ``self.X`` and the ``kwargs`` it takes by name."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _names_config(node.value):
            out.add(node.attr)
        elif isinstance(node, ast.Attribute) and config_module and isinstance(node.value, ast.Name):
            if node.value.id == "self":
                out.add(node.attr)
        elif isinstance(node, ast.Call) and node.args:
            f, args = node.func, node.args
            literal = [a.value for a in args[1:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if isinstance(f, ast.Name) and f.id in ("getattr", "hasattr") and literal and _names_config(args[0]):
                out.add(literal[0])
            first = args[0].value if isinstance(args[0], ast.Constant) and isinstance(args[0].value, str) else None
            own_kwargs = config_module and isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "kwargs"
            taken = isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault")
            if first and taken and (_names_config(f.value) or own_kwargs):
                out.add(first)
    return out


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
    from attnid.config_multimodal import TEXT_MODELS
    from attnid.configs import CONFIG_TYPES

    types = sorted({TEXT_MODELS[t][0] if t in TEXT_MODELS else t for t in CONFIG_TYPES} | {"gemma3_text"})
    lib = Path(transformers.__file__).parent
    shared = set().union(*(code_reads((lib / f"{m}.py").read_text()) for m in SHARED_MODULES))
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
            # every field its modeling module, its config class and the shared modules read
            "code_reads": sorted(shared | _family_reads(lib, cls)),
        }
    return out


def _family_reads(lib: Path, cls) -> set[str]:
    """The fields a family's own modules read: its modeling module and its config class's module, and the modeling
    module of the causal LM the library builds for it where another family's code builds it (InternLM3: Llama's)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    folder = lib / "models" / cls.__module__.split(".")[-2]
    folders = {folder}
    lm = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(cls.model_type)
    if isinstance(lm, str) and hasattr(transformers, lm):
        folders.add(lib / "models" / getattr(transformers, lm).__module__.split(".")[-2])
    out = set()
    for f in sorted(f for d in folders for f in d.glob("modeling_*.py")):
        out |= code_reads(f.read_text())
    for f in sorted(folder.glob("configuration_*.py")):
        out |= code_reads(f.read_text(), config_module=True)
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
