"""The server flags checked against the model layer, once at start-up, before any rank starts.

`ServerArgs.validate()` checks the flags against each other and knows no layer or model; what
only the model layer can tell is checked here, by the entry points (`Engine`, the
`launch_server` CLI) right after it: the attention backend is a registered one (looked up by name:
no backend module is imported until CP asks whether it supports context parallelism), the DSA op
names go with the `dsa` backend, and the pipeline's layer partition fits the checkpoint's layer
count (its config.json / GGUF metadata only). Each refusal is a `ValueError` naming the flag.

`flag_choices()` gives the accepted values of the flags the model layer declares, for argparse.
"""

from __future__ import annotations

from sglang.srt.server_args import ServerArgs


def flag_choices() -> dict[str, list[str]]:
    """Accepted values of the flags whose values the model layer declares (for argparse)."""
    from sglang.srt.layers.attention.registry import attention_backend_choices

    return {"attention_backend": list(attention_backend_choices())}


def check_server_args_against_model(server_args: ServerArgs) -> None:
    """Every start-up check of the flags that needs the model layer or the checkpoint (ValueError)."""
    from sglang.srt.layers.quantization.config import check_quantization_flag

    _check_attention_backend(server_args)
    _check_nsa_backends(server_args)
    check_quantization_flag(server_args.quantization)
    config = _read_model_config(server_args)
    if config is not None:
        _check_quantization(server_args, config)
        if server_args.tp_size > 1:
            _check_attention_heads(server_args, config)
        if server_args.pp_size > 1:
            _check_pipeline_partition(server_args, config)
    if server_args.cp_size > 1:
        _check_context_parallel_backend(server_args)
    if (
        server_args.disaggregation_mode != "null"
        and server_args.disaggregation_transfer_backend == "mooncake"
    ):
        from sglang.srt.disaggregation.mooncake.data_plane import load_transfer_engine

        load_transfer_engine()  # PD is optional in an install: refuse now, naming the fix (RuntimeError)


def _read_model_config(server_args: ServerArgs) -> dict | None:
    """The checkpoint's HF config dict, read once for the checks below (config.json, or the GGUF
    metadata, parsed once per process); None when unreadable: the model loader names the problem."""
    from sglang.srt.model_loader.model_files import load_hf_config_dict

    try:
        return load_hf_config_dict(server_args.model_path, server_args.load_format)
    except ValueError:
        return None


def _text_config(config: dict, key: str) -> dict:
    """A multimodal config's `text_config` when `key` is not at the top level."""
    return config.get("text_config", config) if key not in config else config


def _check_attention_backend(server_args: ServerArgs) -> None:
    """A known backend name (checked by name: no backend module is imported)."""
    if server_args.attention_backend is None:
        return
    from sglang.srt.layers.attention.registry import attention_backend_choices

    choices = attention_backend_choices()
    if server_args.attention_backend not in choices:
        raise ValueError(
            f"--attention-backend must be one of {choices}, got {server_args.attention_backend!r}"
        )


def _check_nsa_backends(server_args: ServerArgs) -> None:
    """--nsa-prefill-backend / --nsa-decode-backend: known names, and only with the dsa backend."""
    from sglang.srt.layers.attention.dsa.backend_names import DSA_ATTENTION_BACKENDS, resolve_nsa_backend

    for name in ("nsa_prefill_backend", "nsa_decode_backend"):
        value = getattr(server_args, name)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        try:
            resolve_nsa_backend(value)
        except ValueError as e:
            raise ValueError(f"{flag}: {e}") from None
        if server_args.attention_backend not in DSA_ATTENTION_BACKENDS:
            raise ValueError(
                f"{flag} applies to --attention-backend dsa (alias nsa), "
                f"got --attention-backend {server_args.resolved_attention_backend}"
            )


def _check_context_parallel_backend(server_args: ServerArgs) -> None:
    """--cp-size > 1 needs a backend that supports context parallelism (imports that backend)."""
    from sglang.srt.layers.attention.registry import get_attention_backend_class

    backend = server_args.resolved_attention_backend
    if not get_attention_backend_class(backend).supports_context_parallel:
        raise ValueError(
            f"--cp-size > 1 needs an --attention-backend that supports context parallelism, got {backend!r}"
        )


def _check_pipeline_partition(server_args: ServerArgs, config: dict) -> None:
    """The layer partition against the model's layer count (cheap: the config only)."""
    from sglang.srt.models.utils import pp_partition

    config = _text_config(config, "num_hidden_layers")
    if "num_hidden_layers" in config:
        pp_partition(int(config["num_hidden_layers"]), server_args.pp_size)


def _check_attention_heads(server_args: ServerArgs, config: dict) -> None:
    """The attention heads split evenly over the attention-TP ranks (`tp / (dp · cp)`): the query
    heads divide by it, and the KV heads divide by it or it by them (then each KV head is replicated).
    Checked from the config before any rank starts, instead of by every rank building its layers."""
    from sglang.srt.distributed.parallel_layout import ParallelLayout

    config = _text_config(config, "num_attention_heads")
    heads = config.get("num_attention_heads")
    if not isinstance(heads, int):
        return
    attn_tp = ParallelLayout.from_server_args(server_args).attn_tp
    where = f"the attention tp size ({attn_tp} = --tp-size / (dp attention size x --cp-size))"
    if heads % attn_tp:
        raise ValueError(f"--tp-size: the model's {heads} attention heads must be divisible by {where}")
    kv_heads = config.get("num_key_value_heads", heads)
    if "kv_lora_rank" in config or not isinstance(kv_heads, int):
        return  # MLA: one latent KV shared by all heads
    if kv_heads >= attn_tp and kv_heads % attn_tp:
        raise ValueError(f"--tp-size: the model's {kv_heads} KV heads must be divisible by {where}")
    if kv_heads < attn_tp and attn_tp % kv_heads:
        raise ValueError(f"--tp-size: {where} must be a multiple of the model's {kv_heads} KV heads")


def _check_quantization(server_args: ServerArgs, config: dict) -> None:
    """The checkpoint's quantization_config (config.json only) against --quantization: an
    unsupported method, or a flag that does not match the checkpoint's format."""
    from sglang.srt.layers.quantization.config import quant_spec_from_config
    from sglang.srt.model_loader.model_files import is_dummy_model

    if is_dummy_model(server_args.model_path, server_args.load_format):
        return
    quant_spec_from_config(config, server_args.quantization)
