"""Per-layer transcoders in circuit-tracer's layout, out and back in.

A folder holds ``config.yaml`` and one ``layer_{i}.safetensors`` per layer with::

    W_enc [d_transcoder, d_model]    W_dec [d_transcoder, d_model]    b_enc [d_transcoder]    b_dec [d_model]
    activation_function.threshold [d_transcoder]   (JumpReLU)
    k  (a 0-d integer tensor, TopK)                 W_skip [d_model, d_model]  (a skip transcoder: x W_skip^T)

``config.yaml`` (written as JSON, which YAML reads) names ``model_kind: transcoder_set``, ``feature_input_hook``
and ``feature_output_hook`` (relative to a block: ``ln2.hook_normalized``, ``hook_mlp_out``), ``activation``
(``relu``, ``jumprelu`` or ``topk``), ``k``, ``scan``, and the layer files in order (``transcoders``). Without a
config, circuit-tracer's defaults hold: ``hook_resid_mid`` in, ``hook_mlp_out`` out, JumpReLU where a file has
thresholds and ReLU otherwise.

``save_circuit_tracer(saes, folder)`` writes one SAE per layer (``transcoder``, ``skip_transcoder``,
``jumprelu_transcoder``, ``jumprelu_skip_transcoder``, or a ``topk`` SAE with ``hook_name_out``);
``load_circuit_tracer(folder)`` reads such a folder as SAEs in SAELens' format. Both are exact: every tensor
round-trips bit for bit. Two activations differ in a corner, as the formats do: circuit-tracer's JumpReLU
is ``pre * (pre > threshold)`` and SAELens' ``relu(pre) * (pre > threshold)`` (the same for thresholds >= 0),
and circuit-tracer's TopK keeps the ``k`` largest pre-activations even when negative, where SAELens' applies
a ReLU to them (the same wherever the ``k``-th largest is >= 0). Loading refuses negative thresholds, where
the two would differ.
"""

import json
import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from interp_transformer.sae import SAE

from .folder_files import inside_folder, read_tensors
from .transcoders import block_hook, relative_hook_name

LAYER_FILE = re.compile(r"^layer_(\d+)\.safetensors$")
ACTIVATION_OF = {
    "transcoder": "relu",
    "skip_transcoder": "relu",
    "jumprelu_transcoder": "jumprelu",
    "jumprelu_skip_transcoder": "jumprelu",
    "topk": "topk",
}


def save_circuit_tracer(model, saes, folder: str | Path, *, scan: str | None = None) -> Path:
    """Write one transcoder ``SAE`` per layer of ``model`` (in layer order) in circuit-tracer's layout (module
    docstring); the hooks are written relative to their block, as the model's blocks name them."""
    saes = list(saes)
    if not saes:
        raise ValueError("no transcoders to save: give one SAE per layer")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hooks, activations, ks = set(), set(), set()
    for layer, sae in enumerate(saes):
        if not isinstance(sae, SAE):
            raise TypeError(f"transcoder {layer} must be an SAE, got {type(sae).__name__}")
        architecture = sae.cfg.architecture
        if architecture not in ACTIVATION_OF or sae.hook_name_out is None:
            raise ValueError(
                f"transcoder {layer}: circuit-tracer's layout holds transcoders ({sorted(ACTIVATION_OF)} with "
                f"hook_name_out), got architecture {architecture!r} with hook_name_out {sae.hook_name_out!r}"
            )
        reads = relative_hook_name(model, layer, sae.hook_name, f"transcoder {layer}'s hook_name")
        hooks.add((reads, relative_hook_name(model, layer, sae.hook_name_out, f"transcoder {layer}'s hook_name_out")))
        activations.add(ACTIVATION_OF[architecture])
        ks.add(sae.cfg.k if architecture == "topk" else None)
        tensors = {
            "W_enc": sae.W_enc.detach().T.contiguous(),
            "W_dec": sae.W_dec.detach().contiguous(),
            "b_enc": sae.b_enc.detach().contiguous(),
            "b_dec": sae.b_dec.detach().contiguous(),
        }
        if architecture.startswith("jumprelu"):
            tensors["activation_function.threshold"] = sae.threshold.detach().contiguous()
        if architecture == "topk":
            tensors["k"] = torch.tensor(sae.cfg.k)
        if "skip" in architecture:
            tensors["W_skip"] = sae.W_skip.detach().contiguous()
        save_file(tensors, str(folder / f"layer_{layer}.safetensors"))
    if len(hooks) != 1 or len(activations) != 1 or len(ks) != 1:
        raise ValueError(
            "circuit-tracer's config holds one input hook, output hook, activation and k for every layer; got "
            f"hooks {sorted(hooks)}, activations {sorted(activations)}, k {sorted(ks, key=str)}"
        )
    (reads, writes), activation, k = hooks.pop(), activations.pop(), ks.pop()
    config = {
        "model_kind": "transcoder_set",
        "scan": scan,
        "feature_input_hook": reads,
        "feature_output_hook": writes,
        "activation": activation,
        "transcoders": [f"layer_{layer}.safetensors" for layer in range(len(saes))],
    }
    if k is not None:
        config["k"] = k
    (folder / "config.yaml").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def _read_config(folder: Path) -> dict:
    """``config.yaml`` as a mapping, read with ``yaml.safe_load``: plain YAML only, so a Python tag
    (``!!python/object/apply``) is refused, never run. A YAML error is a ``ValueError`` naming the file and the
    line; a field of the wrong type a ``TypeError``/``ValueError`` naming the file and the field."""
    path = folder / "config.yaml"
    if not path.is_file():
        return {}
    import yaml

    try:
        config = yaml.safe_load(inside_folder(folder, "config.yaml", str(folder)).read_text()) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ValueError(
            f"{path}{where}: {problem}; config.yaml is read as plain YAML (no Python objects or custom tags)"
        ) from error
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a mapping, got {type(config).__name__}")
    for key in ("feature_input_hook", "feature_output_hook", "activation"):
        if config.get(key) is not None and not isinstance(config[key], str):
            raise TypeError(f"{path}: {key} must be a str, got {type(config[key]).__name__} {config[key]!r}")
    k = config.get("k")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"{path}: k must be an int >= 1, got {type(k).__name__} {k!r}")
    files = config.get("transcoders")
    if files is not None:
        bad = next((name for name in files if not isinstance(name, str)), None) if isinstance(files, list) else files
        if not isinstance(files, list) or bad is not None:
            raise TypeError(
                f"{path}: transcoders must be a list of file names in {folder}, one per layer, got "
                f"{type(bad).__name__} {bad!r}"
            )
    return config


def load_circuit_tracer(model, folder: str | Path, *, dtype: torch.dtype | None = None) -> list[SAE]:
    """The per-layer transcoders of a folder in circuit-tracer's layout, as SAEs reading and writing ``model``'s hook
    points (module docstring)."""
    folder = Path(folder)
    config = _read_config(folder)
    files = config.get("transcoders") or sorted(
        (p.name for p in folder.glob("layer_*.safetensors") if LAYER_FILE.match(p.name)),
        key=lambda n: int(LAYER_FILE.match(n).group(1)),
    )
    if not files:
        raise FileNotFoundError(f"{folder} holds no layer_{{i}}.safetensors (circuit-tracer's per-layer layout)")
    if len(files) != model.cfg.n_layers:
        raise ValueError(f"{folder} holds {len(files)} layer files; the model has n_layers={model.cfg.n_layers}")
    reads = config.get("feature_input_hook", "hook_resid_mid")
    writes = config.get("feature_output_hook", "hook_mlp_out")
    named_by = [
        f"{folder / 'config.yaml'}'s transcoders[{layer}]" if "transcoders" in config else str(folder)
        for layer in range(len(files))
    ]
    for layer, name in enumerate(files):  # every entry is checked before any file is opened
        inside_folder(folder, name, named_by[layer])
    saes = []
    for layer, name in enumerate(files):
        tensors = read_tensors(folder, name, named_by[layer])
        expected = {"W_enc", "W_dec", "b_enc", "b_dec"}
        optional = {"activation_function.threshold", "k", "W_skip"}
        missing, unexpected = expected - set(tensors), set(tensors) - expected - optional
        if missing or unexpected:
            raise ValueError(f"{folder / name}: missing tensors {sorted(missing)}, unexpected {sorted(unexpected)}")
        activation = config.get("activation") or ("jumprelu" if "activation_function.threshold" in tensors else "relu")
        skip = "W_skip" in tensors
        if activation == "topk":
            k = config.get("k", int(tensors["k"]) if "k" in tensors else None)
            if k is None:
                raise ValueError(f"{folder}: a TopK transcoder set needs k (in config.yaml or each layer file)")
            if skip:
                raise ValueError(f"{folder / name}: a TopK transcoder with W_skip has no SAELens architecture")
            architecture = "topk"
        elif activation in ("relu", "jumprelu"):
            architecture = ("jumprelu_" if activation == "jumprelu" else "") + ("skip_" if skip else "") + "transcoder"
        else:
            raise ValueError(f"{folder}: activation must be relu, jumprelu or topk, got {activation!r}")
        d_sae, d_in = tensors["W_enc"].shape
        state = {
            "W_enc": tensors["W_enc"].T.contiguous(),
            "W_dec": tensors["W_dec"],
            "b_enc": tensors["b_enc"],
            "b_dec": tensors["b_dec"],
        }
        if architecture.startswith("jumprelu"):
            threshold = tensors.get("activation_function.threshold")
            if threshold is None:
                raise ValueError(f"{folder / name}: a JumpReLU transcoder needs activation_function.threshold")
            if bool((threshold < 0).any()):
                raise ValueError(
                    f"{folder / name}: a negative threshold ({float(threshold.min()):.4g}) makes circuit-tracer's "
                    "JumpReLU differ from SAELens'"
                )
            state["threshold"] = threshold
        if skip:
            state["W_skip"] = tensors["W_skip"]
        cfg = {
            "architecture": architecture,
            "d_in": d_in,
            "d_sae": d_sae,
            "d_out": tensors["W_dec"].shape[1],
            "apply_b_dec_to_input": False,
            "dtype": str(tensors["b_enc"].dtype).removeprefix("torch."),
            "metadata": {
                "hook_name": block_hook(model, layer, reads, f"{folder}'s feature_input_hook"),
                "hook_name_out": block_hook(model, layer, writes, f"{folder}'s feature_output_hook"),
            },
        }
        if architecture == "topk":
            cfg["k"] = int(k)
        saes.append(SAE.from_dict(cfg, state, dtype=dtype))
    return saes


__all__ = ["load_circuit_tracer", "save_circuit_tracer"]
